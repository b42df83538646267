package meta

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
	"github.com/hashicorp/raft"
)

func TestVoters(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 5, 7: 5, 20: 5} {
		if got := Voters(n); got != want {
			t.Errorf("Voters(%d) = %d, want %d", n, got, want)
		}
	}
}

func (c *testCluster) servers(t *testing.T) (voters, nonvoters []string) {
	t.Helper()
	s, err := c.waitLeader(10 * time.Second).Servers()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range s {
		if x.Voter {
			voters = append(voters, x.ID)
		} else {
			nonvoters = append(nonvoters, x.ID)
		}
	}
	slices.Sort(voters)
	slices.Sort(nonvoters)
	return voters, nonvoters
}

// TestJoinAndRemove: a 3-node cluster bootstrapped with
// bootstrap_expect 3; a fourth node joins as a non-voter (it does not
// bootstrap: the members say a cluster is formed), a fifth makes five
// voters; removing one from any node takes it out for good while the
// fabric still lists it, and lets it back once the fabric no longer
// does.
func TestJoinAndRemove(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 120*time.Second)
	if v, nv := c.servers(t); !slices.Equal(v, []string{"n1", "n2", "n3"}) || len(nv) != 0 {
		t.Fatalf("bootstrapped with voters %v, non-voters %v", v, nv)
	}
	if _, _, err := c.waitLeader(10*time.Second).Declare(ctx, "before-join", reqresp(""), DeclareOptions{}); err != nil {
		t.Fatal(err)
	}
	c.ids = append(c.ids, "n4")
	// Started with bootstrap_expect 3: it sees 4 members, one of which
	// says a cluster is formed, so it waits to be added.
	n4 := c.start("n4", 3)
	testutil.WaitForf(t, 20*time.Second, func() bool {
		v, nv := c.servers(t)
		return len(v) == 3 && slices.Equal(nv, []string{"n4"})
	}, "n4 added as a non-voter")
	testutil.WaitForf(t, 10*time.Second, func() bool { _, ok := n4.Exchange("before-join"); return ok }, "n4 replicates")
	if _, _, err := n4.Declare(ctx, "from-n4", reqresp(""), DeclareOptions{}); err != nil {
		t.Fatalf("a non-voter writes through the leader: %v", err)
	}

	c.ids = append(c.ids, "n5")
	c.start("n5", 0)
	testutil.WaitForf(t, 20*time.Second, func() bool {
		v, nv := c.servers(t)
		return len(v) == 5 && len(nv) == 0
	}, "five voters with n5")

	// Remove n5 from a node that does not lead; n5 stops its member.
	var from *Meta
	for _, m := range c.running() {
		if !m.IsLeader() && m.NodeID() != "n5" {
			from = m
		}
	}
	if err := from.Remove(ctx, "n5"); err != nil {
		t.Fatalf("remove n5 from %s: %v", from.NodeID(), err)
	}
	v, nv := c.servers(t)
	if slices.Contains(v, "n5") || slices.Contains(nv, "n5") {
		t.Fatalf("n5 still in the group: %v %v", v, nv)
	}
	if _, ok := from.State().Removed["n5"]; !ok {
		t.Fatal("no tombstone for n5")
	}
	// The fabric still lists n5: the leader does not add it back, and
	// keeps 3 voters of the 4 servers (Voters(4) = 3).
	testutil.WaitForf(t, 10*time.Second, func() bool {
		v, nv := c.servers(t)
		return len(v) == 3 && len(nv) == 1 && !slices.Contains(v, "n5")
	}, "4 servers without n5")
	n5 := c.node("n5")
	testutil.WaitForf(t, 10*time.Second, func() bool { return n5.raft.State() == raft.Shutdown }, "n5 stops its member")
	// Once gone from the fabric, n5 may come back as a new node.
	c.kill("n5")
	testutil.WaitForf(t, 10*time.Second, func() bool {
		l := c.leader() // nil between terms
		if l == nil {
			return false
		}
		_, ok := l.State().Removed["n5"]
		return !ok
	}, "tombstone of n5 dropped")

	// Removing an unknown node is an error from the leader.
	if err := from.Remove(ctx, "nobody"); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("removing a node that is not in the group: %v, want ErrUnknownNode", err)
	}
}

