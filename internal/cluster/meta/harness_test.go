package meta

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
	"github.com/hashicorp/raft"
)

// testNet is the network of a test cluster: plain TCP on 127.0.0.1, with
// nodes that can be cut off (every stream to and from them closed, new
// ones refused) and healed.
type testNet struct {
	mu      sync.Mutex
	raftOf  map[string]string // node → raft address
	fwdOf   map[string]string // node → forward address
	nodeOf  map[string]string // raft address → node
	blocked map[string]bool
	conns   map[string]map[net.Conn]struct{} // node → its streams, both ends
}

func newTestNet() *testNet {
	return &testNet{raftOf: map[string]string{}, fwdOf: map[string]string{}, nodeOf: map[string]string{},
		blocked: map[string]bool{}, conns: map[string]map[net.Conn]struct{}{}}
}

// cut isolates node: its streams close and no new one opens until heal.
func (n *testNet) cut(node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.blocked[node] = true
	for c := range n.conns[node] {
		c.Close()
	}
	delete(n.conns, node)
}

func (n *testNet) heal(node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.blocked, node)
}

func (n *testNet) track(node string, c net.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.blocked[node] {
		return false
	}
	if n.conns[node] == nil {
		n.conns[node] = map[net.Conn]struct{}{}
	}
	n.conns[node][c] = struct{}{}
	return true
}

// dial opens a TCP stream from node to peer at addr, tracked on both.
func (n *testNet) dial(ctx context.Context, from, to, addr string) (net.Conn, error) {
	n.mu.Lock()
	blocked := n.blocked[from] || n.blocked[to]
	n.mu.Unlock()
	if blocked {
		return nil, fmt.Errorf("test net: %s → %s cut", from, to)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if !n.track(from, c) || !n.track(to, c) {
		c.Close()
		return nil, fmt.Errorf("test net: %s → %s cut", from, to)
	}
	return c, nil
}

// layer is one node's listener on the test net, for Raft or forwarding.
type layer struct {
	net.Listener
	tn   *testNet
	node string
	fwd  bool
}

func (l *layer) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.tn.track(l.node, c) {
			return c, nil
		}
		c.Close()
	}
}

// Dial is raft.StreamLayer's.
func (l *layer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	l.tn.mu.Lock()
	to := l.tn.nodeOf[string(addr)]
	l.tn.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return l.tn.dial(ctx, l.node, to, string(addr))
}

// fwdLayer is a layer as a ForwardLayer.
type fwdLayer struct{ *layer }

func (l fwdLayer) Dial(ctx context.Context, id, _ string) (net.Conn, error) {
	l.tn.mu.Lock()
	addr := l.tn.fwdOf[id]
	l.tn.mu.Unlock()
	if addr == "" {
		return nil, fmt.Errorf("test net: no node %q", id)
	}
	return l.tn.dial(ctx, l.node, id, addr)
}

// listen opens node's two listeners, on the addresses it had before if
// it had any.
func (n *testNet) listen(t testing.TB, node string) (*layer, fwdLayer) {
	t.Helper()
	n.mu.Lock()
	raftAddr, fwdAddr := n.raftOf[node], n.fwdOf[node]
	n.mu.Unlock()
	open := func(addr string) net.Listener {
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		var l net.Listener
		var err error
		// A restarted node takes its old port again; the kernel may
		// hold it a moment.
		testutil.WaitForf(t, 10*time.Second, func() bool { l, err = net.Listen("tcp", addr); return err == nil }, "listen %s: %v", addr, err)
		return l
	}
	rl, fl := open(raftAddr), open(fwdAddr)
	n.mu.Lock()
	n.raftOf[node], n.fwdOf[node] = rl.Addr().String(), fl.Addr().String()
	n.nodeOf[rl.Addr().String()] = node
	n.mu.Unlock()
	return &layer{Listener: rl, tn: n, node: node}, fwdLayer{&layer{Listener: fl, tn: n, node: node, fwd: true}}
}

