package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// UsersConfig configures the users scenario: a many-users simulation in
// the manner of Amoc. Zero fields take their defaults.
type UsersConfig struct {
	// Users is the number of simulated users, each on its own
	// connection. Default: 100; at most 10000.
	Users int
	// Ramp is how many users connect per second. Default: 50.
	Ramp float64
	// RequestRate is each user's requests per second to the handlers.
	// Default: 1; negative for none.
	RequestRate float64
	// PublishRate is each user's messages per second, each to another
	// connected user. Default: 1; negative for none.
	PublishRate float64
	// Threshold is the latency p99 over which the server is said to have
	// fallen behind. Default: 100ms.
	Threshold time.Duration
	// RequestTimeout bounds each request; one that times out counts as
	// an error. Default: 5s.
	RequestTimeout time.Duration
	// RoomSize, if not 0, makes it a chat: users are in rooms of about
	// this many users, and each message goes to a room the sender is in
	// (every user of the room, the sender too, receives it) instead of
	// to another user.
	RoomSize int
	// RoomsPerUser is the most rooms a user is in, with RoomSize: each
	// is in 1 to RoomsPerUser rooms, picked at random. Default: 3.
	RoomsPerUser int
	// WS, on a Courier target, connects each user over WebSocket
	// (ws://, the HTTP listener's /ws) instead of the target's own
	// protocol; an embedded node then listens on loopback for it.
	WS bool
	// WSURL is the WebSocket endpoint with WS. Default: the embedded
	// node's, or ws://<the target's host>:7480/ws.
	WSURL string
}

func (u UsersConfig) withDefaults() UsersConfig {
	if u.Users == 0 {
		u.Users = 100
	}
	if u.Ramp == 0 {
		u.Ramp = 50
	}
	if u.RequestRate == 0 {
		u.RequestRate = 1
	}
	if u.PublishRate == 0 {
		u.PublishRate = 1
	}
	if u.Threshold == 0 {
		u.Threshold = 100 * time.Millisecond
	}
	if u.RequestTimeout == 0 {
		u.RequestTimeout = 5 * time.Second
	}
	if u.RoomSize > 0 && u.RoomsPerUser == 0 {
		u.RoomsPerUser = 3
	}
	return u
}

func (u UsersConfig) validate() error {
	switch {
	case u.Users < 0 || u.Users > maxConns:
		return fmt.Errorf("bench: users must be between 1 and %d, got %d", maxConns, u.Users)
	case u.Ramp < 0:
		return fmt.Errorf("bench: ramp must be positive, got %g", u.Ramp)
	case u.Threshold < 0 || u.RequestTimeout < 0:
		return fmt.Errorf("bench: threshold and request timeout must be positive")
	case u.RoomSize < 0 || u.RoomsPerUser < 0 || u.RoomsPerUser > 100:
		return fmt.Errorf("bench: room size must be positive, and rooms per user between 1 and 100")
	case u.WSURL != "" && !u.WS:
		return fmt.Errorf("bench: a WebSocket URL without WS")
	}
	return nil
}

// UsersResult is what the users scenario measured.
type UsersResult struct {
	Report
	Users       int     `json:"users"`
	Ramp        float64 `json:"ramp_per_s"`
	RequestRate float64 `json:"request_rate_per_user"`
	PublishRate float64 `json:"publish_rate_per_user"`
	// RoomSize, RoomsPerUser and Rooms (how many there were) describe a
	// chat run; RoomSize is 0 for messages from user to user.
	RoomSize     int     `json:"room_size,omitempty"`
	RoomsPerUser int     `json:"rooms_per_user,omitempty"`
	Rooms        int     `json:"rooms,omitempty"`
	WS           bool    `json:"websocket,omitempty"`
	Workers      int     `json:"workers"`
	Duration     float64 `json:"duration_s"`
	ThresholdMs  float64 `json:"threshold_ms"`
	// Connected is the number of users that connected; ConnectErrors of
	// those that could not.
	Connected      int64   `json:"connected"`
	ConnectErrors  int64   `json:"connect_errors"`
	ConnectLatency Latency `json:"connect_latency_us"`
	// Requests answered, and those that failed or timed out.
	Requests       int64   `json:"requests"`
	RequestErrors  int64   `json:"request_errors"`
	RequestLatency Latency `json:"request_latency_us"`
	// Published messages, Delivered to their users, Lost (deliveries
	// expected but not made by the end, after a second's wait: one per
	// message to a user; in a chat, one per user of the room subscribed
	// when the message was sent).
	Published       int64   `json:"published"`
	PublishErrors   int64   `json:"publish_errors"`
	Delivered       int64   `json:"delivered"`
	Lost            int64   `json:"lost"`
	DeliveryLatency Latency `json:"delivery_latency_us"`
	// FellBehind, if set, is the first interval in which the server fell
	// behind.
	FellBehind *Behind `json:"fell_behind,omitempty"`
}

