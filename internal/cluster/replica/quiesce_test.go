package replica

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
)

// quietCluster is 3 hosts with n groups each.
type quietCluster struct {
	t      *testing.T
	cfg    Config
	net    *MemNetwork
	ids    []uint64
	fss    map[uint64]*store.MemFS
	hosts  map[uint64]*Host
	groups map[GroupID]map[uint64]*Group
	n      int
}

func newQuietCluster(t *testing.T, n int, cfg Config) *quietCluster {
	t.Helper()
	c := &quietCluster{t: t, cfg: cfg, net: NewMemNetwork(), ids: []uint64{1, 2, 3},
		fss: map[uint64]*store.MemFS{}, hosts: map[uint64]*Host{}, groups: map[GroupID]map[uint64]*Group{}, n: n}
	for gid := GroupID(1); gid <= GroupID(n); gid++ {
		c.groups[gid] = map[uint64]*Group{}
	}
	for _, id := range c.ids {
		c.fss[id] = store.NewMemFS()
		c.start(id, c.ids)
	}
	return c
}

// start opens host id on its MemFS, with its replica of every group.
func (c *quietCluster) start(id uint64, peers []uint64) {
	c.t.Helper()
	cfg := c.cfg
	cfg.ID, cfg.Transport = id, c.net.Transport(id)
	h, err := NewHost(c.fss[id], "/data", cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = h.Close() })
	c.hosts[id] = h
	for gid := GroupID(1); gid <= GroupID(c.n); gid++ {
		g, err := h.Group(gid, peers, nopSM{})
		if err != nil {
			c.t.Fatal(err)
		}
		c.groups[gid][id] = g
	}
}

// leaders returns each group's leader, 0 if its live replicas do not
// all agree on one among the hosts in alive.
func (c *quietCluster) leaders(alive ...uint64) map[GroupID]uint64 {
	out := map[GroupID]uint64{}
	for gid, reps := range c.groups {
		var lead uint64
		for _, id := range alive {
			l, _ := reps[id].Leader()
			if l == 0 || (lead != 0 && l != lead) || !containsID(alive, l) {
				lead = 0
				break
			}
			lead = l
		}
		out[gid] = lead
	}
	return out
}

func (c *quietCluster) allLed(alive ...uint64) bool {
	for _, l := range c.leaders(alive...) {
		if l == 0 {
			return false
		}
	}
	return true
}

// waitQuiet waits until every group has a leader and no group ticks on
// the hosts alive.
func (c *quietCluster) waitQuiet(alive ...uint64) {
	c.t.Helper()
	testutil.WaitForf(c.t, wait, func() bool {
		if !c.allLed(alive...) {
			return false
		}
		for _, id := range alive {
			if c.hosts[id].QuietStats().Awake != 0 {
				return false
			}
		}
		return true
	}, "%d groups led and quiet", c.n)
}

func (c *quietCluster) groupMsgs() int {
	total := 0
	for _, id := range c.ids {
		g, _ := c.net.Messages(id)
		total += g
	}
	return total
}

func quietConfig() Config {
	cfg := testConfig()
	cfg.ElectionTicks = 50 // 1 s: a stall of the loaded machine does not look like a dead host
	return cfg
}

// TestIdleGroupsQuiet: 200 idle groups on 3 hosts fall quiet; over 20
// heartbeat intervals they send no message at all, each host sends one
// heartbeat per peer per interval, and no leader changes (check-quorum
// does not make a quiet leader step down).
func TestIdleGroupsQuiet(t *testing.T) {
	cfg := quietConfig()
	c := newQuietCluster(t, 200, cfg)
	c.waitQuiet(c.ids...)
	before := c.leaders(c.ids...)
	terms := map[GroupID]uint64{}
	for gid, reps := range c.groups {
		_, terms[gid] = reps[1].Leader()
	}
	g0 := c.groupMsgs()
	h0 := map[uint64]int{}
	for _, id := range c.ids {
		_, h0[id] = c.net.Messages(id)
	}
	interval := time.Duration(cfg.HeartbeatTicks) * cfg.TickInterval
	const intervals = 20
	start := time.Now()
	time.Sleep(intervals * interval) // the measurement window, not a wait for correctness
	el := time.Since(start)
	if d := c.groupMsgs() - g0; d != 0 {
		t.Errorf("quiet groups sent %d messages in %v", d, el)
	}
	for _, id := range c.ids {
		_, h := c.net.Messages(id)
		// One heartbeat per peer per interval; the window may be longer
		// than asked on a loaded machine, so allow for what elapsed.
		if d, most := h-h0[id], 2*(int(el/interval)+2); d == 0 || d > most {
			t.Errorf("host %d sent %d host heartbeats in %v, want 1 to %d", id, d, el, most)
		}
	}
	after := c.leaders(c.ids...)
	for gid, l := range before {
		_, term := c.groups[gid][1].Leader()
		if after[gid] != l || term != terms[gid] {
			t.Errorf("group %d: leader %d term %d, was %d term %d", gid, after[gid], term, l, terms[gid])
		}
	}
	for _, id := range c.ids {
		t.Logf("host %d: %+v", id, c.hosts[id].QuietStats())
	}
}

