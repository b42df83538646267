//go:build linux

package clustertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
)

// EnvFailoverKills runs [TestFailoverTimings] with that many kills.
const EnvFailoverKills = "COURIER_FAILOVER_KILLS"

// TestFailoverTimings measures, over COURIER_FAILOVER_KILLS kills -9 of
// a node of a 3-node cluster (proxy mode: clients that reconnect dial on
// their own, from the test's network), with COURIER_CHAOS_SEED choosing
// the victims among the nodes that qualify:
//
//   - leader: the time from the kill of the node of a leader exchange's
//     leader until every member on the two other nodes has a leader
//     event naming a member of a surviving node under a larger token,
//     reported apart for kills that also took the exchange's home (a
//     third of them: the new home comes with the lease's expiry);
//   - requests: with a round-robin handler on every node (each reply
//     after 100 ms) and a requester on a surviving node (4 in flight, 5 s
//     deadlines), the time until the last request that failed had
//     failed, and, for the requests pending on the killed node's
//     handler, the time they took to fail and how;
//   - client: a client with every node's URL, connected to the victim,
//     with a handler attached: the time until its ConnReconnected (its
//     exchange declared again, which asks the metadata group, and its
//     handler attached again on another node), reported apart for kills
//     that took the metadata leader.
//
// The victim is the node of the current leader; it is restarted after
// each kill and the next kill waits for the cluster to be whole.
func TestFailoverTimings(t *testing.T) {
	kills, _ := strconv.Atoi(os.Getenv(EnvFailoverKills))
	if kills <= 0 {
		t.Skip("set " + EnvFailoverKills + " to the number of kills")
	}
	needCluster(t)
	seed := uint64(1)
	if s := os.Getenv(envSeed); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	rng := rand.New(rand.NewPCG(seed, 14))
	c := New(t, Options{Nodes: 3, Mode: ModeProxy, Cluster: true, Seed: seed})
	all := func(v []NodeView) bool { return len(v) == 3 && alive(v) == 3 }
	var leaderT, leaderHomeT, reqT, pendT, clientT, clientMetaT []time.Duration
	pendHow := map[string]int{}
	checked, late := 0, 0
	for k := 0; k < kills; k++ {
		waitWhole(t, c, all, fmt.Sprintf("before kill %d", k))
		r := runFailover(t, c, rng, k)
		if r.err != nil {
			t.Logf("kill %d: %v (not counted)", k, r.err)
			continue
		}
		t.Logf("kill %d of %s (home %s, metadata leader %s, reaped after %v): leader %v, requests %v (pending on it: %v %v), client %v",
			k, r.victim, r.home, r.meta, r.reaped.Round(time.Millisecond), r.leader.Round(time.Millisecond), r.requests.Round(time.Millisecond), r.pending, r.pendingHow,
			r.client.Round(time.Millisecond))
		checked++
		if !r.checked.OK() {
			late++
			t.Errorf("kill %d: %s: %d violations: %s", k, r.checked.Checked, r.checked.Count, strings.Join(r.checked.Violations, "; "))
		}
		if r.home == r.victim {
			leaderHomeT = append(leaderHomeT, r.leader)
		} else {
			leaderT = append(leaderT, r.leader)
		}
		reqT = append(reqT, r.requests)
		if r.meta == r.victim {
			clientMetaT = append(clientMetaT, r.client)
		} else {
			clientT = append(clientT, r.client)
		}
		pendT = append(pendT, r.pending...)
		for _, h := range r.pendingHow {
			pendHow[h]++
		}
	}
	t.Logf("seed %d, %d kills counted of %d", seed, len(reqT), kills)
	t.Logf("requests checked (one outcome by deadline + %v) in %d kills: violations in %d", DefaultMargin, checked, late)
	t.Logf("new leader announced on the survivors, home survived: %s", percentiles(leaderT))
	t.Logf("new leader announced on the survivors, home killed:   %s", percentiles(leaderHomeT))
	t.Logf("requests all succeed again:           %s", percentiles(reqT))
	t.Logf("pending on the killed handler failed: %s; outcomes %v", percentiles(pendT), pendHow)
	t.Logf("client reconnected and re-attached, metadata leader survived: %s", percentiles(clientT))
	t.Logf("client reconnected and re-attached, metadata leader killed:   %s", percentiles(clientMetaT))
}

