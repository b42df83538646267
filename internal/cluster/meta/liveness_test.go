package meta

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

// TestLivenessNodeGivesUpFirst cuts a node off, a follower then the
// leader: it stops trusting its lease on its own clock before the
// leader of the majority expires it (bumps its epoch), its exchanges
// move to the live nodes, and once healed it renews in the new epoch.
func TestLivenessNodeGivesUpFirst(t *testing.T) {
	for _, victim := range []string{"follower", "leader"} {
		t.Run(victim, func(t *testing.T) { testGivesUpFirst(t, victim == "leader") })
	}
}

func testGivesUpFirst(t *testing.T, leader bool) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 120*time.Second)
	for _, m := range c.running() {
		testutil.WaitForf(t, 15*time.Second, m.LeaseValid, "%s holds a lease", m.NodeID())
	}
	victim := c.follower()
	if leader {
		victim = c.leader()
	}
	for i := range 4 {
		if _, _, err := victim.Declare(ctx, fmt.Sprintf("home.%d", i), reqresp(""), DeclareOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	lead := c.leader()
	if _, _, err := c.follower().Declare(ctx, "home.other", reqresp(""), DeclareOptions{}); err != nil {
		t.Fatal(err)
	}
	epoch, _ := victim.Lease()
	if epoch == 0 || lead.Epoch(victim.NodeID()) != epoch {
		t.Fatalf("victim's epoch %d, the leader has %d", epoch, lead.Epoch(victim.NodeID()))
	}

	// Watch both clocks from the moment of the cut, every millisecond.
	var gaveUp, expired atomic.Int64
	start := time.Now()
	c.tn.cut(victim.NodeID())
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if gaveUp.Load() == 0 && !victim.LeaseValid() {
				gaveUp.Store(int64(time.Since(start)))
			}
			if expired.Load() == 0 {
				if l := c.leader(); l != nil && l != victim && l.State().Nodes[victim.NodeID()].Expired {
					expired.Store(int64(time.Since(start)))
				}
			}
		}
	}()
	testutil.WaitForf(t, 30*time.Second, func() bool { return gaveUp.Load() != 0 && expired.Load() != 0 }, "lease lost and expired")
	g, e := time.Duration(gaveUp.Load()), time.Duration(expired.Load())
	t.Logf("after the cut: the node gave up its lease at %v, the leader expired it at %v", g.Round(time.Millisecond), e.Round(time.Millisecond))
	if g >= e {
		t.Fatalf("the node gave up at %v, not before the leader expired it at %v", g, e)
	}
	// A follower cut off is expired LeaseDuration after the last
	// heartbeat the leader received, which came before the cut; the
	// tolerance covers the leader's tick and a loaded machine.
	if lease := victim.cfg.LeaseDuration; !leader && e > lease+1500*time.Millisecond {
		t.Fatalf("the leader expired the node %v after the cut, more than the lease %v and 1.5 s", e, lease)
	}
	lead = c.waitLeader(10 * time.Second)
	if got := lead.Epoch(victim.NodeID()); got != epoch+1 {
		t.Fatalf("victim's epoch on the leader: %d, want %d", got, epoch+1)
	}
	// Its exchanges are re-homed on the two live nodes, spread by load:
	// none stays on the victim and the loads differ by at most one.
	testutil.WaitForf(t, 15*time.Second, func() bool {
		load := map[string]int{}
		for _, ex := range lead.State().Exchanges {
			load[ex.Home]++
		}
		if load[victim.NodeID()] != 0 || len(load) != 2 {
			return false
		}
		var n []int
		for _, v := range load {
			n = append(n, v)
		}
		return n[0]-n[1] <= 1 && n[1]-n[0] <= 1
	}, "exchanges re-homed off %s: %+v", victim.NodeID(), lead.State().Exchanges)

	c.tn.heal(victim.NodeID())
	testutil.WaitForf(t, 30*time.Second, func() bool {
		e, ok := victim.Lease()
		return ok && e == epoch+1
	}, "the healed node renews in epoch %d", epoch+1)
	// The leader may have changed since, and a follower applies the
	// renewal a moment after the node it renewed: ask whoever leads.
	testutil.WaitForf(t, 10*time.Second, func() bool {
		l := c.leader()
		return l != nil && !l.State().Nodes[victim.NodeID()].Expired
	}, "the renewed node no longer expired on the leader")
}