// Behind says when and why the server fell behind the offered load.
type Behind struct {
	T      float64 `json:"t_s"`
	Users  int64   `json:"users"`
	Reason string  `json:"reason"`
}

// usersRun is the state the users' goroutines share.
type usersRun struct {
	cfg   *Config
	ud    userDriver
	epoch time.Time
	end   time.Time
	ping  []byte

	ready                             []atomic.Bool  // by user: connected and subscribed
	rooms                             [][]int        // by user, with RoomSize: its rooms
	members                           []atomic.Int64 // by room: users connected and subscribed
	expected                          atomic.Int64   // deliveries the publishes so far should make
	connected, connectErrs            atomic.Int64
	requests, requestErrs             atomic.Int64
	published, publishErrs, delivered atomic.Int64
	reqLat, delLat, connLat           *recorder
	errMu                             sync.Mutex // guards firstErrs
	firstErrs                         []string
}

// RunUsers runs the users scenario: cfg.Users.Users simulated users
// connect at cfg.Users.Ramp per second, each on its own connection; each
// attaches to a request-response exchange served by cfg.Workers
// handlers and subscribes to its own key of a pub-sub exchange, then
// until cfg.Duration is over sends requests and publishes messages to
// other connected users at its rates, idle in between. Every interval it
// samples connected users, rates and latencies, and it reports the first
// interval in which the server fell behind: a latency p99 over the
// threshold, an achieved rate under 80% of the offered one, or errors.
func RunUsers(ctx context.Context, cfg Config) (*UsersResult, error) {
	cfg = cfg.withDefaults("users")
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	u := cfg.Users
	if cfg.Duration == 0 {
		cfg.Duration = time.Duration(float64(u.Users)/u.Ramp*float64(time.Second)) + 10*time.Second
	}
	res := &UsersResult{
		Report: newReport("users", &cfg), Users: u.Users, Ramp: u.Ramp,
		RequestRate: max(u.RequestRate, 0), PublishRate: max(u.PublishRate, 0), Workers: cfg.Workers,
		RoomSize: u.RoomSize, RoomsPerUser: u.RoomsPerUser, WS: u.WS,
		Duration: cfg.Duration.Seconds(), ThresholdMs: float64(u.Threshold) / 1e6,
	}
	err := runUsers(ctx, &cfg, res)
	if err != nil {
		res.Error = err.Error()
	}
	return res, err
}