// failoverRun is what one kill measured.
type failoverRun struct {
	victim, home, meta       string
	leader, requests, client time.Duration
	pending                  []time.Duration
	pendingHow               []string
	err                      error
	// reaped is how long the kill took: from the signal until the
	// process was reaped.
	reaped time.Duration
	// checked is CheckRequests on this kill's requests.
	checked Result
}

// failoverDeadline is the deadline of the failover test's requests.
const failoverDeadline = 5 * time.Second

// reqSeq numbers the failover test's requests.
var reqSeq atomic.Int64

// outcomeOf is the history's record of a request's end at t with err.
func outcomeOf(t int64, err error) RequestOutcome {
	switch {
	case err == nil:
		return RequestOutcome{Kind: "response", Time: t}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, courier.ErrTimeout):
		return RequestOutcome{Kind: "deadline", Detail: err.Error(), Time: t}
	default:
		return RequestOutcome{Kind: "error", Detail: err.Error(), Time: t}
	}
}

// member is a leader-exchange member on one node, recording its events.
type member struct {
	node  int
	conn  *courier.Conn
	mu    sync.Mutex
	id    string // its member id
	lead  string // the leader its last event named
	tok   Token
	at    time.Time
	nodes map[string]string // member id → node, from the last event
}

func (m *member) state() (lead string, tok Token, at time.Time, node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lead, m.tok, m.at, m.nodes[m.lead]
}

