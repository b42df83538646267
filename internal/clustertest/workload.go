//go:build linux

package clustertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/wire"
)

// The workload: clients that run against one node until their context
// ends, reconnect after their node dies, and record every operation in
// the cluster's history for the checkers. Each client's connection is
// dialed from the network of the node it is placed at (its "home"), so
// a partition cuts clients as it cuts nodes.

// discardLog silences the workload's connections: their errors are
// outcomes in the history.
var discardLog = slog.New(slog.DiscardHandler)

// session is a client connection to a node that is dialed again when
// it ends.
type session struct {
	c        *Cluster
	from, to int
	name     string

	mu   sync.Mutex // guards conn
	conn *courier.Conn
}

// get returns the live connection, dialing a new one if the last ended.
func (s *session) get(ctx context.Context) (*courier.Conn, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		select {
		case <-s.conn.Done():
			s.conn = nil
		default:
			return s.conn, false, nil
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var conn *courier.Conn
	opts := client.Options{Name: s.name, Heartbeat: 500 * time.Millisecond, Log: discardLog}
	setField(&opts, "NoReconnect", true)
	err := s.c.InNode(s.from, func() error {
		var err error
		conn, err = client.Dial(dctx, s.c.nodes[s.to].ClientURL(), opts)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	s.conn = conn
	return conn, true, nil
}

// setField sets the bool field name of the struct ptr points to, if it
// has one. The workload's sessions dial again themselves, from the
// node's namespace; a client that reconnects on its own would dial from
// a thread outside it, and in netns mode never reach the node. The
// client's Options.NoReconnect comes with client failover (issue 14,
// built in parallel): this sets it where it exists, without making the
// harness wait for it to compile.
func setField(ptr any, name string, v bool) bool {
	f := reflect.ValueOf(ptr).Elem().FieldByName(name)
	if !f.IsValid() || f.Kind() != reflect.Bool || !f.CanSet() {
		return false
	}
	f.SetBool(v)
	return true
}

// close closes the connection.
func (s *session) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close()
	}
}

// backoff waits a little before a client tries again; false if ctx ended.
func backoff(ctx context.Context) bool { return sleepCtx(ctx, 100*time.Millisecond) }

// Workload says which clients to run, per node.
type Workload struct {
	// Registry runs a client per node declaring, deleting and reading
	// exchanges (names from RegistryNames).
	Registry bool
	// RegistryNames returns the exchange names the registry client of
	// node n uses now; default: 3 names shared by every node. For
	// single-node servers, whose registries are separate, scope the
	// names by node and incarnation ([Node.Incarnation]).
	RegistryNames func(n *Node) []string
	// NoReads leaves gets out of the registry clients, for a broker
	// whose reads are not linearizable.
	NoReads bool
	// Requests runs a handler and a requester per node.
	Requests bool
	// PubSub runs a publisher and a subscriber per node.
	PubSub bool
	// Leaders runs two members of a leader exchange per node.
	Leaders bool
	// Tasks runs a producer with confirms and a worker per node.
	Tasks bool
	// TaskKeys is the number of keys (shared by every producer) that
	// every other task carries; 0: unkeyed tasks only. At most 64.
	TaskKeys int
	// TaskRate bounds each task producer's submits per second.
	// Default: Rate.
	TaskRate int
	// Replicas declares the task exchange with courier.Replicas(n);
	// 0 declares it without the option (the cluster's default).
	Replicas int
	// Exchange returns the exchange name node n's request, pub-sub,
	// leader and task clients use (one per kind: the name gets a
	// suffix); default: one name per kind for the whole cluster, as a
	// cluster shares exchanges.
	Exchange func(n *Node) string
	// Separate says the nodes are separate brokers: a subscriber
	// expects only the publications of its own node.
	Separate bool
	// Rate bounds each client's operations per second. Default: 50.
	Rate int
}

// pubsubDrain is how long subscribers stay after the publishers stop.
const pubsubDrain = 3 * time.Second

// Start starts the workload's clients against every node; they run until
// ctx ends. The returned function waits for them to stop; subscribers
// stay 3 s more, and task workers until every confirmed task was
// delivered or drain has passed, so that the checkers judge drained
// streams and queues.
func (w Workload) Start(ctx context.Context, c *Cluster, seed uint64, drain time.Duration) (wait func()) {
	if w.Rate <= 0 {
		w.Rate = 50
	}
	if w.Exchange == nil {
		w.Exchange = func(*Node) string { return "chaos" }
	}
	if w.RegistryNames == nil {
		w.RegistryNames = func(*Node) []string { return []string{"reg-a", "reg-b", "reg-c"} }
	}
	var wg, workers sync.WaitGroup
	start := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	workCtx, stopWork := context.WithCancel(context.Background())
	for i := range c.nodes {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		if w.Registry {
			start(func() { w.registry(ctx, c, i, rng) })
		}
		if w.Requests {
			start(func() { w.requests(ctx, c, i) })
		}
		if w.PubSub {
			workers.Add(1)
			go func() { defer workers.Done(); w.pubsub(ctx, workCtx, c, i) }()
		}
		if w.Leaders {
			for m := range 2 {
				start(func() { w.leader(ctx, c, i, m) })
			}
		}
		if w.Tasks {
			start(func() { w.tasks(ctx, c, i, rand.New(rand.NewPCG(seed, uint64(100+i)))) })
			workers.Add(1)
			go func() { defer workers.Done(); w.taskWorker(workCtx, c, i) }()
		}
	}
	return func() {
		wg.Wait()
		// Subscribers and workers stay a while after the producers
		// stopped, so that what was published last can arrive; a
		// loaded machine delays deliveries by seconds at times.
		sleepCtx(context.Background(), pubsubDrain)
		deadline := time.Now().Add(drain)
		for time.Now().Before(deadline) && CheckTasks(c.hist.Snapshot()).Count > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		stopWork()
		workers.Wait()
	}
}

// tick paces a client at w.Rate operations a second.
func (w Workload) tick() *time.Ticker { return time.NewTicker(time.Second / time.Duration(w.Rate)) }

// registry declares, deletes and reads exchanges on node i.
func (w Workload) registry(ctx context.Context, c *Cluster, i int, rng *rand.Rand) {
	h := c.hist
	s := &session{c: c, from: i, to: i, name: fmt.Sprintf("registry-%d", i)}
	defer s.close()
	t := w.tick()
	defer t.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		conn, _, err := s.get(ctx)
		if err != nil {
			backoff(ctx)
			continue
		}
		names := w.RegistryNames(c.nodes[i])
		op := RegistryOp{Client: i, Node: c.nodes[i].Name, Name: names[rng.IntN(len(names))]}
		kinds := []RegistryKind{Declare, Delete, Get}
		if w.NoReads {
			kinds = kinds[:2]
		}
		op.Kind = kinds[rng.IntN(len(kinds))]
		octx, cancel := context.WithTimeout(ctx, 2*time.Second)
		op.Call = h.Now()
		switch op.Kind {
		case Declare:
			_, err = conn.PubSub(octx, op.Name)
			op.Outcome = outcome(err, OutcomeOK)
			if op.Outcome == OutcomeNotFound {
				// Declared, then deleted by another client before
				// the declaring node could look (docs/cluster.md): the
				// declare took effect.
				op.Outcome = OutcomeOK
			}
		case Delete:
			err = conn.DeleteExchange(octx, op.Name)
			op.Outcome = outcome(err, OutcomeDeleted)
		case Get:
			_, err = conn.Declare(octx, op.Name, courier.ExchangeSpec{Passive: true})
			op.Outcome = outcome(err, OutcomeExists)
		}
		op.Return = h.Now()
		cancel()
		h.AddRegistry(op)
	}
}