// TestBootstrapWaitsForExpect: nodes expecting 3 do not bootstrap while
// they see 2; they do once the third appears.
func TestBootstrapWaitsForExpect(t *testing.T) {
	tn := newTestNet()
	dir := t.TempDir()
	var nodes []*Meta
	start := func(id string) {
		rl, fl := tn.listen(t, id)
		m, err := New(Config{NodeID: id, Dir: dir + "/" + id, Advertise: rl.Addr().String(), Stream: rl, Forward: fl,
			BootstrapExpect: 3, Log: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Shutdown() })
		nodes = append(nodes, m)
	}
	reconcile := func() {
		var members []Member
		for _, m := range nodes {
			members = append(members, Member{ID: m.NodeID(), Addr: m.cfg.Advertise})
		}
		for _, m := range nodes {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := m.Reconcile(ctx, members); err != nil {
				t.Fatalf("reconcile %s: %v", m.NodeID(), err)
			}
			cancel()
		}
	}
	start("a")
	start("b")
	// A member that does not answer: nobody bootstraps, and Reconcile
	// says why.
	ghost := []Member{{ID: "a", Addr: nodes[0].cfg.Advertise}, {ID: "b", Addr: nodes[1].cfg.Advertise}, {ID: "ghost", Addr: "127.0.0.1:1"}}
	if err := nodes[0].Reconcile(testutil.Context(t, 5*time.Second), ghost); err == nil || !strings.Contains(err.Error(), "ghost") {
		t.Fatalf("reconcile with a silent member: %v", err)
	}
	reconcile()
	for _, m := range nodes {
		if m.status().HasState {
			t.Fatalf("%s bootstrapped with 2 of 3 nodes", m.NodeID())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, _, err := nodes[0].Declare(ctx, "x", reqresp(""), DeclareOptions{})
	cancel()
	if !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("write before bootstrap: %v, want ErrNoQuorum", err)
	}
	start("c")
	reconcile()
	testutil.WaitForf(t, 20*time.Second, func() bool {
		for _, m := range nodes {
			if m.IsLeader() {
				return true
			}
		}
		return false
	}, "a leader after the third node")
	for _, m := range nodes {
		testutil.WaitForf(t, 10*time.Second, func() bool {
			s, err := m.Servers()
			return err == nil && len(s) == 3
		}, "%s knows the 3 servers", m.NodeID())
	}
}

// TestSingleNode: bootstrap_expect 1 forms a group of one at the first
// Reconcile, which takes writes, reads and renewals alone.
func TestSingleNode(t *testing.T) {
	tn := newTestNet()
	rl, fl := tn.listen(t, "solo")
	m, err := New(Config{NodeID: "solo", Dir: t.TempDir(), Advertise: rl.Addr().String(), Stream: rl, Forward: fl, BootstrapExpect: 1, Log: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	ctx := testutil.Context(t, 30*time.Second)
	if err := m.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForf(t, 10*time.Second, m.IsLeader, "solo leads")
	if _, created, err := m.Declare(ctx, "x", reqresp(""), DeclareOptions{}); err != nil || !created {
		t.Fatalf("declare: %v %v", created, err)
	}
	if _, ok, err := m.Get(ctx, "x"); err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	testutil.WaitForf(t, 10*time.Second, m.LeaseValid, "solo holds a lease")
	if e, _ := m.Lease(); e != 1 || m.Epoch("solo") != 1 {
		t.Fatalf("epoch %d / %d, want 1", e, m.Epoch("solo"))
	}
	// Calls after Shutdown fail with ErrClosed.
	m.Shutdown()
	if _, _, err := m.Declare(ctx, "y", reqresp(""), DeclareOptions{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("declare after shutdown: %v, want ErrClosed", err)
	}
}