// TestQuietProposalCommits: a proposal to a quiet group wakes it,
// commits on every replica, and the group falls quiet again.
func TestQuietProposalCommits(t *testing.T) {
	c := newQuietCluster(t, 20, quietConfig())
	c.waitQuiet(c.ids...)
	for gid, lead := range c.leaders(c.ids...) {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		idx, err := c.groups[gid][lead].Propose(ctx, []byte(fmt.Sprintf("g%d", gid)))
		cancel()
		if err != nil {
			t.Fatalf("group %d: %v", gid, err)
		}
		for id, g := range c.groups[gid] {
			testutil.WaitForf(t, wait, func() bool { return g.Applied() >= idx }, "group %d applies %d on %d", gid, idx, id)
		}
	}
	c.waitQuiet(c.ids...)
}

// TestQuietLeaderHostDies: with every group quiet, the host that leads
// most of them dies; every group elects a new leader on the two others
// within about three election timeouts (the death is noticed after one,
// and each follower then campaigns within one or two more; asserted:
// ten), and commits.
func TestQuietLeaderHostDies(t *testing.T) {
	cfg := quietConfig()
	c := newQuietCluster(t, 60, cfg)
	c.waitQuiet(c.ids...)
	count := map[uint64]int{}
	for _, l := range c.leaders(c.ids...) {
		count[l]++
	}
	dead := uint64(1)
	for id, n := range count {
		if n > count[dead] {
			dead = id
		}
	}
	var alive []uint64
	for _, id := range c.ids {
		if id != dead {
			alive = append(alive, id)
		}
	}
	start := time.Now()
	c.net.Remove(dead)
	_ = c.hosts[dead].Close()
	testutil.WaitForf(t, wait, func() bool { return c.allLed(alive...) }, "every group elects a leader on %v", alive)
	el := time.Since(start)
	timeout := time.Duration(cfg.ElectionTicks) * cfg.TickInterval
	t.Logf("host %d led %d of %d groups; all had a new leader after %v (election timeout %v)", dead, count[dead], c.n, el, timeout)
	// The bound is about 3 election timeouts (noticing the death, then a
	// randomized timeout of 1 to 2, and a split vote now and then); 10
	// leaves room for a loaded machine.
	if el > 10*timeout {
		t.Errorf("new leaders after %v, want within %v", el, 10*timeout)
	}
	for gid, lead := range c.leaders(alive...) {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		_, err := c.groups[gid][lead].Propose(ctx, []byte("after"))
		cancel()
		if err != nil {
			t.Fatalf("group %d: %v", gid, err)
		}
	}
	c.waitQuiet(alive...)
}

// TestQuietLeaderIsolated: the host leading quiet groups is cut off; the
// others elect new leaders, the old leader's groups wake and step down
// (check-quorum), and after healing every group has one leader again.
func TestQuietLeaderIsolated(t *testing.T) {
	c := newQuietCluster(t, 30, quietConfig())
	c.waitQuiet(c.ids...)
	iso := uint64(2)
	var alive []uint64
	for _, id := range c.ids {
		if id != iso {
			alive = append(alive, id)
		}
	}
	c.net.Isolate(iso, c.ids...)
	testutil.WaitForf(t, wait, func() bool { return c.allLed(alive...) }, "every group elects a leader on %v", alive)
	testutil.WaitForf(t, wait, func() bool {
		for _, reps := range c.groups {
			if st, err := reps[iso].Status(); err != nil || st.Role == "leader" {
				return false
			}
		}
		return true
	}, "the isolated host leads no group")
	c.net.Heal()
	c.waitQuiet(c.ids...)
}

// TestQuietLeaderHostRestarts: with every group quiet, the host leading
// most of them restarts faster than an election timeout (its disk keeps
// what was synced). The others see its new incarnation in its first
// heartbeat and wake the groups concerned, without waiting for an
// election timeout to notice; every group is led again, on all three.
func TestQuietLeaderHostRestarts(t *testing.T) {
	c := newQuietCluster(t, 60, quietConfig())
	c.waitQuiet(c.ids...)
	count := map[uint64]int{}
	for _, l := range c.leaders(c.ids...) {
		count[l]++
	}
	r := uint64(1)
	for id, n := range count {
		if n > count[r] {
			r = id
		}
	}
	start := time.Now()
	c.net.Remove(r)
	disk := c.fss[r].Crash(nil)
	_ = c.hosts[r].Close()
	c.fss[r] = disk
	c.start(r, nil)
	c.waitQuiet(c.ids...)
	t.Logf("host %d led %d of %d groups; restarted, all led and quiet again after %v", r, count[r], c.n, time.Since(start))
	for _, id := range c.ids {
		if st := c.hosts[id].QuietStats(); id != r && st.Restarts == 0 {
			t.Errorf("host %d did not see host %d restart: %+v", id, r, st)
		}
	}
}