// runFailover sets up the clients, kills the leader's node, measures, and
// restarts it.
func runFailover(t *testing.T, c *Cluster, rng *rand.Rand, k int) (r failoverRun) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dial := func(i int, name string) (*courier.Conn, error) {
		return client.Dial(ctx, c.Node(i).ClientURL(), client.Options{Name: name, NoReconnect: true, Log: discardLog})
	}
	var conns []*courier.Conn
	defer func() {
		for _, x := range conns {
			x.Close()
		}
	}()
	// Members, one per node, in a random order so that the oldest (the
	// leader) is on a random node; the exchange is declared first on a
	// random node, its home (docs/cluster.md "Home node and views"):
	// the leader's own node a third of the time.
	order := rng.Perm(3)
	lead := fmt.Sprintf("fo-lead-%d", k)
	home := rng.IntN(3)
	r.home = c.Node(home).Name
	hc, err := dial(home, fmt.Sprintf("fo-declarer-%d", k))
	if err != nil {
		return failoverRun{err: err}
	}
	conns = append(conns, hc)
	if _, err := hc.ReqResp(ctx, lead, courier.Leader); err != nil {
		return failoverRun{err: err}
	}
	members := make([]*member, 3)
	for _, i := range order {
		conn, err := dial(i, fmt.Sprintf("fo-member-%d-%d", k, i))
		if err != nil {
			return failoverRun{err: err}
		}
		conns = append(conns, conn)
		m := &member{node: i, conn: conn}
		members[i] = m
		ex, err := conn.ReqResp(ctx, lead, courier.Leader)
		if err != nil {
			return failoverRun{err: err}
		}
		a, err := ex.Handle(ctx, func(q *courier.Request) { q.Reply(nil) }, courier.OnEvent(func(e courier.Event) {
			if e.Kind != courier.EventLeader && e.Kind != courier.EventMemberUp && e.Kind != courier.EventMemberDown {
				return
			}
			m.mu.Lock()
			defer m.mu.Unlock()
			m.lead, m.tok, m.at = e.Leader, Token{e.Epoch, e.Term}, time.Now()
			m.nodes = map[string]string{}
			for _, x := range e.Members {
				m.nodes[x.ID] = x.Node
			}
		}))
		if err != nil {
			return failoverRun{err: err}
		}
		m.mu.Lock()
		m.id = a.ID()
		m.mu.Unlock()
	}
	// Every member agrees on a leader.
	var victim int
	var oldTok Token
	if err := poll(30*time.Second, func() bool {
		lead, tok, _, node := members[0].state()
		if lead == "" || node == "" {
			return false
		}
		for _, m := range members[1:] {
			if l, tk, _, _ := m.state(); l != lead || tk != tok {
				return false
			}
		}
		victim = slices.IndexFunc(c.Nodes(), func(n *Node) bool { return n.Name == node })
		oldTok = tok
		return victim >= 0
	}); err != nil {
		return failoverRun{err: fmt.Errorf("members do not agree on a leader: %w", err)}
	}
	r.victim = c.Node(victim).Name
	if i, err := c.MetaLeader(); err == nil {
		r.meta = c.Node(i).Name
	}
	entry := (victim + 1 + rng.IntN(2)) % 3
	// Handlers on every node, round-robin, each reply after 100 ms.
	for i := range 3 {
		conn, err := dial(i, fmt.Sprintf("fo-handler-%d-%d", k, i))
		if err != nil {
			return failoverRun{err: err}
		}
		conns = append(conns, conn)
		ex, err := conn.ReqResp(ctx, fmt.Sprintf("fo-rr-%d", k), courier.RoundRobin)
		if err == nil {
			_, err = ex.Handle(ctx, func(q *courier.Request) {
				time.Sleep(100 * time.Millisecond)
				q.Reply([]byte(c.Node(i).Name))
			})
		}
		if err != nil {
			return failoverRun{err: err}
		}
	}
	// The client that fails over: every node's URL, the victim's first.
	urls := []string{c.Node(victim).ClientAddr}
	for i := range 3 {
		if i != victim {
			urls = append(urls, c.Node(i).ClientAddr)
		}
	}
	reconnected := make(chan time.Time, 1)
	fc, err := client.Dial(ctx, "courier://"+strings.Join(urls, ","), client.Options{Name: fmt.Sprintf("fo-client-%d", k), Log: discardLog,
		OnConnEvent: func(e courier.ConnEvent) {
			if e.Kind == courier.ConnReconnected {
				select {
				case reconnected <- time.Now():
				default:
				}
			}
		}})
	if err != nil {
		return failoverRun{err: err}
	}
	conns = append(conns, fc)
	fex, err := fc.ReqResp(ctx, fmt.Sprintf("fo-client-%d", k), courier.RoundRobin)
	if err == nil {
		_, err = fex.Handle(ctx, func(q *courier.Request) { q.Reply(nil) })
	}
	if err != nil {
		return failoverRun{err: err}
	}
	// The requester, on a surviving node: every handler answers first.
	rc, err := dial(entry, fmt.Sprintf("fo-requester-%d", k))
	if err != nil {
		return failoverRun{err: err}
	}
	conns = append(conns, rc)
	rex, err := rc.ReqResp(ctx, fmt.Sprintf("fo-rr-%d", k), courier.RoundRobin)
	if err != nil {
		return failoverRun{err: err}
	}
	seen := map[string]bool{}
	if err := poll(30*time.Second, func() bool {
		resp, err := rex.Request(ctx, courier.Message{})
		if err == nil {
			seen[string(resp.Body)] = true
		}
		return len(seen) == 3
	}); err != nil {
		return failoverRun{err: fmt.Errorf("the requester does not reach every handler: %v", seen)}
	}
	type outcome struct {
		start, end time.Time
		from       string
		err        error
	}
	// Every request goes into a history of its own, with the stalls of
	// the test process, for CheckRequests: one outcome each, by its
	// deadline plus DefaultMargin.
	hist := NewHistory()
	stopStalls := make(chan struct{})
	go hist.WatchStalls(50*time.Millisecond, stopStalls)
	defer close(stopStalls)
	var omu sync.Mutex
	var outs []outcome
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				o := outcome{start: time.Now()}
				q := Request{ID: fmt.Sprintf("fo-%d-%d", k, reqSeq.Add(1)), Start: hist.Now()}
				q.Deadline = q.Start + int64(failoverDeadline)
				rctx, cancel := context.WithTimeout(ctx, failoverDeadline)
				resp, err := rex.Request(rctx, courier.Message{})
				cancel()
				o.end, o.err = time.Now(), err
				q.Outcomes = []RequestOutcome{outcomeOf(hist.Now(), err)}
				hist.AddRequest(q)
				if err == nil {
					o.from = string(resp.Body)
				}
				omu.Lock()
				outs = append(outs, o)
				omu.Unlock()
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // requests in flight on every handler
	killed := time.Now()
	if err := c.Node(victim).Kill(); err != nil {
		close(stop)
		wg.Wait()
		return failoverRun{err: err}
	}
	r.reaped = time.Since(killed)
	defer c.Node(victim).Start()
	// (a) every surviving member has a leader on a surviving node under
	// a larger token.
	var leaderAt time.Time
	if err := poll(30*time.Second, func() bool {
		last := time.Time{}
		for i, m := range members {
			if i == victim {
				continue
			}
			_, tok, at, node := m.state()
			if node == "" || node == r.victim || tok.Compare(oldTok) <= 0 {
				return false
			}
			if at.After(last) {
				last = at
			}
		}
		leaderAt = last
		return true
	}); err != nil {
		r.err = fmt.Errorf("no new leader on the survivors within 30 s")
	}
	r.leader = leaderAt.Sub(killed)
	// (c) the client reconnected.
	select {
	case at := <-reconnected:
		r.client = at.Sub(killed)
	case <-time.After(30 * time.Second):
		r.err = errors.Join(r.err, fmt.Errorf("the client did not reconnect within 30 s"))
	}
	// (b) requests: 2 s more of them, then stop.
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	var lastFail time.Time
	failed := map[string]int{}
	for _, o := range outs {
		if o.err != nil && o.end.After(killed) {
			failed[fmt.Sprintf("%v after %v", o.err, o.end.Sub(o.start).Round(100*time.Millisecond))]++
			if o.end.After(lastFail) {
				lastFail = o.end
			}
		}
		if o.err != nil && o.start.Before(killed) && o.end.After(killed) {
			r.pending = append(r.pending, o.end.Sub(killed).Round(time.Millisecond))
			how := "other: " + o.err.Error()
			switch {
			case errors.Is(o.err, courier.ErrHandlerGone):
				how = "handler gone"
			case errors.Is(o.err, context.DeadlineExceeded), errors.Is(o.err, courier.ErrTimeout):
				how = "deadline"
			}
			r.pendingHow = append(r.pendingHow, how)
		}
	}
	if !lastFail.IsZero() {
		r.requests = lastFail.Sub(killed)
	}
	r.checked = CheckRequests(hist.Snapshot(), 0)
	if r.leader > 2*time.Second || r.home != r.victim && r.leader > time.Second || r.requests > 2*time.Second || !r.checked.OK() {
		// Above the 2 s aim, or slow where the home survived: the
		// survivors' logs show where the time went (the expiry, the
		// re-homing, the new home's view).
		t.Logf("kill %d: requests failed after it: %v; notes: %v", k, failed, r.checked.Notes)
		for i := range 3 {
			if i != victim {
				t.Logf("kill %d at %s: new leader after %v, requests failing for %v; log of %s:\n%s", k, killed.Format("15:04:05.000"),
					r.leader.Round(time.Millisecond), r.requests.Round(time.Millisecond), c.Node(i).Name, timeline(c.Node(i).LogTail(256<<10), killed))
			}
		}
	}
	return r
}

// timeline keeps the lines of a node's log from 1 s before the kill on,
// without the ones repeated per exchange or per Raft retry.
func timeline(log string, killed time.Time) string {
	var out []string
	from := killed.Add(-time.Second).UTC().Format("2006-01-02T15:04:05.000")
	for _, l := range strings.Split(log, "\n") {
		at, ok := strings.CutPrefix(l, "time=")
		if !ok || len(at) < len(from) || at[:len(from)] < from {
			continue
		}
		if strings.Contains(l, `msg="exchange re-homed"`) || strings.Contains(l, "failed to heartbeat to") || strings.Contains(l, "failed to appendEntries") {
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// poll calls cond every 5 ms until it holds or timeout passes.
func poll(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// percentiles formats p50, p99 and max of ds.
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return fmt.Sprintf("n=%d p50 %v p99 %v max %v", len(s), at(0.5).Round(time.Millisecond), at(0.99).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}
