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

// TestNewTermWaitsWholeLease: a leader starting a term counts every node
// as seen at that moment, whatever it recorded before (a receipt of its
// former term, or a renewal applied as a follower, may be older than a
// heartbeat its predecessor answered), and answers heartbeats only once
// the term is started; a node whose expiry is being decided gets no
// answer.
func TestNewTermWaitsWholeLease(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.leader()
	other := c.follower().NodeID()
	beat := func() error {
		ctx := testutil.Context(t, 10*time.Second)
		_, err := lead.beatLeader(ctx, other)
		return err
	}
	testutil.WaitForf(t, 15*time.Second, func() bool { return beat() == nil }, "the leader answers heartbeats")
	rec := lead.State().Nodes[other]

	// The leader's duties wait while the test runs them by hand.
	lead.dmu.Lock()
	defer lead.dmu.Unlock()
	lead.smu.Lock()
	lead.seen[other] = time.Now().Add(-time.Hour)
	lead.smu.Unlock()
	lead.smu.Lock()
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
		t.Fatalf("a new term kept a receipt from %v before it started", before.Sub(seen))
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
