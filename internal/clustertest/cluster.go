//go:build linux

package clustertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Mode says how a cluster's nodes are networked.
type Mode string

// The modes.
const (
	// ModeNetns runs each node in its own network namespace; faults are
	// made by the kernel (routes, netem). Needs root and `ip`.
	ModeNetns Mode = "netns"
	// ModeProxy runs every node on 127.0.0.1 with a [Proxy] in front of
	// its cluster port; faults are made by the proxies.
	ModeProxy Mode = "proxy"
)

// EnvMode forces a mode: COURIER_CHAOS_MODE=proxy runs the fallback even
// as root; =netns fails rather than falls back when namespaces cannot
// be made.
const EnvMode = "COURIER_CHAOS_MODE"

// Options configure a [Cluster].
type Options struct {
	// Nodes is the number of nodes. Default: 3.
	Nodes int
	// Mode forces a mode; "" chooses netns where the machine allows it
	// and proxy elsewhere ([EnvMode] overrides both).
	Mode Mode
	// Cluster makes the nodes one cluster: each gets --node, --cluster,
	// --join (the other nodes) and --cluster-secret-file, and in proxy
	// mode AdvertiseFlag with its proxy's address. Without it every node
	// is a single-node server (as before the cluster lands). Default:
	// false.
	Cluster bool
	// AdvertiseFlag is the flag that tells a node the cluster address to
	// advertise, in proxy mode. Default: --cluster-advertise.
	AdvertiseFlag string
	// Args are more flags for every node.
	Args []string
	// Seed seeds the faults' randomness (proxy losses). Default: 1.
	Seed uint64
	// KeepLogs, if set, is a directory the nodes' logs are copied into
	// (as <node>.log) when the cluster closes; otherwise they go with the
	// test's temporary directory.
	KeepLogs string
}

// Cluster is a set of `courier server` processes under test.
type Cluster struct {
	t       testing.TB
	opts    Options
	mode    Mode
	bin     string
	dir     string
	secret  string // admin password and cluster secret
	hist    *History
	nodes   []*Node
	netns   *netnsNet
	faults  *Faults
	proxies []*Proxy

	mu  sync.Mutex // guards cut
	cut map[[2]int]bool
}

// Node is one `courier server` process of a cluster; it keeps its data
// directory across restarts.
type Node struct {
	c     *Cluster
	Index int
	// Name is the node's name: n1, n2, ...
	Name string
	// Dir is the data directory.
	Dir string
	// IP is the node's address (127.0.0.1 in proxy mode).
	IP string
	// ClientAddr is the client listener's host:port.
	ClientAddr string
	// HTTPAddr is the management listener's host:port.
	HTTPAddr string
	// ClusterAddr is the address other nodes reach the node's cluster
	// port at: the node's own in netns mode, its proxy's in proxy mode.
	ClusterAddr string
	// clusterListen is the node's own cluster listener.
	clusterListen string

	mu     sync.Mutex // guards proc, log, starts
	proc   *proc
	log    *os.File
	starts int
}

// proc is one run of a node.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// AdminUser is the administrator every node of a namespace cluster has:
// its clients authenticate as they would in production.
const AdminUser = "chaos"

// New starts a cluster of opts.Nodes courier servers and waits until
// each accepts clients. Everything is removed when the test ends:
// processes killed, namespaces deleted. Tests that cannot have the mode
// they need are skipped with the reason.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c := Create(t, opts)
	for _, n := range c.nodes {
		n.Start()
	}
	return c
}

