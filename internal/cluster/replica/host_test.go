package replica

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

func TestElectAndReplicate(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(map[int]string{3: "3", 5: "5"}[n], func(t *testing.T) {
			c := newTestCluster(t, n, testConfig())
			want := items("a", 50)
			var last uint64
			for _, s := range want {
				idx := c.propose(s)
				if idx <= last {
					t.Fatalf("index %d after %d", idx, last)
				}
				last = idx
			}
			c.converge(want)
			lead := c.leader()
			st, err := c.groups[lead].Status()
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Voters) != n || len(st.Match) != n {
				t.Fatalf("status %+v: want %d voters and match indexes", st, n)
			}
			testutil.WaitForf(t, wait, func() bool {
				st, _ := c.groups[lead].Status()
				for _, m := range st.Match {
					if m < last {
						return false
					}
				}
				return true
			}, "every replica matches %d", last)
		})
	}
}

func TestProposeOnFollower(t *testing.T) {
	c := newTestCluster(t, 3, testConfig())
	lead := c.leader()
	for id, g := range c.groups {
		if id == lead {
			continue
		}
		// A follower learns of the leader from its first message: until
		// then it names none (0), and a proposal is refused all the same.
		testutil.WaitForf(t, wait, func() bool {
			_, err := g.Propose(context.Background(), []byte("x"))
			var nl *NotLeaderError
			if !errors.As(err, &nl) || !errors.Is(err, ErrNotLeader) {
				t.Fatalf("follower %d: %v, want NotLeaderError", id, err)
			}
			if nl.Leader != 0 && nl.Leader != lead {
				t.Fatalf("follower %d names leader %d, want %d", id, nl.Leader, lead)
			}
			return nl.Leader == lead
		}, "follower %d names leader %d", id, lead)
	}
}

func TestLeaderCrash(t *testing.T) {
	c := newTestCluster(t, 3, testConfig())
	want := items("before", 20)
	for _, s := range want {
		c.propose(s)
	}
	old := c.leader()
	c.crash(old)
	lead := c.leader()
	if lead == old {
		t.Fatalf("crashed host %d still leads", old)
	}
	after := items("after", 20)
	for _, s := range after {
		c.propose(s)
	}
	want = append(want, after...)
	c.converge(want)
	c.restart(old)
	c.converge(want)
}

// TestPartitionedLeader isolates the leader: it commits nothing, the
// majority elects a new leader and goes on, and after healing every
// replica holds the majority's log only.
func TestPartitionedLeader(t *testing.T) {
	c := newTestCluster(t, 3, testConfig())
	want := items("a", 10)
	for _, s := range want {
		c.propose(s)
	}
	c.converge(want)
	old := c.leader()
	c.net.Isolate(old, c.ids...)

	// The old leader's proposals never commit: CheckQuorum makes it step
	// down, and the entry it appended is overwritten by the new leader.
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.groups[old].Propose(ctx, []byte("minority"))
		errc <- err
	}()
	majority := map[uint64]*Group{}
	for id, g := range c.groups {
		if id != old {
			majority[id] = g
		}
	}
	testutil.WaitForf(t, wait, func() bool {
		for _, g := range majority {
			if l, _ := g.Leader(); l == 0 || l == old {
				return false
			}
		}
		return true
	}, "the majority elects a new leader")
	if err := <-errc; err == nil {
		t.Fatal("the isolated leader committed a proposal")
	}
	var newLead uint64
	for _, g := range majority {
		newLead, _ = g.Leader()
	}
	more := items("b", 10)
	for _, s := range more {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		if _, err := majority[newLead].Propose(ctx, []byte(s)); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	want = append(want, more...)
	c.net.Heal()
	c.converge(want)
	if slices.Contains(c.sms[old].list(), "minority") {
		t.Fatal("the minority's entry was applied")
	}
}

// TestRestartKeepsLog crashes every host at once; the confirmed entries
// come back from their stores.
func TestRestartKeepsLog(t *testing.T) {
	c := newTestCluster(t, 3, testConfig())
	want := items("a", 30)
	for _, s := range want {
		c.propose(s)
	}
	for _, id := range c.ids {
		c.crash(id)
	}
	for _, id := range c.ids {
		c.restart(id)
	}
	c.leader()
	more := items("b", 5)
	for _, s := range more {
		c.propose(s)
	}
	c.converge(append(want, more...))
	for id, g := range c.groups {
		if d := g.Damaged(); d != "" {
			t.Fatalf("replica %d damaged after a clean crash: %s", id, d)
		}
	}
}

// TestCatchUpByLog: a follower cut off while entries commit gets them
// from the leader's log once healed.
func TestCatchUpByLog(t *testing.T) {
	c := newTestCluster(t, 3, testConfig())
	lead := c.leader()
	var lag uint64
	for _, id := range c.ids {
		if id != lead {
			lag = id
			break
		}
	}
	c.net.Isolate(lag, c.ids...)
	want := items("a", 40)
	for _, s := range want {
		c.propose(s)
	}
	if got := len(c.sms[lag].list()); got != 0 {
		t.Fatalf("isolated replica applied %d entries", got)
	}
	c.net.Heal()
	c.converge(want)
	sm := c.sms[lag]
	sm.mu.Lock()
	r := sm.restores
	sm.mu.Unlock()
	if r != 0 {
		t.Fatalf("caught up by %d snapshots, want by log", r)
	}
}