// TestHeartbeatsWriteNothing: an idle group keeps every lease with
// heartbeats that do not go through the log, so its log does not grow
// (each renewal was a synced write on every node).
func TestHeartbeatsWriteNothing(t *testing.T) {
	c := newCluster(t, 3, nil)
	epochs := map[string]uint64{}
	for _, m := range c.running() {
		testutil.WaitForf(t, 15*time.Second, m.LeaseValid, "%s holds a lease", m.NodeID())
		epochs[m.NodeID()], _ = m.Lease()
	}
	lead := c.leader()
	// The first renewals and the barriers after them settle.
	var last uint64
	testutil.WaitForf(t, 15*time.Second, func() bool {
		i := lead.raft.LastIndex()
		stable := i == last
		last = i
		if !stable {
			time.Sleep(lead.cfg.RenewInterval)
		}
		return stable
	}, "the log settles")
	// Three whole leases: without heartbeats every lease would have
	// expired, and renewals through the log would have written entries.
	window := 3 * lead.cfg.LeaseDuration
	for start := time.Now(); time.Since(start) < window; {
		time.Sleep(lead.cfg.RenewInterval)
	}
	if got := lead.raft.LastIndex(); got != last {
		t.Errorf("the idle log grew from %d to %d in %v", last, got, window)
	}
	for _, m := range c.running() {
		testutil.WaitForf(t, 15*time.Second, m.LeaseValid, "%s holds a lease", m.NodeID())
		if e, _ := m.Lease(); e != epochs[m.NodeID()] {
			t.Errorf("%s: epoch %d, was %d", m.NodeID(), e, epochs[m.NodeID()])
		}
		if lead.State().Nodes[m.NodeID()].Expired {
			t.Errorf("%s expired on the leader", m.NodeID())
		}
	}
}

// TestNewTermWaitsWholeLease: a leader starting a term whose fencing
// round finds no receipt of a node in its configuration (here: receipts
// an hour old, of another configuration) counts that node as seen at
// the term's start, whatever it recorded before, and answers heartbeats
// only once the term is started; a node whose expiry is being decided
// gets no answer.
func TestNewTermWaitsWholeLease(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.leader()
	other := c.follower().NodeID()
	beat := func() error {
		ctx := testutil.Context(t, 10*time.Second)
		_, err := lead.beatLeader(ctx, other, 0)
		return err
	}
	// The node's first renewal (through the log) puts it in the table a
	// new term walks; on a loaded machine it may come after the leader
	// answers its heartbeats.
	testutil.WaitForf(t, 15*time.Second, func() bool {
		_, listed := lead.State().Nodes[other]
		return listed && beat() == nil
	}, "the leader lists the node and answers its heartbeats")
	rec := lead.State().Nodes[other]
	// The node stops: its receipts are the test's alone.
	c.kill(other)
	old := receipt{at: time.Now().Add(-time.Hour), config: 1 << 40}
	for _, m := range c.running() {
		m.rmu.Lock()
		m.receipts[other] = old
		m.rmu.Unlock()
	}

	// The leader's duties wait while the test runs them by hand.
	lead.dmu.Lock()
	defer lead.dmu.Unlock()
	lead.smu.Lock()
	lead.seen[other] = time.Now().Add(-time.Hour)
	lead.readyTerm, lead.startingTerm = 0, 0
	lead.smu.Unlock()
	if err := beat(); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("heartbeat before the term started: %v, want ErrNotLeader", err)
	}
	before := time.Now()
	testutil.WaitForf(t, 15*time.Second, lead.startTerm, "the term starts")
	lead.smu.Lock()
	seen := lead.seen[other]
	lead.smu.Unlock()
	if seen.Before(before) {
		t.Fatalf("a new term counted a node seen %v before it started, from a receipt of another configuration", before.Sub(seen))
	}
	if lead.expire(other, rec.Epoch, rec.Renewed) {
		t.Fatalf("%s expired at the start of a term", other)
	}

	lead.smu.Lock()
	lead.expiring[other] = true
	lead.smu.Unlock()
	if err := beat(); !errors.Is(err, ErrStale) {
		t.Fatalf("heartbeat while expiring: %v, want ErrStale", err)
	}
	lead.smu.Lock()
	delete(lead.expiring, other)
	lead.smu.Unlock()
	if err := beat(); err != nil {
		t.Fatalf("heartbeat after: %v", err)
	}
}

