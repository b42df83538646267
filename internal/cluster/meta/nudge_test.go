package meta

import (
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

// TestLeaderWritesReachFollowersAtOnce: what the leader writes on its
// own (a lost node's epoch bump and the re-homing of its exchanges)
// reaches the followers at once, not at Raft's next idle replication:
// with a commit timeout of a minute, the surviving follower still sees
// the lost node's exchange re-homed within a few leases.
func TestLeaderWritesReachFollowersAtOnce(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.CommitTimeout = time.Minute })
	ctx := testutil.Context(t, 2*time.Minute)
	lead := c.waitLeader(30 * time.Second)
	var victim, other *Meta
	for _, m := range c.running() {
		switch {
		case m == lead:
		case victim == nil:
			victim = m
		default:
			other = m
		}
	}
	for _, m := range c.running() {
		testutil.WaitForf(t, 30*time.Second, m.LeaseValid, "%s holds a lease", m.NodeID())
	}
	const name = "home.lost"
	if _, _, err := victim.Declare(ctx, name, reqresp(""), DeclareOptions{}); err != nil {
		t.Fatalf("declare on %s: %v", victim.NodeID(), err)
	}
	testutil.WaitForf(t, 30*time.Second, func() bool {
		ex, ok := other.Exchange(name)
		return ok && ex.Home == victim.NodeID()
	}, "%s knows %s homed on %s", other.NodeID(), name, victim.NodeID())
	id := victim.NodeID()
	start := time.Now()
	c.kill(id)
	// The lease (1.2 s) expires, then a bump and a re-homing through the
	// log; 20 s is far from either the lease or the commit timeout.
	testutil.WaitForf(t, 20*time.Second, func() bool {
		ex, ok := other.Exchange(name)
		return ok && ex.Home != id
	}, "the follower %s sees %s re-homed off %s", other.NodeID(), name, id)
	t.Logf("re-homed on the follower %v after the kill", time.Since(start).Round(time.Millisecond))
}