// Create makes the cluster's network and directories without starting
// a node; start them with [Node.Start].
func Create(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Nodes <= 0 {
		opts.Nodes = 3
	}
	if opts.AdvertiseFlag == "" {
		opts.AdvertiseFlag = "--cluster-advertise"
	}
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	mode, why := chooseMode(opts.Mode)
	if mode == "" {
		t.Skipf("clustertest: mode %s unavailable: %s", opts.Mode, why)
	}
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, opts: opts, mode: mode, bin: bin, dir: t.TempDir(), hist: NewHistory(), cut: map[[2]int]bool{}}
	c.secret = randomHex(16)
	if err := os.WriteFile(c.secretFile(), []byte(c.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if err := c.makeNetwork(); err != nil {
		t.Fatalf("clustertest: %s network: %v", mode, err)
	}
	t.Logf("clustertest: %d nodes, mode %s", opts.Nodes, mode)
	return c
}

// chooseMode picks the mode, or "" with the reason a test that demands
// one cannot have it. [EnvMode] sets the mode of clusters that ask for
// none, and skips those that ask for another.
func chooseMode(want Mode) (Mode, string) {
	if env := Mode(os.Getenv(EnvMode)); env != "" {
		switch {
		case want == "":
			want = env
		case want != env:
			return "", fmt.Sprintf("%s=%s", EnvMode, env)
		}
	}
	ok, why := netnsAvailable()
	switch {
	case want == ModeProxy:
		return ModeProxy, ""
	case want == ModeNetns && !ok:
		return "", why
	case ok:
		return ModeNetns, ""
	}
	return ModeProxy, ""
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (c *Cluster) secretFile() string { return filepath.Join(c.dir, "cluster-secret") }

// makeNetwork makes the namespaces or the proxies, and the nodes.
func (c *Cluster) makeNetwork() error {
	n := c.opts.Nodes
	if c.mode == ModeNetns {
		w, err := newNetnsNet(n)
		if err != nil {
			return err
		}
		c.netns = w
	}
	// Without the kernel's netem, delay and loss on the cluster ports
	// come from proxies, in the node namespaces in netns mode.
	proxied := c.mode == ModeProxy || netemAvailable() != nil
	if proxied {
		c.faults = NewFaults(c.opts.Seed)
	}
	for i := range n {
		node := &Node{c: c, Index: i, Name: "n" + strconv.Itoa(i+1), Dir: filepath.Join(c.dir, fmt.Sprintf("n%d", i+1))}
		if err := os.MkdirAll(node.Dir, 0o700); err != nil {
			return err
		}
		if c.mode == ModeNetns {
			node.IP = c.netns.ip(i)
			node.ClientAddr = node.IP + ":7400"
			node.HTTPAddr = node.IP + ":7480"
			node.clusterListen = node.IP + ":7500"
			node.ClusterAddr = node.clusterListen
			if proxied {
				p, err := c.newNetnsProxy(i, node.IP)
				if err != nil {
					return err
				}
				node.ClusterAddr = p.Addr()
			}
		} else {
			node.IP = "127.0.0.1"
			ports, err := freePorts(3)
			if err != nil {
				return err
			}
			node.ClientAddr = "127.0.0.1:" + strconv.Itoa(ports[0])
			node.clusterListen = "127.0.0.1:" + strconv.Itoa(ports[1])
			node.HTTPAddr = "127.0.0.1:" + strconv.Itoa(ports[2])
			p, err := c.newProxy(i, node.clusterListen)
			if err != nil {
				return err
			}
			node.ClusterAddr = p.Addr()
		}
		c.nodes = append(c.nodes, node)
	}
	// The proxies serve once the nodes and proxies they look up are all
	// made: those slices do not change after this.
	for _, p := range c.proxies {
		p.serve()
	}
	return nil
}

// newProxy starts the proxy in front of node i's cluster port.
func (c *Cluster) newProxy(i int, target string) (*Proxy, error) {
	ln, udp, err := listenProxy()
	if err != nil {
		return nil, err
	}
	p := &Proxy{index: i, target: target, faults: c.faults, ln: ln, udp: udp,
		owner: c.ownerOf, udpSrc: c.nodeOfUDP, nodes: func() int { return c.opts.Nodes }}
	c.proxies = append(c.proxies, p)
	return p, nil
}

// netnsProxyPort is the port of a node's cluster proxy in netns mode,
// next to its cluster port 7500.
const netnsProxyPort = 7501

// newNetnsProxy starts a proxy in node i's namespace, on ip:7501, in
// front of its cluster port ip:7500: for delay and loss where the kernel
// has no netem. Partitions stay routes.
func (c *Cluster) newNetnsProxy(i int, ip string) (*Proxy, error) {
	var ln *net.TCPListener
	var udp *net.UDPConn
	if err := c.netns.inNode(i, func() error {
		var err error
		ln, udp, err = listenProxyAt(ip, netnsProxyPort)
		return err
	}); err != nil {
		return nil, err
	}
	byIP := func(a net.IP) int {
		s := a.String()
		if !strings.HasPrefix(s, nsSubnet) {
			return -1
		}
		k, err := strconv.Atoi(strings.TrimPrefix(s, nsSubnet))
		if err != nil || k < 1 || k > c.opts.Nodes {
			return -1
		}
		return k - 1
	}
	p := &Proxy{index: i, target: ip + ":7500", faults: c.faults, ln: ln, udp: udp,
		owner:  func(a, _ *net.TCPAddr) int { return byIP(a.IP) },
		udpSrc: func(a *net.UDPAddr) int { return byIP(a.IP) },
		nodes:  func() int { return c.opts.Nodes },
		dialUp: func(network, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return c.netns.dial(ctx, i, network, addr)
		}}
	c.proxies = append(c.proxies, p)
	return p, nil
}

// ownerOf is the index of the node whose process owns the TCP socket
// connected from peer to the proxy listening on proxy, or -1. It looks
// the socket up by its addresses (sockInode: one kernel lookup), then
// among the nodes' open files.
func (c *Cluster) ownerOf(peer, proxy *net.TCPAddr) int {
	inode := sockInode(peer, proxy)
	if inode == 0 {
		return -1
	}
	for _, n := range c.nodes {
		if pid := n.Pid(); pid > 0 && pidHasSocket(pid, inode) {
			return n.Index
		}
	}
	return -1
}

// nodeOfUDP is the index of the node whose cluster port sent a
// datagram from peer (a node sends from its cluster port).
func (c *Cluster) nodeOfUDP(peer *net.UDPAddr) int {
	for _, n := range c.nodes {
		if strings.HasSuffix(n.clusterListen, ":"+strconv.Itoa(peer.Port)) {
			return n.Index
		}
	}
	return -1
}

// freePorts returns n ports free on 127.0.0.1 for both TCP and UDP.
func freePorts(n int) ([]int, error) {
	var ports []int
	for len(ports) < n {
		ln, udp, err := listenProxy()
		if err != nil {
			return nil, err
		}
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		udp.Close()
	}
	return ports, nil
}

// Mode is the cluster's mode.
func (c *Cluster) Mode() Mode { return c.mode }

// History is where the cluster's nemeses record their faults, and where
// the scenario's clients record what they see.
func (c *Cluster) History() *History { return c.hist }

// Nodes are the cluster's nodes, in index order.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns node i.
func (c *Cluster) Node(i int) *Node { return c.nodes[i] }

// Password is the administrator's password ([AdminUser]) in netns mode.
func (c *Cluster) Password() string { return c.secret }

// args are the flags of node n.
func (c *Cluster) args(n *Node) []string {
	a := []string{"server", "--listen", n.ClientAddr, "--data", n.Dir, "--http", n.HTTPAddr, "--log-level", "info"}
	if c.opts.Cluster {
		var join []string
		for _, m := range c.nodes {
			if m != n {
				join = append(join, m.ClusterAddr)
			}
		}
		a = append(a, "--node", n.Name, "--cluster", n.clusterListen, "--join", strings.Join(join, ","),
			"--cluster-secret-file", c.secretFile())
		if c.mode == ModeProxy {
			a = append(a, c.opts.AdvertiseFlag, n.ClusterAddr)
		}
	} else {
		a = append(a, "--name", n.Name)
	}
	return append(a, c.opts.Args...)
}

// Close kills every node and removes the network. It is safe to call
// more than once; New registers it with t.Cleanup.
func (c *Cluster) Close() {
	for _, n := range c.nodes {
		n.kill()
	}
	for _, p := range c.proxies {
		p.Close()
	}
	c.proxies = nil
	if c.netns != nil {
		c.netns.close()
		c.netns = nil
	}
	for _, n := range c.nodes {
		n.mu.Lock()
		if n.log != nil {
			n.log.Close()
			n.log = nil
		}
		n.mu.Unlock()
		if c.opts.KeepLogs != "" {
			if b, err := os.ReadFile(filepath.Join(c.dir, n.Name+".log")); err == nil {
				os.MkdirAll(c.opts.KeepLogs, 0o755)
				os.WriteFile(filepath.Join(c.opts.KeepLogs, n.Name+".log"), b, 0o644)
			}
		}
	}
}

// InNode runs f with node i's network: in netns mode on a thread inside
// the node's namespace, so that the sockets f opens (a client.Dial) live
// there; in proxy mode as it is. Goroutines f starts are not in the
// namespace: anything that dials later (a reconnecting client) must dial
// through [Cluster.DialContext].
func (c *Cluster) InNode(i int, f func() error) error {
	if c.netns == nil {
		return f()
	}
	return c.netns.inNode(i, f)
}

// DialContext connects from node i's network to addr.
func (c *Cluster) DialContext(ctx context.Context, i int, network, addr string) (net.Conn, error) {
	if c.netns == nil {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	return c.netns.dial(ctx, i, network, addr)
}

// Command returns a command that runs the courier binary with args in
// node i's network (its namespace in netns mode): for clients that must
// dial again on their own, such as `courier sub --url a,b,c`, which a
// thread of the test process cannot keep inside a namespace.
func (c *Cluster) Command(i int, args ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if c.netns != nil {
		cmd = c.netns.command(i, c.bin, args...)
	} else {
		cmd = exec.Command(c.bin, args...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// ClientURL is the URL a client uses for node n, with the
// administrator's credentials in netns mode.
func (n *Node) ClientURL() string {
	if n.c.mode == ModeNetns {
		return fmt.Sprintf("courier://%s:%s@%s", AdminUser, n.c.secret, n.ClientAddr)
	}
	return "courier://" + n.ClientAddr
}

// Start starts the node's process on its data directory and waits until
// it accepts connections; it fails the test if it does not within 30s.
// Call it from the test's goroutine; elsewhere use [Node.StartErr].
func (n *Node) Start() {
	n.c.t.Helper()
	if err := n.StartErr(); err != nil {
		n.c.t.Fatal(err)
	}
}

// Incarnation counts the node's starts: 1 for its first run.
func (n *Node) Incarnation() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.starts
}

// StartErr is [Node.Start] returning its error.
func (n *Node) StartErr() error {
	c := n.c
	n.mu.Lock()
	if n.proc != nil {
		n.mu.Unlock()
		return fmt.Errorf("clustertest: %s already running", n.Name)
	}
	if n.log == nil {
		f, err := os.OpenFile(filepath.Join(c.dir, n.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			n.mu.Unlock()
			return err
		}
		n.log = f
	}
	args := c.args(n)
	var cmd *exec.Cmd
	if c.netns != nil {
		cmd = c.netns.command(n.Index, c.bin, args...)
	} else {
		cmd = exec.Command(c.bin, args...)
	}
	cmd.Stdout, cmd.Stderr = n.log, n.log
	// GOTRACEBACK=all: a SIGQUIT ([Node.Dump]) prints every goroutine.
	cmd.Env = append(os.Environ(), "COURIER_ADMIN_USER=", "COURIER_ADMIN_PASSWORD=", "GOTRACEBACK=all")
	if c.mode == ModeNetns {
		cmd.Env = append(cmd.Env, "COURIER_ADMIN_USER="+AdminUser, "COURIER_ADMIN_PASSWORD="+c.secret)
	}
	// The node dies with the test process, whatever kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	fmt.Fprintf(n.log, "--- clustertest: start at %s: %s\n", ms(c.hist.Now()), strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		n.mu.Unlock()
		return fmt.Errorf("clustertest: start %s: %w", n.Name, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	n.proc = p
	n.starts++
	n.mu.Unlock()
	if err := n.WaitReady(30 * time.Second); err != nil {
		return fmt.Errorf("clustertest: %w\n%s", err, n.LogTail(4096))
	}
	return nil
}

// WaitReady waits until the node accepts TCP connections on its client
// port, dialing from its own network.
func (n *Node) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if !n.Running() {
			return fmt.Errorf("%s exited before accepting connections", n.Name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := n.c.DialContext(ctx, n.Index, "tcp", n.ClientAddr)
		cancel()
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not accepting on %s within %v: %w", n.Name, n.ClientAddr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Running reports whether the node's process runs (stopped counts).
func (n *Node) Running() bool {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Pid is the node's process id, or 0 when it does not run.
func (n *Node) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		return 0
	}
	return n.proc.cmd.Process.Pid
}

// Signal sends sig to the node's process.
func (n *Node) Signal(sig syscall.Signal) error {
	pid := n.Pid()
	if pid == 0 {
		return fmt.Errorf("%w: %s", ErrNotRunning, n.Name)
	}
	return syscall.Kill(pid, sig)
}

// Kill kills the node with SIGKILL and waits until it is gone.
func (n *Node) Kill() error {
	if n.Pid() == 0 {
		return fmt.Errorf("%w: %s", ErrNotRunning, n.Name)
	}
	n.kill()
	return nil
}

// kill kills the process if it runs and forgets it.
func (n *Node) kill() {
	n.mu.Lock()
	p := n.proc
	n.proc = nil
	n.mu.Unlock()
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies as well, but reap it promptly
	p.cmd.Process.Kill()
	<-p.done
}

// Dump asks the node for a goroutine dump (SIGQUIT: the Go runtime
// prints every goroutine's stack to the node's log and exits), waits at
// most 10 s for it to exit and returns the dump, for a test to show why
// a node stopped answering. The node is not running afterwards; Start
// brings it back.
func (n *Node) Dump() string {
	n.mu.Lock()
	p := n.proc
	n.proc = nil
	n.mu.Unlock()
	if p == nil {
		return ""
	}
	p.cmd.Process.Signal(syscall.SIGCONT)
	p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	log := n.LogTail(4 << 20)
	if i := strings.LastIndex(log, "SIGQUIT"); i >= 0 {
		return log[i:]
	}
	return "(no goroutine dump in the log)"
}

// Restart kills the node if it runs and starts it again on the same
// data directory.
func (n *Node) Restart() {
	n.c.t.Helper()
	n.kill()
	n.Start()
}

// LogTail is the end of the node's log, at most max bytes.
func (n *Node) LogTail(max int) string {
	b, err := os.ReadFile(filepath.Join(n.c.dir, n.Name+".log"))
	if err != nil {
		return ""
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// setCut makes cut the set of node pairs cut now, both directions
// listed.
func (c *Cluster) setCut(cut map[[2]int]bool) error {
	c.mu.Lock()
	c.cut = cut
	c.mu.Unlock()
	if c.netns != nil {
		return c.netns.setCut(cut)
	}
	c.faults.SetCut(cut)
	return nil
}

// Partition cuts every pair of nodes that are in different groups;
// nodes in no group are cut from everyone. Partition(nil) heals.
func (c *Cluster) Partition(groups ...[]int) error {
	return c.setCut(partitionCuts(len(c.nodes), groups))
}

// Cut cuts exactly the given pairs of nodes (both directions) and heals
// every other; for shapes groups cannot say, such as a bridge.
func (c *Cluster) Cut(pairs ...[2]int) error {
	cut := map[[2]int]bool{}
	for _, p := range pairs {
		cut[p], cut[[2]int{p[1], p[0]}] = true, true
	}
	return c.setCut(cut)
}

// Heal removes every cut.
func (c *Cluster) Heal() error { return c.setCut(map[[2]int]bool{}) }

// partitionCuts is the cut set of groups among n nodes.
func partitionCuts(n int, groups [][]int) map[[2]int]bool {
	group := make([]int, n)
	for i := range group {
		group[i] = -1 - i // alone
	}
	for g, members := range groups {
		for _, m := range members {
			group[m] = g
		}
	}
	cut := map[[2]int]bool{}
	if len(groups) == 0 {
		return cut
	}
	for a := range n {
		for b := range n {
			if a != b && group[a] != group[b] {
				cut[[2]int{a, b}] = true
			}
		}
	}
	return cut
}

// Netem sets delay and loss (0..1) on node i's link; both 0 clear them.
// In netns mode this is tc netem on the node's veth, which delays all
// its traffic; where the kernel has no netem, and in proxy mode, the
// cluster proxies delay and drop the traffic of cluster ports only.
func (c *Cluster) Netem(i int, delay time.Duration, loss float64) error {
	if c.faults == nil {
		return c.netns.netem(i, delay, loss)
	}
	c.faults.SetNetem(i, delay, loss)
	return nil
}

// NetemByProxy reports whether delay and loss come from the cluster
// proxies rather than the kernel's netem.
func (c *Cluster) NetemByProxy() bool { return c.faults != nil }