// TestNewTermCountsMajorityReceipt: a leader starting a term counts a
// node as seen at the latest receipt of its heartbeats among the voters
// that answered the fencing round, never earlier (else it could expire
// a node whose lease a majority backed), and expires it a lease after
// that receipt, not a lease after the term's start. The lease is long
// (10 s) so that the test's own steps, on a loaded machine, do not
// reach it.
func TestNewTermCountsMajorityReceipt(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.RenewInterval, cfg.LeaseDuration, cfg.LeaseMargin = 200*time.Millisecond, 10*time.Second, 3*time.Second
	})
	lead := c.waitLeader(30 * time.Second)
	victim := c.follower().NodeID()
	testutil.WaitForf(t, 30*time.Second, func() bool { return lead.Epoch(victim) != 0 }, "%s has a record", victim)
	c.kill(victim)
	var voter *Meta
	for _, m := range c.running() {
		if m != lead {
			voter = m
		}
	}
	f := lead.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		t.Fatal(err)
	}
	_, config := voterSet(f.Configuration())
	lease := lead.cfg.LeaseDuration

	lead.dmu.Lock()
	defer lead.dmu.Unlock()
	restart := func() time.Time {
		t.Helper()
		lead.smu.Lock()
		lead.readyTerm, lead.startingTerm = 0, 0
		lead.smu.Unlock()
		testutil.WaitForf(t, 15*time.Second, lead.startTerm, "the term starts")
		lead.smu.Lock()
		defer lead.smu.Unlock()
		return lead.seen[victim]
	}
	setReceipts := func(onLeader, onVoter time.Time) {
		lead.rmu.Lock()
		lead.receipts[victim] = receipt{at: onLeader, config: config}
		lead.renewedAt[victim], lead.restoredAt = time.Time{}, time.Time{}
		lead.rmu.Unlock()
		voter.rmu.Lock()
		voter.receipts[victim] = receipt{at: onVoter, config: config}
		voter.rmu.Unlock()
	}

	// The latest receipt is the other voter's, half a lease ago: the
	// leader counts from it (from the answer's arrival less the age the
	// voter gave, no earlier than the receipt).
	latest := time.Now().Add(-lease / 2)
	setReceipts(latest.Add(-time.Second), latest)
	before := time.Now()
	seen := restart()
	if seen.Before(latest) {
		t.Fatalf("the new term counts %s seen %v before the latest receipt a voter had", victim, latest.Sub(seen))
	}
	if seen.After(before) {
		t.Fatalf("the new term counts %s seen at its start, not at the receipt %v before", victim, seen.Sub(latest))
	}
	rec := lead.State().Nodes[victim]
	if lead.expire(victim, rec.Epoch, rec.Renewed) {
		t.Fatalf("%s expired %v after the latest receipt, within the lease %v", victim, time.Since(latest), lease)
	}

	// Receipts older than a lease: the node is overdue at once, where
	// counting from the term's start would wait a whole lease more.
	setReceipts(time.Now().Add(-3*lease), time.Now().Add(-lease-time.Second))
	restart()
	rec = lead.State().Nodes[victim]
	if !lead.expire(victim, rec.Epoch, rec.Renewed) {
		t.Fatalf("%s not expired by a new term a lease after its last receipt", victim)
	}
	if got := lead.State().Nodes[victim].Epoch; got != rec.Epoch+1 {
		t.Fatalf("%s's epoch %d after the expiry, want %d", victim, got, rec.Epoch+1)
	}
}

