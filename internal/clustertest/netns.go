//go:build linux

package clustertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// nsPrefix starts the name of every namespace this package makes:
// cct-<pid>-<cluster>-<role>. The pid lets a later run find and remove
// the namespaces of a test process that died without cleaning up.
const nsPrefix = "cct-"

// nsSubnet is the nodes' subnet: loopback addresses, carried between
// the node namespaces over their veths (route_localnet, set in each node
// namespace only). A dial that strays into the root namespace, such as a
// client reconnecting from a thread outside every node namespace, then
// reaches the root namespace's own loopback and never leaves the
// machine. Each cluster has its own switch, so clusters of one or many
// test processes never see each other.
const nsSubnet = "127.77.0."

// netnsAvailable reports whether this process can make network
// namespaces, and if not, why.
func netnsAvailable() (bool, string) {
	if os.Geteuid() != 0 {
		return false, "not root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return false, "no ip command (iproute2)"
	}
	return true, ""
}

// ipCmd runs `ip args...` and returns its error with its output.
func ipCmd(args ...string) error { return run("ip", args...) }

// run runs a command and returns its error with its output.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

var (
	staleOnce sync.Once
	nsSeq     struct {
		sync.Mutex
		n int
	}
)

// removeStaleNamespaces deletes the namespaces, and kills the processes
// in them, of test processes that are gone (a panic, a kill -9 of the
// test binary).
func removeStaleNamespaces() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if !strings.HasPrefix(name, nsPrefix) {
			continue
		}
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(name, nsPrefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		deleteNamespace(name)
	}
}

// processAlive reports whether pid is a live process.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// deleteNamespace kills what runs in the namespace and deletes it.
func deleteNamespace(name string) {
	if out, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	ipCmd("netns", "del", name)
}

// netnsNet is a switch namespace with a bridge, and one namespace per
// node linked to it by a veth pair (eth0 in the node, p<i> on the
// bridge). Partitions are blackhole routes in the node namespaces; delay
// and loss are netem on the node's eth0.
type netnsNet struct {
	prefix string
	sw     string
	nodes  []string   // namespace names
	fds    []*os.File // open namespace files, for setns

	mu  sync.Mutex // guards cut
	cut map[[2]int]bool
}

// newNetnsNet makes the namespaces of n nodes.
func newNetnsNet(n int) (_ *netnsNet, err error) {
	staleOnce.Do(removeStaleNamespaces)
	nsSeq.Lock()
	nsSeq.n++
	seq := nsSeq.n
	nsSeq.Unlock()
	w := &netnsNet{prefix: fmt.Sprintf("%s%d-%d-", nsPrefix, os.Getpid(), seq), cut: map[[2]int]bool{}}
	w.sw = w.prefix + "sw"
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	steps := [][]string{
		{"netns", "add", w.sw},
		{"-n", w.sw, "link", "set", "lo", "up"},
		{"-n", w.sw, "link", "add", "br0", "type", "bridge"},
		{"-n", w.sw, "link", "set", "br0", "up"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return nil, err
		}
	}
	for i := range n {
		ns := fmt.Sprintf("%sn%d", w.prefix, i+1)
		w.nodes = append(w.nodes, ns)
		if err := ipCmd("netns", "add", ns); err != nil {
			return nil, err
		}
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			return nil, fmt.Errorf("open namespace %s: %w", ns, err)
		}
		w.fds = append(w.fds, f)
		port := fmt.Sprintf("p%d", i+1)
		steps := [][]string{
			// The namespace's loopback keeps 127.0.0.1 alone, so that
			// the rest of 127/8 can be the subnet on eth0.
			{"-n", ns, "link", "set", "lo", "up"},
			{"-n", ns, "addr", "del", "127.0.0.1/8", "dev", "lo"},
			{"-n", ns, "addr", "add", "127.0.0.1/32", "dev", "lo"},
			{"-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", w.sw},
			{"-n", ns, "addr", "add", w.ip(i) + "/24", "dev", "eth0"},
			{"-n", w.sw, "link", "set", port, "master", "br0"},
			{"-n", w.sw, "link", "set", port, "up"},
		}
		for _, s := range steps {
			if err := ipCmd(s...); err != nil {
				return nil, err
			}
		}
		if err := w.inNode(i, routeLocalnet); err != nil {
			return nil, fmt.Errorf("namespace %s: %w", ns, err)
		}
		if err := ipCmd("-n", ns, "link", "set", "eth0", "up"); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// routeLocalnet lets the calling thread's network namespace route
// loopback addresses on its other interfaces. /proc/sys/net is that of
// the thread that opens it.
func routeLocalnet() error {
	for _, dev := range []string{"all", "eth0"} {
		if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+dev+"/route_localnet", []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("route_localnet: %w", err)
		}
	}
	return nil
}