func runUsers(ctx context.Context, cfg *Config, res *UsersResult) error {
	d, closeDriver, err := openDriver(ctx, cfg, &res.Report)
	if err != nil {
		return err
	}
	defer closeDriver()
	ud, ok := d.(userDriver)
	if !ok {
		return fmt.Errorf("%w: users on %s", ErrNoMapping, cfg.Target)
	}
	if err := d.serve(ctx, cfg.Workers, body("pong", cfg.Size)); err != nil {
		return err
	}
	u := cfg.Users
	st := &usersRun{
		cfg: cfg, ud: ud, epoch: time.Now(), ping: body("ping", cfg.Size),
		ready:  make([]atomic.Bool, u.Users),
		reqLat: newRecorder(maxShards), delLat: newRecorder(maxShards), connLat: newRecorder(maxShards),
	}
	if u.RoomSize > 0 {
		st.rooms, res.Rooms = assignRooms(u.Users, u.RoomSize, u.RoomsPerUser, rand.New(rand.NewPCG(1, 2)))
		st.members = make([]atomic.Int64, res.Rooms)
	}
	meter := newCPUMeter(cfg)
	perUser := max(u.RequestRate, 0) + max(u.PublishRate, 0)
	pr := probe{
		sent: st.requests.Load, published: st.published.Load, received: st.delivered.Load,
		users: st.connected.Load, lat: st.reqLat, del: st.delLat,
		errors:  func() int64 { return st.requestErrs.Load() + st.publishErrs.Load() + st.connectErrs.Load() },
		offered: func() float64 { return float64(st.connected.Load()) * perUser },
	}
	smp := startSampler(pr, meter, cfg.Interval)
	defer func() {
		res.RequestLatency, res.DeliveryLatency = smp.latency()
		res.FellBehind = fellBehind(res.Samples, u.Threshold)
	}()
	defer res.finish(smp, meter)
	start := time.Now()
	st.end = start.Add(cfg.Duration)
	runCtx, cancel := context.WithDeadline(ctx, st.end)
	defer cancel()

	// Ramp up: user i starts at i/Ramp seconds.
	stop := progress(cfg, "Users", st.connected.Load, int64(u.Users))
	var wg sync.WaitGroup
	ramp := newPacer(u.Ramp, 0)
	smp.setStage("ramp")
	for i := range u.Users {
		if _, ok := ramp.wait(runCtx); !ok {
			break
		}
		wg.Go(func() { st.user(runCtx, ctx, i) })
	}
	smp.setStage("steady")
	wg.Wait()
	stop()
	cancel()

	// Deliveries still on their way (all those expected: in a chat,
	// more than the messages) get a second to arrive.
	smp.setStage("drain")
	awaitDeliveries(ctx, st.delivered.Load, st.expected.Load(), start, time.Second)
	res.Connected = st.connected.Load()
	res.ConnectErrors = st.connectErrs.Load()
	lat := newHist()
	st.connLat.takeInto(lat)
	res.ConnectLatency = latencyOf(lat)
	res.Requests, res.RequestErrors = st.requests.Load(), st.requestErrs.Load()
	res.Published, res.PublishErrors = st.published.Load(), st.publishErrs.Load()
	res.Delivered = st.delivered.Load()
	res.Lost = max(st.expected.Load()-res.Delivered, 0)
	st.errMu.Lock()
	res.Notes = append(res.Notes, st.firstErrs...)
	st.errMu.Unlock()
	return ctx.Err()
}

// fail keeps the first few errors for the report's notes.
func (st *usersRun) fail(what string, err error) {
	st.errMu.Lock()
	if len(st.firstErrs) < 5 {
		st.firstErrs = append(st.firstErrs, what+": "+err.Error())
	}
	st.errMu.Unlock()
}

// user runs user i's script: connect, attach and subscribe, then
// request and publish at its rates until the end, idle in between.
// runCtx ends at the end of the run and stops the script; ctx, the whole
// scenario's, bounds the requests and publishes, so that those in flight
// at the end finish rather than fail.
func (st *usersRun) user(runCtx, ctx context.Context, i int) {
	u := st.cfg.Users
	t0 := time.Now()
	conn, err := st.ud.user(runCtx, i, st.keys(i), func(b []byte) {
		if len(b) >= 8 {
			st.delLat.record(i, time.Since(st.epoch)-time.Duration(binary.BigEndian.Uint64(b)))
		}
		st.delivered.Add(1)
	})
	if err != nil {
		if runCtx.Err() == nil {
			st.connectErrs.Add(1)
			st.fail(fmt.Sprintf("user %d: connect", i), err)
		}
		return
	}
	st.connLat.record(i, time.Since(t0))
	st.ready[i].Store(true)
	st.connected.Add(1)
	if st.rooms != nil {
		for _, r := range st.rooms[i] {
			st.members[r].Add(1)
		}
	}

	// Each user's schedules start at a random phase, so that users do
	// not act in step.
	reqs, pubs := newPacer(u.RequestRate, rand.Float64()), newPacer(u.PublishRate, rand.Float64())
	for runCtx.Err() == nil {
		isReq := u.RequestRate > 0 && (u.PublishRate <= 0 || !pubs.next().Before(reqs.next()))
		p := pubs
		if isReq {
			p = reqs
		} else if u.PublishRate <= 0 {
			sleepCtx(runCtx, time.Until(st.end)) // idle to the end
			return
		}
		if p.next().After(st.end) {
			return
		}
		due, ok := p.wait(runCtx)
		if !ok {
			return
		}
		if isReq {
			st.request(ctx, conn, i, due)
		} else {
			st.publish(ctx, conn, i, due)
		}
	}
}