// outcome maps a registry call's error to its outcome: refusals had no
// effect; a timeout or a lost connection leaves it unknown.
func outcome(err error, ok Outcome) Outcome {
	switch {
	case err == nil:
		return ok
	case errors.Is(err, courier.ErrNotFound):
		return OutcomeNotFound
	case errors.Is(err, courier.ErrClash), errors.Is(err, courier.ErrBadOptions):
		return OutcomeFailed
	}
	return OutcomeUnknown
}

// requests runs a handler and a requester on node i.
func (w Workload) requests(ctx context.Context, c *Cluster, i int) {
	h := c.hist
	name := w.Exchange(c.nodes[i]) + "-rr"
	hs := &session{c: c, from: i, to: i, name: fmt.Sprintf("handler-%d", i)}
	rs := &session{c: c, from: i, to: i, name: fmt.Sprintf("requester-%d", i)}
	defer hs.close()
	defer rs.close()
	var ex *courier.ReqResp
	t := w.tick()
	defer t.Stop()
	for k := 0; ctx.Err() == nil; {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if hc, fresh, err := hs.get(ctx); err != nil {
			backoff(ctx)
			continue
		} else if fresh {
			hx, err := hc.ReqResp(ctx, name, courier.RoundRobin)
			if err == nil {
				_, err = hx.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) })
			}
			if err != nil {
				hc.Close()
				continue
			}
		}
		rc, fresh, err := rs.get(ctx)
		if err != nil {
			backoff(ctx)
			continue
		}
		if fresh || ex == nil {
			if ex, err = rc.ReqResp(ctx, name, courier.RoundRobin); err != nil {
				rc.Close()
				continue
			}
		}
		k++
		id := fmt.Sprintf("%s/%d", c.nodes[i].Name, k)
		const deadline = time.Second
		rctx, cancel := context.WithTimeout(ctx, deadline)
		q := Request{ID: id, Client: rs.name, Node: c.nodes[i].Name, Start: h.Now()}
		q.Deadline = q.Start + int64(deadline)
		resp, err := ex.Request(rctx, courier.Message{Body: []byte(id)})
		o := RequestOutcome{Kind: "response", Time: h.Now()}
		switch {
		case err == nil && string(resp.Body) != id:
			o.Kind, o.Detail = "error", fmt.Sprintf("wrong response %q", resp.Body)
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, courier.ErrTimeout):
			o.Kind, o.Detail = "deadline", err.Error()
		case err != nil:
			o.Kind, o.Detail = "error", err.Error()
		}
		cancel()
		if ctx.Err() != nil && o.Kind != "response" {
			return // the run ended under the request: not its outcome
		}
		q.Outcomes = []RequestOutcome{o}
		h.AddRequest(q)
	}
}