// TestBacked: a heartbeat backs a lease only with marks of a majority of
// the leader's voters, the leader's included, each recorded under a
// fence no later than the leader's term.
func TestBacked(t *testing.T) {
	reply := beatReply{Term: 5, Voters: []string{"a", "b", "c"}, Fence: 5}
	marks := func(fs ...voterFence) (<-chan voterFence, int) {
		ch := make(chan voterFence, len(fs))
		for _, f := range fs {
			ch <- f
		}
		return ch, len(fs)
	}
	ctx := testutil.Context(t, 10*time.Second)
	for _, tc := range []struct {
		name   string
		leader string
		reply  beatReply
		marks  []voterFence
		want   bool
	}{
		{"leader and one voter", "a", reply, []voterFence{{voter: "b", fence: 5}}, true},
		{"a voter fenced by a later term", "a", reply, []voterFence{{voter: "b", fence: 6}, {voter: "c", err: ErrNoQuorum}}, false},
		{"leader fenced by a later term", "a", beatReply{Term: 5, Voters: reply.Voters, Fence: 6}, []voterFence{{voter: "b", fence: 4}}, false},
		{"leader fenced, two voters", "a", beatReply{Term: 5, Voters: reply.Voters, Fence: 6}, []voterFence{{voter: "b", fence: 4}, {voter: "c", fence: 5}}, true},
		{"a non-voter's mark", "a", reply, []voterFence{{voter: "d", fence: 1}}, false},
		{"failed marks", "a", reply, []voterFence{{voter: "b", err: ErrNoQuorum}, {voter: "c", err: ErrNoQuorum}}, false},
		{"five voters need three", "a", beatReply{Term: 5, Voters: []string{"a", "b", "c", "d", "e"}}, []voterFence{{voter: "b"}, {voter: "c", fence: 9}}, false},
		{"a voter of the version before", "a", reply, []voterFence{{voter: "b", err: ErrBadFrame}, {voter: "c", err: ErrNoQuorum}}, false},
		{"five voters, three", "a", beatReply{Term: 5, Voters: []string{"a", "b", "c", "d", "e"}}, []voterFence{{voter: "b"}, {voter: "c", fence: 9}, {voter: "e", fence: 2}}, true},
	} {
		ch, n := marks(tc.marks...)
		if got, _ := backed(ctx, tc.leader, tc.reply, ch, n); got != tc.want {
			t.Errorf("%s: backed %v, want %v", tc.name, got, tc.want)
		}
	}
	ch, n := marks(voterFence{voter: "b", err: ErrBadFrame}, voterFence{voter: "c", err: ErrNoQuorum})
	if ok, old := backed(ctx, "a", reply, ch, n); ok || !old {
		t.Errorf("a mark refused as an unknown frame: backed %v, old %v; want false, true", ok, old)
	}
}

// TestLeaderLossKeepsSurvivors: when the metadata leader is killed, the
// new leader expires it, and only it: the surviving nodes keep marking
// their heartbeats on the voters during the election, so the new
// leader's fencing round counts them as seen then, not at their last
// heartbeat to the old leader (which would expire a survivor whose
// first heartbeat to the new leader came more than a lease after the
// kill). Raft's timeouts are 2 s here, so that every election ends more
// than a lease (1.2 s) after the kill.
func TestLeaderLossKeepsSurvivors(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 2*time.Second, 2*time.Second, time.Second
	})
	for round := range 3 {
		lead := c.waitLeader(30 * time.Second)
		for _, m := range c.running() {
			testutil.WaitForf(t, 30*time.Second, m.LeaseValid, "round %d: %s holds a lease", round, m.NodeID())
		}
		epochs := map[string]uint64{}
		for _, m := range c.running() {
			epochs[m.NodeID()], _ = m.Lease()
		}
		victim := lead.NodeID()
		c.kill(victim)
		var next *Meta
		testutil.WaitForf(t, 30*time.Second, func() bool {
			next = c.leader()
			return next != nil && next.State().Nodes[victim].Expired
		}, "round %d: the new leader expires %s", round, victim)
		for id, e := range epochs {
			if id == victim {
				continue
			}
			if n := next.State().Nodes[id]; n.Expired || n.Epoch != e {
				t.Errorf("round %d: survivor %s expired by the new leader %s: %+v, epoch was %d", round, id, next.NodeID(), n, e)
			}
		}
		c.start(victim, 0)
	}
}
