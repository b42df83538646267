package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
)

// wait is the generous timeout of every poll: the machine is loaded.
const wait = 30 * time.Second

const testGroup GroupID = 7

// listSM is a state machine that keeps every applied entry's data.
type listSM struct {
	mu       sync.Mutex
	items    []string
	restores int
	leaders  [][2]uint64
}

func (s *listSM) Apply(e Entry) error {
	s.mu.Lock()
	s.items = append(s.items, string(e.Data))
	s.mu.Unlock()
	return nil
}

func (s *listSM) Snapshot() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return json.Marshal(s.items)
}

func (s *listSM) Restore(data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restores++
	s.items = nil
	return json.Unmarshal(data, &s.items)
}

func (s *listSM) LeaderChanged(leader, term uint64) {
	s.mu.Lock()
	s.leaders = append(s.leaders, [2]uint64{leader, term})
	s.mu.Unlock()
}

func (s *listSM) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.items)
}

// testCluster is n hosts on one MemNetwork, each with a MemFS, each
// holding a replica of testGroup.
type testCluster struct {
	t      *testing.T
	net    *MemNetwork
	ids    []uint64
	cfg    Config
	fss    map[uint64]*store.MemFS
	hosts  map[uint64]*Host
	groups map[uint64]*Group
	sms    map[uint64]*listSM
}

func testConfig() Config {
	return Config{
		TickInterval:   20 * time.Millisecond,
		ElectionTicks:  10,
		HeartbeatTicks: 2,
		Store:          store.Options{SegmentSize: 1 << 20, MinFreeDisk: -1},
	}
}

func newTestCluster(t *testing.T, n int, cfg Config) *testCluster {
	t.Helper()
	c := &testCluster{
		t: t, net: NewMemNetwork(), cfg: cfg,
		fss: map[uint64]*store.MemFS{}, hosts: map[uint64]*Host{},
		groups: map[uint64]*Group{}, sms: map[uint64]*listSM{},
	}
	for i := 1; i <= n; i++ {
		c.ids = append(c.ids, uint64(i))
	}
	for _, id := range c.ids {
		c.fss[id] = store.NewMemFS()
		c.start(id, c.ids)
	}
	t.Cleanup(c.closeAll)
	return c
}

// start opens host id on its MemFS and its replica of testGroup.
func (c *testCluster) start(id uint64, peers []uint64) {
	c.t.Helper()
	cfg := c.cfg
	cfg.ID = id
	cfg.Transport = c.net.Transport(id)
	h, err := NewHost(c.fss[id], "/data", cfg)
	if err != nil {
		c.t.Fatalf("host %d: %v", id, err)
	}
	sm := &listSM{}
	g, err := h.Group(testGroup, peers, sm)
	if err != nil {
		c.t.Fatalf("host %d: group: %v", id, err)
	}
	c.hosts[id], c.groups[id], c.sms[id] = h, g, sm
}

// crash kills host id as a power cut would: its disk keeps only what
// was synced, and it is gone from the network.
func (c *testCluster) crash(id uint64) {
	c.t.Helper()
	c.net.Remove(id)
	disk := c.fss[id].Crash(nil)
	_ = c.hosts[id].Close()
	c.fss[id] = disk
	delete(c.hosts, id)
	delete(c.groups, id)
	delete(c.sms, id)
}

func (c *testCluster) restart(id uint64) {
	c.t.Helper()
	c.start(id, nil)
}

func (c *testCluster) closeAll() {
	for id, h := range c.hosts {
		c.net.Remove(id)
		_ = h.Close()
	}
}

// leader waits until exactly one replica leads and a majority agrees, and
// returns it.
func (c *testCluster) leader() uint64 {
	c.t.Helper()
	var lead uint64
	defer func() {
		if c.t.Failed() {
			for id, g := range c.groups {
				st, err := g.Status()
				c.t.Logf("replica %d: %+v %v", id, st, err)
			}
		}
	}()
	testutil.WaitForf(c.t, wait, func() bool {
		lead = 0
		for id, g := range c.groups {
			st, err := g.Status()
			if err != nil {
				return false
			}
			if st.Role == "leader" {
				if lead != 0 {
					return false
				}
				lead = id
			}
		}
		if lead == 0 {
			return false
		}
		// A majority agrees (a replica cut off may not know the leader).
		agree := 0
		for _, g := range c.groups {
			if l, _ := g.Leader(); l == lead {
				agree++
			}
		}
		return agree > len(c.ids)/2
	}, "a leader agreed by a majority of %d replicas", len(c.ids))
	return lead
}

// propose proposes data on the leader, retrying through leader changes.
func (c *testCluster) propose(data string) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		lead := c.leader()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		idx, err := c.groups[lead].Propose(ctx, []byte(data))
		cancel()
		if err == nil {
			return idx
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("propose %q: %v", data, err)
		}
		if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrLeadershipLost) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrDropped) {
			c.t.Fatalf("propose %q: %v", data, err)
		}
	}
}

// converge waits until every live replica has applied want, in order.
func (c *testCluster) converge(want []string) {
	c.t.Helper()
	for id, sm := range c.sms {
		if !testutil.Eventually(wait, func() bool { return slices.Equal(sm.list(), want) }) {
			for id, g := range c.groups {
				st, err := g.Status()
				c.t.Logf("replica %d: %+v %v", id, st, err)
			}
		}
		testutil.WaitForf(c.t, time.Millisecond, func() bool { return slices.Equal(sm.list(), want) },
			"replica %d applies %d entries (has %d)", id, len(want), len(sm.list()))
	}
}

func items(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func newMemFS() *store.MemFS { return store.NewMemFS() }