// pubsub runs a publisher on node i until ctx ends and a subscriber
// there until drained ends.
func (w Workload) pubsub(ctx, drained context.Context, c *Cluster, i int) {
	h := c.hist
	name := w.Exchange(c.nodes[i]) + "-ps"
	pub := c.nodes[i].Name + "-pub"
	sub := c.nodes[i].Name + "-sub"
	ss := &session{c: c, from: i, to: i, name: sub}
	ps := &session{c: c, from: i, to: i, name: pub}
	defer ss.close()
	defer ps.close()
	var ex *courier.PubSub
	var subConn *courier.Conn
	subFrom := int64(-1)
	// The subscription ends when its connection does, which the loop
	// below may notice only after a publish returns.
	subEnded := new(atomic.Int64) // the current subscription's end, 0 while it lasts
	endSub := func() {
		if subFrom >= 0 {
			to := h.Now()
			if e := subEnded.Load(); e > 0 {
				to = min(to, e)
			}
			s := Subscription{Subscriber: sub, From: subFrom, To: to}
			if w.Separate {
				s.Publishers = []string{pub}
			}
			h.AddSubscription(s)
			subFrom = -1
		}
	}
	defer endSub()
	t := w.tick()
	defer t.Stop()
	var seq uint64
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sc, fresh, err := ss.get(ctx)
		if err != nil {
			endSub()
			backoff(ctx)
			continue
		}
		if fresh || sc != subConn {
			endSub()
			sx, err := sc.PubSub(ctx, name)
			if err == nil {
				_, err = sx.Subscribe(ctx, "#", func(d *courier.Delivery) {
					p, n, ok := strings.Cut(string(d.Body), "#")
					q, perr := strconv.ParseUint(n, 10, 64)
					if ok && perr == nil {
						h.AddDelivery(Delivery{Subscriber: sub, Publisher: p, Seq: q, Time: h.Now()})
					}
				})
			}
			if err != nil {
				sc.Close()
				continue
			}
			subConn, subFrom = sc, h.Now()
			ended := new(atomic.Int64) // this subscription's own: an old one's end cannot cut it
			subEnded = ended
			go func() {
				<-sc.Done()
				ended.Store(h.Now())
			}()
		}
		select {
		case <-subConn.Done():
			endSub()
			continue
		default:
		}
		pc, fresh, err := ps.get(ctx)
		if err != nil {
			backoff(ctx)
			continue
		}
		if fresh || ex == nil {
			if ex, err = pc.PubSub(ctx, name); err != nil {
				pc.Close()
				continue
			}
		}
		seq++
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		start := h.Now()
		err = ex.PublishSync(pctx, courier.Message{Key: "k", Body: fmt.Appendf(nil, "%s#%d", pub, seq)})
		cancel()
		h.AddPublish(Publish{Publisher: pub, Seq: seq, Topic: "k", Start: start, Time: h.Now(), Failed: err != nil})
	}
	if subConn != nil {
		select {
		case <-drained.Done():
		case <-subConn.Done():
		}
	}
}