func (st *usersRun) request(ctx context.Context, conn userConn, i int, due time.Time) {
	rctx, cancel := context.WithTimeout(ctx, st.cfg.Users.RequestTimeout)
	err := conn.request(rctx, st.ping)
	cancel()
	switch {
	case err == nil:
		st.reqLat.record(i, time.Since(due))
		st.requests.Add(1)
	case ctx.Err() == nil:
		st.requestErrs.Add(1)
		st.fail(fmt.Sprintf("user %d: request", i), err)
	}
}

// keys are the routing keys user i subscribes to: its rooms', or its
// own.
func (st *usersRun) keys(i int) []string {
	if st.rooms == nil {
		return []string{userKey(i)}
	}
	keys := make([]string, len(st.rooms[i]))
	for j, r := range st.rooms[i] {
		keys[j] = roomKey(r)
	}
	return keys
}

// roomKey is the routing key (or subject) of room r's messages.
func roomKey(r int) string { return "room." + strconv.Itoa(r) }

// assignRooms puts each of users in 1 to perUser rooms, picked at random
// among enough rooms for an average of size users each; it returns the
// rooms of each user and how many rooms there are.
func assignRooms(users, size, perUser int, rnd *rand.Rand) ([][]int, int) {
	counts := make([]int, users)
	total := 0
	for i := range counts {
		counts[i] = 1 + rnd.IntN(perUser)
		total += counts[i]
	}
	n := max((total+size-1)/size, 1)
	rooms := make([][]int, users)
	for i, c := range counts {
		c = min(c, n)
		rooms[i] = rnd.Perm(n)[:c]
	}
	return rooms, n
}

// publish sends a message stamped with when it was due: to a random
// connected user (itself if it picked one not yet there), or in a chat
// to one of the sender's rooms, whose every subscribed user receives it.
func (st *usersRun) publish(ctx context.Context, conn userConn, i int, due time.Time) {
	key, want := "", int64(1)
	if st.rooms != nil {
		r := st.rooms[i][rand.IntN(len(st.rooms[i]))]
		key, want = roomKey(r), st.members[r].Load()
	} else {
		to := rand.IntN(len(st.ready))
		if !st.ready[to].Load() {
			to = i
		}
		key = userKey(to)
	}
	b := make([]byte, max(st.cfg.Size, 8))
	copy(b[8:], "message")
	binary.BigEndian.PutUint64(b, uint64(due.Sub(st.epoch)))
	switch err := conn.publish(ctx, key, b); {
	case err == nil:
		st.published.Add(1)
		st.expected.Add(want)
	case ctx.Err() == nil:
		st.publishErrs.Add(1)
		st.fail(fmt.Sprintf("user %d: publish", i), err)
	}
}

// fellBehind returns the first sample, after the first, in which a
// latency p99 exceeded the threshold, the achieved rate was under 80%
// of the offered one (at 10/s or more), or something failed.
func fellBehind(samples []Sample, threshold time.Duration) *Behind {
	limit := float64(threshold) / 1e3 // us
	for i, s := range samples {
		var why string
		achieved := s.Sent + s.Published
		switch {
		case s.Errors > 0:
			why = fmt.Sprintf("%d errors", s.Errors)
		case s.Latency.P99 > limit:
			why = fmt.Sprintf("request p99 %.1f ms over the %s threshold", s.Latency.P99/1e3, threshold)
		case s.Delivery.P99 > limit:
			why = fmt.Sprintf("delivery p99 %.1f ms over the %s threshold", s.Delivery.P99/1e3, threshold)
		case i > 0 && s.Offered >= 10 && achieved < 0.8*s.Offered:
			why = fmt.Sprintf("achieved %.0f requests and publishes/s of %.0f offered", achieved, s.Offered)
		default:
			continue
		}
		return &Behind{T: s.T, Users: s.Users, Reason: why}
	}
	return nil
}