// ip is node i's address.
func (w *netnsNet) ip(i int) string { return nsSubnet + strconv.Itoa(i+1) }

// command runs name args in node i's namespace.
func (w *netnsNet) command(i int, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", w.nodes[i], name}, args...)...)
}

// inNode runs f on a thread that has entered node i's namespace: the
// sockets f opens live there, and stay there whichever thread uses them
// later. Goroutines that f starts do not run in the namespace.
func (w *netnsNet) inNode(i int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// The thread returns to the scheduler only if it is back in its
		// own namespace; otherwise it ends with this goroutine.
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			errc <- fmt.Errorf("open own namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(w.fds[i].Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter namespace %s: %w", w.nodes[i], err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// dial connects from node i's namespace.
func (w *netnsNet) dial(ctx context.Context, i int, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := w.inNode(i, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// setCut makes the cut pairs exactly cut: a blackhole route to the
// other's address in each node of a cut pair.
func (w *netnsNet) setCut(cut map[[2]int]bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	for p := range w.cut {
		if !cut[p] {
			errs = append(errs, ipCmd("-n", w.nodes[p[0]], "route", "del", "blackhole", w.ip(p[1])+"/32"))
		}
	}
	for p := range cut {
		if !w.cut[p] {
			errs = append(errs, ipCmd("-n", w.nodes[p[0]], "route", "replace", "blackhole", w.ip(p[1])+"/32"))
		}
	}
	w.cut = cut
	return errors.Join(errs...)
}

var netemProbe struct {
	once sync.Once
	err  error
}

// netemAvailable reports, by trying it once in a scratch namespace,
// whether the kernel has the netem qdisc (sch_netem); some (minimal VM
// kernels) do not.
func netemAvailable() error {
	netemProbe.once.Do(func() {
		if _, err := exec.LookPath("tc"); err != nil {
			netemProbe.err = fmt.Errorf("%w: no tc command", ErrNoNetem)
			return
		}
		ns := fmt.Sprintf("%s%d-probe", nsPrefix, os.Getpid())
		if err := ipCmd("netns", "add", ns); err != nil {
			netemProbe.err = err
			return
		}
		defer deleteNamespace(ns)
		if err := run("tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"); err != nil {
			netemProbe.err = fmt.Errorf("%w: %v", ErrNoNetem, err)
		}
	})
	return netemProbe.err
}

// netem sets delay and loss on node i's egress; both 0 clear them.
func (w *netnsNet) netem(i int, delay time.Duration, loss float64) error {
	if err := netemAvailable(); err != nil {
		return err
	}
	if delay == 0 && loss == 0 {
		err := run("tc", "-n", w.nodes[i], "qdisc", "del", "dev", "eth0", "root")
		if err != nil && strings.Contains(err.Error(), "No such file") {
			return nil // nothing set
		}
		return err
	}
	args := []string{"-n", w.nodes[i], "qdisc", "replace", "dev", "eth0", "root", "netem"}
	if delay > 0 {
		args = append(args, "delay", fmt.Sprintf("%dus", delay.Microseconds()))
	}
	if loss > 0 {
		args = append(args, "loss", fmt.Sprintf("%g%%", loss*100))
	}
	return run("tc", args...)
}

// close deletes every namespace, killing what still runs in them.
func (w *netnsNet) close() error {
	for _, f := range w.fds {
		f.Close()
	}
	for _, ns := range w.nodes {
		deleteNamespace(ns)
	}
	if w.sw != "" {
		deleteNamespace(w.sw)
	}
	return nil
}