// leader runs member m of node i's leader exchange and records when it
// leads.
func (w Workload) leader(ctx context.Context, c *Cluster, i, m int) {
	h := c.hist
	name := w.Exchange(c.nodes[i]) + "-lead"
	// Leaders of separate brokers' exchanges are of different
	// exchanges; member ids are unique per broker only.
	exchange, prefix := name, ""
	if w.Separate {
		exchange, prefix = c.nodes[i].Name+"/"+name, c.nodes[i].Name+"/"
	}
	s := &session{c: c, from: i, to: i, name: fmt.Sprintf("member-%d-%d", i, m)}
	defer s.close()
	var mu sync.Mutex // guards cur
	var cur *LeaderInterval
	end := func() {
		mu.Lock()
		defer mu.Unlock()
		if cur != nil {
			cur.End = h.Now()
			h.AddLeader(*cur)
			cur = nil
		}
	}
	defer end()
	for ctx.Err() == nil {
		conn, _, err := s.get(ctx)
		if err != nil {
			backoff(ctx)
			continue
		}
		ex, err := conn.ReqResp(ctx, name, courier.Leader)
		if err == nil {
			_, err = ex.Handle(ctx, func(r *courier.Request) { r.Reply(nil) }, courier.OnEvent(func(e courier.Event) {
				mu.Lock()
				defer mu.Unlock()
				// Leader events in a cluster carry the fencing token
				// (docs/cluster.md "Leaders across nodes"); a new
				// token for the same member is a new leadership.
				tok := Token{Epoch: e.Epoch, Term: e.Term}
				fenced := tok != Token{}
				now := h.Now()
				if cur != nil && (!e.IsLeader || fenced && tok != cur.Token) {
					cur.End = now
					h.AddLeader(*cur)
					cur = nil
				}
				if e.IsLeader && cur == nil {
					// The member is named by its client too: ids the
					// broker gives may repeat across nodes.
					cur = &LeaderInterval{Exchange: exchange, Member: fmt.Sprintf("%s%s (%s)", prefix, e.Leader, s.name), Node: c.nodes[i].Name,
						Token: tok, Fenced: fenced, Start: now}
				}
			}))
		}
		if err != nil {
			conn.Close()
			backoff(ctx)
			continue
		}
		select {
		case <-ctx.Done():
		case <-conn.Done():
		}
		end()
	}
}

// taskName is the task exchange of node i.
func (w Workload) taskName(c *Cluster, i int) string { return w.Exchange(c.nodes[i]) + "-tasks" }

// taskOptions are the options the task clients declare their exchange
// with: Replicas(w.Replicas) when set.
func (w Workload) taskOptions() []courier.ExchangeOption {
	if w.Replicas > 0 {
		return []courier.ExchangeOption{courier.Replicas(w.Replicas)}
	}
	return nil
}

// taskKey scopes a task's key by broker where brokers are separate, so
// that the checkers compare a key's tasks within one queue.
func (w Workload) taskKey(c *Cluster, i int, key string) string {
	if key == "" || !w.Separate {
		return key
	}
	return c.nodes[i].Name + "/" + key
}

// workerPrefetch is what each worker may hold unsettled.
const workerPrefetch = 8

// Workers hold most tasks for up to maxHold, then ack them; one in
// longHoldOdds for between longHold and twice as long, so that more is
// in flight when a fault comes.
const (
	maxHold      = 30 * time.Millisecond
	longHold     = 150 * time.Millisecond
	longHoldOdds = 20
)

// hold returns how long a worker holds a task.
func hold() time.Duration {
	if rand.IntN(longHoldOdds) == 0 {
		return longHold + rand.N(longHold)
	}
	return rand.N(maxHold)
}

// deliveries numbers deliveries across workers, for [TaskRecord.Delivery].
var deliveries atomic.Int64