// WriteText prints the result: one line per interval, then the totals
// and where the server fell behind.
func (res *UsersResult) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Users: %s, %d users ramped at %g/s, each %g requests/s and %g messages/s of %d bytes, %d handler(s), %gs\n",
		res.Target, res.Users, res.Ramp, res.RequestRate, res.PublishRate, res.Size, res.Workers, res.Duration)
	if res.RoomSize > 0 {
		fmt.Fprintf(&b, "Chat: %d rooms of about %d users, each user in 1 to %d; a message goes to one of its sender's rooms\n",
			res.Rooms, res.RoomSize, res.RoomsPerUser)
	}
	if res.WS {
		b.WriteString("Each user over WebSocket\n")
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "t s\tusers\toffered/s\treq/s\treq p50 ms\treq p99 ms\tpub/s\tdeliv/s\tdeliv p99 ms\terrors\tserver cores\tserver RSS MB\t\n")
	for _, s := range res.Samples {
		cores := "?"
		if s.ServerCPU >= 0 {
			cores = fmt.Sprintf("%.2f", s.ServerCPU)
		}
		fmt.Fprintf(tw, "%.1f\t%d\t%.0f\t%.0f\t%.2f\t%.2f\t%.0f\t%.0f\t%.2f\t%d\t%s\t%.0f\t\n", s.T, s.Users, s.Offered,
			s.Sent, s.Latency.P50/1e3, s.Latency.P99/1e3, s.Published, s.Received, s.Delivery.P99/1e3, s.Errors, cores, float64(s.ServerRSS)/1e6)
	}
	tw.Flush()
	fmt.Fprintf(&b, "Connected %d of %d users, %d failed; connect p50 %.1f ms, p99 %.1f ms\n",
		res.Connected, res.Users, res.ConnectErrors, res.ConnectLatency.P50/1e3, res.ConnectLatency.P99/1e3)
	fmt.Fprintf(&b, "Requests %d answered, %d failed\n", res.Requests, res.RequestErrors)
	if res.RequestLatency.Count > 0 {
		b.WriteString(latencyLine("Request", res.RequestLatency, "requests") + "\n")
	}
	fmt.Fprintf(&b, "Messages %d published (%d failed), %d delivered, %d lost\n", res.Published, res.PublishErrors, res.Delivered, res.Lost)
	if res.DeliveryLatency.Count > 0 {
		b.WriteString(latencyLine("Delivery", res.DeliveryLatency, "deliveries") + "\n")
	}
	if f := res.FellBehind; f != nil {
		fmt.Fprintf(&b, "Fell behind at %.0f s with %d users: %s\n", f.T, f.Users, f.Reason)
	} else if res.Error == "" {
		fmt.Fprintf(&b, "Kept up: %d users, every interval's p99 under %gms and the offered rate met\n", res.Connected, res.ThresholdMs)
	}
	res.footer(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints the result as one JSON object.
func (res *UsersResult) WriteJSON(w io.Writer) error { return writeJSON(w, res) }

// Metrics returns the users connected, the request and delivery
// latencies, and the server's CPU per request or message and memory.
func (res *UsersResult) Metrics() []Metric {
	m := []Metric{{Name: "users connected", Value: float64(res.Connected), Unit: "users"}}
	if res.FellBehind != nil {
		m = append(m, Metric{Name: "users when it fell behind", Value: float64(res.FellBehind.Users), Unit: "users"})
	}
	m = append(m, latencyMetrics("request latency", res.RequestLatency)...)
	m = append(m, latencyMetrics("delivery latency", res.DeliveryLatency)...)
	// At a few requests per user per second the server's CPU goes mostly
	// to keeping connections, so it is given in cores, not per request.
	return append(m, res.usageMetrics(0, "")...)
}

// Timeline returns the run's samples.
func (res *UsersResult) Timeline() Timeline {
	title := fmt.Sprintf("users: %s, %d users", res.Target, res.Users)
	if res.RoomSize > 0 {
		title += fmt.Sprintf(" in rooms of %d", res.RoomSize)
	}
	if res.WS {
		title += ", over WebSocket"
	}
	return Timeline{Title: title, Samples: res.Samples}
}
