//go:build linux

package clustertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// wait bounds every wait for a node or a condition; the machine is
// loaded, so it is generous.
const wait = 30 * time.Second

// dialNode connects a client to node j from node i's network.
func dialNode(t *testing.T, c *Cluster, i, j int) *courier.Conn {
	t.Helper()
	ctx := testutil.Context(t, wait)
	var conn *courier.Conn
	err := c.InNode(i, func() error {
		var err error
		conn, err = client.Dial(ctx, c.Node(j).ClientURL(), client.Options{Name: fmt.Sprintf("chaos-%d-%d", i, j)})
		return err
	})
	if err != nil {
		t.Fatalf("dial %s from %s: %v", c.Node(j).Name, c.Node(i).Name, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// echo attaches an echo handler on conn and makes n requests through
// it, recording each in the history.
func echo(t *testing.T, c *Cluster, conn *courier.Conn, node string, n int) {
	t.Helper()
	ctx := testutil.Context(t, wait)
	ex, err := conn.ReqResp(ctx, "echo", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
		t.Fatal(err)
	}
	h := c.History()
	for k := range n {
		body := fmt.Sprintf("%s-%d", node, k)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := h.Now()
		resp, err := ex.Request(rctx, courier.Message{Body: []byte(body)})
		q := Request{ID: body, Node: node, Start: start, Deadline: start + int64(5*time.Second)}
		switch {
		case err == nil && string(resp.Body) == body:
			q.Outcomes = []RequestOutcome{{Kind: "response", Time: h.Now()}}
		case err == nil:
			t.Fatalf("request %s answered %q", body, resp.Body)
		default:
			q.Outcomes = []RequestOutcome{{Kind: "error", Detail: err.Error(), Time: h.Now()}}
			t.Errorf("request %s: %v", body, err)
		}
		cancel()
		h.AddRequest(q)
	}
}

// canConnect reports whether a TCP connection from node i's network to
// addr succeeds within d.
func canConnect(c *Cluster, i int, addr string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	conn, err := c.DialContext(ctx, i, "tcp", addr)
	if err == nil {
		conn.Close()
	}
	return err
}

// TestNetnsCluster runs three single-node servers, each in its own
// namespace, with a client in each namespace, and checks that a
// partition cuts exactly what it should and that healing restores it.
func TestNetnsCluster(t *testing.T) {
	c := New(t, Options{Nodes: 3, Mode: ModeNetns})
	if c.Mode() != ModeNetns {
		t.Fatalf("mode %s", c.Mode())
	}
	for i, n := range c.Nodes() {
		echo(t, c, dialNode(t, c, i, i), n.Name, 20)
	}
	// Each namespace reaches every node before the partition.
	for i := range c.Nodes() {
		for j, m := range c.Nodes() {
			if err := canConnect(c, i, m.ClientAddr, wait); err != nil {
				t.Fatalf("%s -> %s before the partition: %v", c.Node(i).Name, m.Name, err)
			}
			_ = j
		}
	}

	f, err := c.Inject(Isolate{Node: 0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, cut := range [][2]int{{0, 1}, {0, 2}, {1, 0}, {2, 0}} {
		if err := canConnect(c, cut[0], c.Node(cut[1]).ClientAddr, time.Second); err == nil {
			t.Fatalf("%s reached %s across the partition", c.Node(cut[0]).Name, c.Node(cut[1]).Name)
		}
	}
	for _, ok := range [][2]int{{0, 0}, {1, 1}, {1, 2}, {2, 1}} {
		if err := canConnect(c, ok[0], c.Node(ok[1]).ClientAddr, wait); err != nil {
			t.Fatalf("%s -> %s on the same side: %v", c.Node(ok[0]).Name, c.Node(ok[1]).Name, err)
		}
	}
	// A client in the isolated namespace still talks to its own node.
	echo(t, c, dialNode(t, c, 0, 0), "n1-isolated", 5)
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]int{{0, 1}, {1, 0}, {2, 0}} {
		if err := canConnect(c, p[0], c.Node(p[1]).ClientAddr, wait); err != nil {
			t.Fatalf("%s -> %s after healing: %v", c.Node(p[0]).Name, c.Node(p[1]).Name, err)
		}
	}
	s := c.History().Snapshot()
	if len(s.Nemeses) != 1 || s.Nemeses[0].Name != "partition" || s.Nemeses[0].End <= s.Nemeses[0].Start {
		t.Fatalf("nemesis not recorded: %+v", s.Nemeses)
	}
	if r := CheckRequests(s, 0); !r.OK() {
		t.Fatalf("%s: %v", r.Checked, r.Violations)
	}
}

// TestNetnsStrayDialStaysOnTheMachine dials a node's address from the
// root namespace, as a client that reconnects from a thread outside the
// node namespaces would: it reaches the root namespace's loopback, not
// the node, and nothing leaves the machine.
func TestNetnsStrayDialStaysOnTheMachine(t *testing.T) {
	c := New(t, Options{Nodes: 1, Mode: ModeNetns})
	conn, err := net.DialTimeout("tcp", c.Node(0).ClientAddr, 5*time.Second)
	if err == nil {
		conn.Close()
		t.Skipf("something in the root namespace listens on %s", c.Node(0).ClientAddr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a dial of %s from the root namespace: %v, want connection refused by the local loopback", c.Node(0).ClientAddr, err)
	}
	// A process started with Command runs in the namespace and reaches it.
	out, err := c.Command(0, "exchanges", "--url", c.Node(0).ClientURL()).CombinedOutput()
	if err != nil {
		t.Fatalf("courier exchanges in n1's namespace: %v\n%s", err, out)
	}
}

// TestNetnsBridgeAndSplit checks the shapes of the other partitions.
func TestNetnsBridgeAndSplit(t *testing.T) {
	c := Create(t, Options{Nodes: 3, Mode: ModeNetns})
	// No process needed: a listener in each namespace stands in.
	for i := range c.Nodes() {
		i := i
		var ln net.Listener
		if err := c.InNode(i, func() error {
			var err error
			ln, err = net.Listen("tcp", c.Node(i).IP+":7600")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				conn.Close()
			}
		}()
	}
	reach := func(i, j int) bool { return canConnect(c, i, c.Node(j).IP+":7600", 2*time.Second) == nil }
	f, err := c.Inject(Bridge{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	bridge := -1
	for i := range c.Nodes() {
		if reach(i, (i+1)%3) && reach(i, (i+2)%3) {
			bridge = i
		}
	}
	a, b := (bridge+1)%3, (bridge+2)%3
	if bridge < 0 || reach(a, b) || reach(b, a) {
		t.Fatalf("not a bridge: bridge %d, %d->%d %v", bridge, a, b, reach(a, b))
	}
	f.Heal()
	f, err = c.Inject(Split{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cut := 0
	for i := range 3 {
		for j := range 3 {
			if i != j && !reach(i, j) {
				cut++
			}
		}
	}
	if cut != 4 { // one node cut from two, both directions
		t.Fatalf("split of 3 nodes cut %d directed pairs, want 4", cut)
	}
	f.Heal()
}

// TestNetnsKillRestart kills a node with SIGKILL while it holds a
// confirmed task, restarts it on the same data directory, and checks
// with CheckTasks that the task is delivered.
func TestNetnsKillRestart(t *testing.T) {
	c := New(t, Options{Nodes: 1, Mode: ModeNetns})
	killRestart(t, c)
}

func killRestart(t *testing.T, c *Cluster) {
	ctx := testutil.Context(t, 2*wait)
	h := c.History()
	conn := dialNode(t, c, 0, 0)
	q, err := conn.Tasks(ctx, "chaos-tasks")
	if err != nil {
		t.Fatal(err)
	}
	for k := range 10 {
		id := fmt.Sprintf("task-%d", k)
		if _, err := q.Submit(ctx, courier.Task{Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
		h.AddTask(TaskRecord{ID: id, Event: TaskConfirmed, Time: h.Now()})
	}
	pid := c.Node(0).Pid()
	f, err := c.Inject(Kill{Node: 0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Node(0).Running() {
		t.Fatal("node still running after the kill")
	}
	f.Heal()
	if c.Node(0).Pid() == pid || !c.Node(0).Running() {
		t.Fatalf("node not restarted (pid %d, was %d)", c.Node(0).Pid(), pid)
	}
	conn = dialNode(t, c, 0, 0)
	q, err = conn.Tasks(ctx, "chaos-tasks")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 100)
	if _, err := q.Work(ctx, func(j *courier.Job) error {
		got <- string(j.Body)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		id := testutil.Recv(t, got, wait)
		h.AddTask(TaskRecord{ID: id, Event: TaskDelivered, Time: h.Now()})
	}
	if r := CheckTasks(h.Snapshot()); !r.OK() {
		t.Fatalf("%s: %v", r.Checked, r.Violations)
	}
}

// TestNetnsDelay sets 100 ms of delay on node 1's link and checks that
// a round trip to its cluster address from another namespace takes at
// least that: tc netem where the kernel has it, the cluster proxy in the
// node's namespace where it does not.
func TestNetnsDelay(t *testing.T) {
	c := Create(t, Options{Nodes: 2, Mode: ModeNetns})
	t.Logf("delay by proxy: %v (netem: %v)", c.NetemByProxy(), netemAvailable())
	var ln net.Listener
	if err := c.InNode(0, func() error {
		var err error
		ln, err = net.Listen("tcp", c.Node(0).clusterListen)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(conn, conn); conn.Close() }()
		}
	}()
	rtt := func() time.Duration {
		t.Helper()
		start := time.Now()
		ctx := testutil.Context(t, wait)
		conn, err := c.DialContext(ctx, 1, "tcp", c.Node(0).ClusterAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := roundTrip(conn, "ping", wait); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	t.Logf("round trip without delay: %v", rtt())
	const delay = 100 * time.Millisecond
	f, err := c.Inject(Netem{Node: 0, Delay: delay}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := rtt(); d < delay {
		t.Fatalf("round trip took %v under %v of delay", d, delay)
	} else {
		t.Logf("round trip with %v of delay: %v", delay, d)
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	// Clearing what is not set is no error.
	if err := c.Netem(0, 0, 0); err != nil {
		t.Fatal(err)
	}
}

// TestProxyCluster runs the fallback: nodes on 127.0.0.1 with a proxy in
// front of each cluster port, forced as COURIER_CHAOS_MODE=proxy would.
func TestProxyCluster(t *testing.T) {
	t.Setenv(EnvMode, string(ModeProxy))
	c := New(t, Options{Nodes: 2})
	if c.Mode() != ModeProxy || !c.NetemByProxy() {
		t.Fatalf("mode %s", c.Mode())
	}
	for i, n := range c.Nodes() {
		echo(t, c, dialNode(t, c, i, i), n.Name, 10)
		if n.ClusterAddr == n.clusterListen {
			t.Fatalf("%s advertises its own cluster port, not its proxy's", n.Name)
		}
	}
	if r := CheckRequests(c.History().Snapshot(), 0); !r.OK() {
		t.Fatalf("%s: %v", r.Checked, r.Violations)
	}

	// The single-node servers do not listen on their cluster ports: an
	// echo server stands in for node 1's, behind its proxy.
	ln, err := net.Listen("tcp", c.Node(0).clusterListen)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(conn, conn); conn.Close() }()
		}
	}()
	conn, err := net.Dial("tcp", c.Node(0).ClusterAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := roundTrip(conn, "before", wait); err != nil {
		t.Fatal(err)
	}
	// This test process is no node: the proxy cuts it only from an
	// isolated node.
	f, err := c.Inject(Isolate{Node: 0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(conn, "during", 300*time.Millisecond); err == nil {
		t.Fatal("bytes reached an isolated node")
	}
	// A new connection across the cut is reset at once.
	if nc, err := net.Dial("tcp", c.Node(0).ClusterAddr); err == nil {
		if err := roundTrip(nc, "new", wait); err == nil {
			t.Fatal("a new connection crossed the cut")
		}
		nc.Close()
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(wait))
	buf := make([]byte, len("during"))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "during" {
		t.Fatalf("bytes held during the cut: %q, %v", buf, err)
	}

	killRestart(t, c)
}

// TestStaleNamespacesRemoved leaves a namespace named as a dead test
// process's would be, and checks that the cleanup pass removes it.
func TestStaleNamespacesRemoved(t *testing.T) {
	if ok, why := netnsAvailable(); !ok {
		t.Skip(why)
	}
	// A pid that does not run: above the kernel's pid_max limit.
	name := fmt.Sprintf("%s%d-1-sw", nsPrefix, 1<<23)
	if err := ipCmd("netns", "add", name); err != nil {
		t.Fatal(err)
	}
	// A process left running in it, as a node of a dead test would be.
	left := exec.Command("ip", "netns", "exec", name, "sleep", "600")
	if err := left.Start(); err != nil {
		deleteNamespace(name)
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- left.Wait() }()
	t.Cleanup(func() {
		left.Process.Kill()
		if exists(name) {
			deleteNamespace(name)
		}
	})
	testutil.WaitForf(t, wait, func() bool {
		out, _ := exec.Command("ip", "netns", "pids", name).Output()
		return len(strings.TrimSpace(string(out))) > 0
	}, "sleep running in %s", name)
	removeStaleNamespaces()
	if exists(name) {
		t.Fatalf("stale namespace %s not removed", name)
	}
	select {
	case err := <-exited:
		if err == nil {
			t.Fatal("the process in the stale namespace exited by itself")
		}
	case <-time.After(wait):
		t.Fatal("the process in the stale namespace still runs")
	}
}

func exists(ns string) bool {
	_, err := os.Stat("/run/netns/" + ns)
	return err == nil
}

// TestNetnsPause stops a node with SIGSTOP: a request to it ends at its
// deadline; after SIGCONT the same connection serves again. (Pause
// waits until every thread is stopped: without that wait this request,
// sent at once, was once served by the process still finishing its
// stop.)
func TestNetnsPause(t *testing.T) {
	c := New(t, Options{Nodes: 1, Mode: ModeNetns})
	ctx := testutil.Context(t, wait)
	conn := dialNode(t, c, 0, 0)
	ex, err := conn.ReqResp(ctx, "pause", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
		t.Fatal(err)
	}
	f, err := c.Inject(Pause{Node: 0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = ex.Request(rctx, courier.Message{Body: []byte("x")})
	cancel()
	if !errors.Is(err, courier.ErrTimeout) {
		t.Fatalf("request to a stopped node: %v, want a timeout", err)
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForf(t, wait, func() bool {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := ex.Request(rctx, courier.Message{Body: []byte("y")})
		return err == nil
	}, "requests served after SIGCONT")
}

// TestNetnsFlap checks that Flap cuts and heals in turn until healed.
func TestNetnsFlap(t *testing.T) {
	c := Create(t, Options{Nodes: 3, Mode: ModeNetns})
	f, err := c.Inject(Flap{Period: 100 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sawCut, sawHealed := false, false
	testutil.WaitForf(t, wait, func() bool {
		c.mu.Lock()
		n := len(c.cut)
		c.mu.Unlock()
		sawCut = sawCut || n > 0
		sawHealed = sawHealed || (sawCut && n == 0)
		return sawCut && sawHealed
	}, "a cut, then healed")
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cut) != 0 {
		t.Fatalf("still cut after healing: %v", c.cut)
	}
	// The routes are gone too: each namespace's table has no blackhole.
	for i := range c.Nodes() {
		out, err := exec.Command("ip", "-n", c.netns.nodes[i], "route", "show", "type", "blackhole").CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Fatalf("n%d routes after healing: %q %v", i+1, out, err)
		}
	}
}

// TestRegistryCheckerOnRealRestart runs the registry checker on what a
// real server does across kill -9: a durable exchange is still there
// after the restart (linearizable), a transient one is gone, which the
// checker must flag, since the server answered its declare.
func TestRegistryCheckerOnRealRestart(t *testing.T) {
	c := New(t, Options{Nodes: 1, Mode: ModeNetns})
	h := c.History()
	ctx := testutil.Context(t, wait)
	op := func(conn *courier.Conn, kind RegistryKind, name string, opts ...courier.ExchangeOption) {
		t.Helper()
		o := RegistryOp{Kind: kind, Name: name, Call: h.Now()}
		var err error
		switch kind {
		case Declare:
			_, err = conn.PubSub(ctx, name, opts...)
			o.Outcome = outcome(err, OutcomeOK)
		case Get:
			_, err = conn.Declare(ctx, name, courier.ExchangeSpec{Passive: true})
			o.Outcome = outcome(err, OutcomeExists)
		}
		o.Return = h.Now()
		if o.Outcome == OutcomeUnknown || o.Outcome == OutcomeFailed {
			t.Fatalf("%s %s: %v", kind, name, err)
		}
		h.AddRegistry(o)
	}
	conn := dialNode(t, c, 0, 0)
	op(conn, Declare, "durable")
	op(conn, Declare, "transient", courier.Transient())
	op(conn, Get, "durable")
	op(conn, Get, "transient")
	f, err := c.Inject(Kill{Node: 0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	conn = dialNode(t, c, 0, 0)
	op(conn, Get, "durable")
	op(conn, Get, "transient")
	r := CheckRegistry(h.Snapshot(), 10*time.Second)
	if r.Count != 1 || !strings.Contains(r.Violations[0], `"transient"`) {
		t.Fatalf("want the transient exchange alone flagged: %v (%s)", r.Violations, r.Checked)
	}
}