// taskWorker runs a worker on node i until ctx ends, attaching again
// after its attachment ends (its connection lost, or detached by the
// broker). Each attachment is a worker of its own in the history
// (worker-I#N); it records every delivery with its key and attempts,
// holds the task for a short random time ([hold]) and acks it,
// recording the ack just before it is sent, and records its own end
// and why.
func (w Workload) taskWorker(ctx context.Context, c *Cluster, i int) {
	h := c.hist
	node := c.nodes[i].Name
	ws := &session{c: c, from: i, to: i, name: fmt.Sprintf("worker-%d", i)}
	defer ws.close()
	for inc := 1; ctx.Err() == nil; {
		wc, _, err := ws.get(ctx)
		if err != nil {
			backoff(ctx)
			continue
		}
		wq, err := wc.Tasks(ctx, w.taskName(c, i), w.taskOptions()...)
		if err != nil {
			wc.Close()
			backoff(ctx)
			continue
		}
		worker := fmt.Sprintf("%s#%d", ws.name, inc)
		inc++
		att, err := wq.Work(ctx, func(j *courier.Job) error {
			d := deliveries.Add(1)
			id := string(j.Body)
			h.AddTask(TaskRecord{ID: id, Event: TaskDelivered, Key: w.taskKey(c, i, j.Key), Node: node, Worker: worker,
				Delivery: d, Attempts: j.Attempts, Time: h.Now()})
			j.Defer()
			time.AfterFunc(hold(), func() {
				at := h.Now()
				if j.Ack() == nil {
					h.AddTask(TaskRecord{ID: id, Event: TaskAcked, Node: node, Worker: worker, Delivery: d, Time: at})
				}
			})
			return nil
		}, courier.Prefetch(workerPrefetch))
		if err != nil {
			wc.Close()
			backoff(ctx)
			continue
		}
		why := WorkerStopped
		select {
		case <-ctx.Done():
		case <-wc.Done():
			why = WorkerLostConnection
		case <-att.Done():
			why = WorkerDetached
			select {
			case <-wc.Done():
				why = WorkerLostConnection // the connection's end detaches too
			default:
			}
		}
		h.AddTask(TaskRecord{Event: TaskWorkerEnded, Node: node, Worker: worker, Time: h.Now(), Detail: why})
	}
}

// maxKeys bounds Workload.TaskKeys.
const maxKeys = 64

// tasks runs a producer with confirms on node i: every other task is
// keyed, with one of w.TaskKeys keys shared by every producer, if any.
// Each submit has a 2 s deadline; its outcome (confirmed, failed or
// unknown) is recorded with its call and return times.
func (w Workload) tasks(ctx context.Context, c *Cluster, i int, rng *rand.Rand) {
	h := c.hist
	node := c.nodes[i].Name
	ps := &session{c: c, from: i, to: i, name: fmt.Sprintf("producer-%d", i)}
	defer ps.close()
	var q *courier.Tasks
	rate := w.TaskRate
	if rate <= 0 {
		rate = w.Rate
	}
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	keys := min(w.TaskKeys, maxKeys)
	for k := 0; ctx.Err() == nil; {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pc, fresh, err := ps.get(ctx)
		if err != nil {
			backoff(ctx)
			continue
		}
		if fresh || q == nil {
			if q, err = pc.Tasks(ctx, w.taskName(c, i), w.taskOptions()...); err != nil {
				pc.Close()
				continue
			}
		}
		k++
		id := fmt.Sprintf("%s-task-%d", node, k)
		task := courier.Task{Body: []byte(id)}
		if keys > 0 && k%2 == 0 {
			task.Key = fmt.Sprintf("k%d", rng.IntN(keys))
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		rec := TaskRecord{ID: id, Key: w.taskKey(c, i, task.Key), Node: node, Call: h.Now()}
		_, err = q.Submit(sctx, task)
		rec.Time = h.Now()
		cancel()
		rec.Event = submitOutcome(err)
		if err != nil {
			rec.Detail = err.Error()
		}
		h.AddTask(rec)
	}
}

// submitOutcome maps a submit's error to its event: refusals for what
// the task is (bad options, access, limits) failed; a timeout, a lost
// connection or "unavailable" (no leader, the leader moved) leave it
// unknown.
func submitOutcome(err error) TaskEvent {
	var we *wire.Error
	switch {
	case err == nil:
		return TaskConfirmed
	case errors.As(err, &we) && we.Code != wire.CodeUnavailable:
		return TaskFailed
	}
	return TaskUnknown
}