// TestCatchUpBySnapshot: a follower behind the leader's snapshot gets the
// snapshot, then the entries after it; a host restarted after snapshots
// rebuilds its state from its own.
func TestCatchUpBySnapshot(t *testing.T) {
	cfg := testConfig()
	cfg.SnapshotEntries = 10
	c := newTestCluster(t, 3, cfg)
	lead := c.leader()
	var lag uint64
	for _, id := range c.ids {
		if id != lead {
			lag = id
			break
		}
	}
	c.net.Isolate(lag, c.ids...)
	want := items("a", 60)
	for _, s := range want {
		c.propose(s)
	}
	testutil.WaitForf(t, wait, func() bool {
		st, err := c.groups[c.leader()].Status()
		return err == nil && st.Applied >= 60
	}, "the leader applies its entries")
	c.net.Heal()
	c.converge(want)
	sm := c.sms[lag]
	sm.mu.Lock()
	restores := sm.restores
	sm.mu.Unlock()
	if restores == 0 {
		t.Fatal("the lagging replica caught up without a snapshot")
	}
	more := items("b", 5)
	for _, s := range more {
		c.propose(s)
	}
	want = append(want, more...)
	c.converge(want)
	c.crash(lag)
	c.restart(lag)
	c.converge(want)
}

func TestTransferLeadership(t *testing.T) {
	c := newTestCluster(t, 3, testConfig())
	c.propose("x")
	lead := c.leader()
	var to uint64
	for _, id := range c.ids {
		if id != lead {
			to = id
			break
		}
	}
	testutil.WaitForf(t, wait, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return c.groups[lead].TransferLeadership(ctx, to) == nil
	}, "leadership moves to %d", to)
	if got := c.leader(); got != to {
		t.Fatalf("leader %d, want %d", got, to)
	}
	sm := c.sms[to]
	testutil.WaitForf(t, wait, func() bool {
		sm.mu.Lock()
		defer sm.mu.Unlock()
		return len(sm.leaders) > 0 && sm.leaders[len(sm.leaders)-1][0] == to
	}, "the new leader's state machine is told")
}

// TestMembership grows a group from 3 to 4 replicas, one at a time (a
// learner first, then promoted), and shrinks it back.
func TestMembership(t *testing.T) {
	c := newTestCluster(t, 3, testConfig())
	want := items("a", 10)
	for _, s := range want {
		c.propose(s)
	}
	lead := c.leader()
	c.ids = append(c.ids, 4)
	c.fss[4] = newMemFS()
	c.start(4, nil) // joins: it knows no leader until it is added
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := c.groups[lead].AddLearner(ctx, 4); err != nil {
		t.Fatal(err)
	}
	c.converge(want)
	if err := c.groups[lead].AddVoter(ctx, 4); err != nil {
		t.Fatal(err)
	}
	st, err := c.groups[lead].Status()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Voters, []uint64{1, 2, 3, 4}) || len(st.Learners) != 0 {
		t.Fatalf("voters %v learners %v", st.Voters, st.Learners)
	}
	var gone uint64
	for _, id := range []uint64{1, 2, 3} {
		if id != lead {
			gone = id
			break
		}
	}
	if err := c.groups[lead].RemoveReplica(ctx, gone); err != nil {
		t.Fatal(err)
	}
	c.net.Remove(gone)
	_ = c.hosts[gone].Close()
	delete(c.hosts, gone)
	delete(c.groups, gone)
	delete(c.sms, gone)
	more := items("b", 5)
	for _, s := range more {
		c.propose(s)
	}
	c.converge(append(want, more...))
}

// failSM fails to apply "boom".
type failSM struct{ listSM }

func (s *failSM) Apply(e Entry) error {
	if string(e.Data) == "boom" {
		return errors.New("boom")
	}
	return s.listSM.Apply(e)
}

// TestStateMachineError: a state machine that cannot apply an entry
// stops its replica of the group; proposals there fail with the error.
func TestStateMachineError(t *testing.T) {
	net := NewMemNetwork()
	ids := []uint64{1, 2, 3}
	groups := map[uint64]*Group{}
	for _, id := range ids {
		cfg := testConfig()
		cfg.ID, cfg.Transport = id, net.Transport(id)
		h, err := NewHost(newMemFS(), "/data", cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		if groups[id], err = h.Group(testGroup, ids, &failSM{}); err != nil {
			t.Fatal(err)
		}
	}
	var lead *Group
	testutil.WaitForf(t, wait, func() bool {
		for id, g := range groups {
			if l, _ := g.Leader(); l == id {
				lead = g
				return true
			}
		}
		return false
	}, "a leader")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := lead.Propose(ctx, []byte("boom")); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("propose boom: %v", err)
	}
	if _, err := lead.Propose(ctx, []byte("x")); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("propose after the failure: %v", err)
	}
}