// testCluster is a few in-process nodes with a stand-in for the fabric:
// it calls Reconcile on every running node with the running nodes.
type testCluster struct {
	t     testing.TB
	tn    *testNet
	base  string
	ids   []string
	mu    sync.Mutex
	nodes map[string]*Meta
	tune  func(*Config)
	obs   map[string]Observer
	stop  chan struct{}
	done  chan struct{}
}

func testLogger() *slog.Logger {
	if os.Getenv("META_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newCluster starts n nodes that bootstrap together, and waits for a
// leader.
func newCluster(t testing.TB, n int, tune func(*Config)) *testCluster {
	t.Helper()
	return newClusterOf(t, n, tune, nil)
}

// newClusterWith is newCluster with an observer per node.
func newClusterWith(t testing.TB, n int, observer func(id string) Observer) *testCluster {
	t.Helper()
	return newClusterOf(t, n, nil, observer)
}

func newClusterOf(t testing.TB, n int, tune func(*Config), observer func(id string) Observer) *testCluster {
	t.Helper()
	c := &testCluster{t: t, tn: newTestNet(), base: t.TempDir(), nodes: map[string]*Meta{}, tune: tune,
		obs: map[string]Observer{}, stop: make(chan struct{}), done: make(chan struct{})}
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("n%d", i)
		c.ids = append(c.ids, id)
		if observer != nil {
			c.obs[id] = observer(id)
		}
	}
	for _, id := range c.ids {
		c.start(id, n)
	}
	go c.fabric()
	t.Cleanup(c.close)
	c.waitLeader(10 * time.Second)
	return c
}

func (c *testCluster) start(id string, expect int) *Meta {
	c.t.Helper()
	rl, fl := c.tn.listen(c.t, id)
	cfg := Config{NodeID: id, Dir: c.base + "/" + id, Advertise: rl.Addr().String(), Stream: rl, Forward: fl,
		BootstrapExpect: expect, Log: testLogger().With("node", id), Observer: c.obs[id]}
	if c.tune != nil {
		c.tune(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", id, err)
	}
	c.mu.Lock()
	c.nodes[id] = m
	c.mu.Unlock()
	return m
}

// members lists the running nodes, as the fabric would (a cut node is
// still listed by the others: memberlist would mark it suspect, then
// dead, but authority never follows it).
func (c *testCluster) members() []Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Member
	for id, m := range c.nodes {
		out = append(out, Member{ID: id, Addr: m.cfg.Advertise})
	}
	return out
}

func (c *testCluster) fabric() {
	defer close(c.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-tick.C:
		}
		members := c.members()
		for _, x := range members {
			if m := c.node(x.ID); m != nil {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				m.Reconcile(ctx, members)
				cancel()
			}
		}
	}
}

func (c *testCluster) node(id string) *Meta {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// kill stops node without leaving the group and closes its listeners.
func (c *testCluster) kill(id string) {
	c.mu.Lock()
	m := c.nodes[id]
	delete(c.nodes, id)
	c.mu.Unlock()
	if m != nil {
		m.Shutdown()
	}
}

func (c *testCluster) close() {
	close(c.stop)
	<-c.done
	for _, id := range c.ids {
		c.kill(id)
	}
}

// running returns the running nodes, by id.
func (c *testCluster) running() []*Meta {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Meta
	for _, id := range c.ids {
		if m := c.nodes[id]; m != nil {
			out = append(out, m)
		}
	}
	return out
}

// leader returns the node that leads, among the running nodes not cut
// off, and that the others agree on; nil if none.
func (c *testCluster) leader() *Meta {
	var lead *Meta
	for _, m := range c.running() {
		c.tn.mu.Lock()
		cut := c.tn.blocked[m.NodeID()]
		c.tn.mu.Unlock()
		if !cut && m.IsLeader() {
			lead = m
		}
	}
	return lead
}

func (c *testCluster) waitLeader(timeout time.Duration) *Meta {
	c.t.Helper()
	var lead *Meta
	testutil.WaitForf(c.t, timeout, func() bool { lead = c.leader(); return lead != nil }, "a leader")
	return lead
}

// follower returns a running node that does not lead.
func (c *testCluster) follower() *Meta {
	for _, m := range c.running() {
		if !m.IsLeader() {
			return m
		}
	}
	c.t.Fatal("no follower")
	return nil
}
