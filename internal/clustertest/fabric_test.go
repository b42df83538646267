//go:build linux

package clustertest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// needCluster skips a test when the courier binary cannot form a cluster
// yet (no --join flag).
func needCluster(t *testing.T) {
	t.Helper()
	ok, err := binaryClusters()
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Skip("this courier has no cluster (no --join); set " + EnvBinary + " to a build that has")
	}
}

// TestClusterFormsAndSeesPartitions starts a 3-node cluster, waits until
// every node sees three alive, isolates one and waits until the other
// two see it gone, and heals; then kills one with SIGKILL, waits until
// the others see it gone, and restarts it on its data directory. In netns mode and in proxy mode, where
// gossip (UDP) and links (TCP) both pass the proxies.
func TestClusterFormsAndSeesPartitions(t *testing.T) {
	needCluster(t)
	for _, mode := range []Mode{ModeNetns, ModeProxy} {
		t.Run(string(mode), func(t *testing.T) {
			c := New(t, Options{Nodes: 3, Mode: mode, Cluster: true})
			all := func(v []NodeView) bool { return len(v) == 3 && alive(v) == 3 }
			for _, n := range c.Nodes() {
				if _, err := n.WaitView(wait, all); err != nil {
					t.Fatalf("%v\n%s", err, n.LogTail(2000))
				}
			}
			f, err := c.Inject(Isolate{Node: 0}, nil)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for _, n := range c.Nodes()[1:] {
				if _, err := n.WaitView(wait, func(v []NodeView) bool { return alive(v) == 2 }); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("isolated n1 seen gone by n2 and n3 after %v", time.Since(start))
			if err := f.Heal(); err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			for _, n := range c.Nodes() {
				if _, err := n.WaitView(wait, all); err != nil {
					t.Fatalf("after healing: %v", err)
				}
			}
			t.Logf("healed: all alive again after %v", time.Since(start))

			f, err = c.Inject(Kill{Node: 1}, nil)
			if err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			for _, i := range []int{0, 2} {
				if _, err := c.Node(i).WaitView(wait, func(v []NodeView) bool { return alive(v) == 2 }); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("kill -9 of n2 seen by n1 and n3 after %v", time.Since(start))
			if err := f.Heal(); err != nil {
				t.Fatal(err)
			}
			for _, n := range c.Nodes() {
				if _, err := n.WaitView(wait, all); err != nil {
					t.Fatalf("after the restart: %v\n%s", err, n.LogTail(4000))
				}
			}
		})
	}
}

// EnvRestarts runs [TestRestartRejoins] with that many restarts.
const EnvRestarts = "COURIER_RESTARTS"

// TestRestartRejoins kills -9 a node of a 3-node cluster (proxy mode)
// and starts it again at once on its data directory, under the same
// name, COURIER_RESTARTS times (3 by default), and checks each time that
// every node sees all three alive again, linked to the restarted one
// since the restart, within rejoinWait. A node that
// does not is asked for a goroutine dump (SIGQUIT), which the failure
// shows.
func TestRestartRejoins(t *testing.T) {
	needCluster(t)
	restarts := 3
	if s := os.Getenv(EnvRestarts); s != "" {
		restarts, _ = strconv.Atoi(s)
	}
	c := New(t, Options{Nodes: 3, Mode: ModeProxy, Cluster: true})
	all := func(v []NodeView) bool { return len(v) == 3 && alive(v) == 3 }
	waitWhole(t, c, all, "at the start")
	rng := rand.New(rand.NewPCG(uint64(restarts), 2))
	var took []time.Duration
	for k := range restarts {
		i := rng.IntN(3)
		start := time.Now()
		c.Node(i).Restart()
		waitWhole(t, c, relinked(c.Node(i).Name, start), fmt.Sprintf("after restart %d (of %s)", k, c.Node(i).Name))
		took = append(took, time.Since(start))
	}
	t.Logf("%d restarts: whole again after %s", restarts, percentiles(took))
}

// relinked accepts a view of three alive nodes whose links are all up,
// those to node name up since at least start: the node came back, not
// merely was not missed.
func relinked(name string, start time.Time) func([]NodeView) bool {
	return func(v []NodeView) bool {
		if len(v) != 3 || alive(v) != 3 {
			return false
		}
		for _, row := range v {
			for _, l := range row.Links {
				if !l.Up || (row.Name == name || l.Peer == name) && l.Since < start.UnixMilli() {
					return false
				}
			}
		}
		return true
	}
}

// rejoinWait is how long a restarted node may take to be seen alive by
// every node, and to see every node alive: memberlist's probes and the
// join loop take a few seconds; the machine is loaded.
const rejoinWait = 30 * time.Second

// waitWhole waits until every node's view satisfies ok; else it fails
// the test with the views and a goroutine dump of each node that did
// not get there.
func waitWhole(t *testing.T, c *Cluster, ok func([]NodeView) bool, when string) {
	t.Helper()
	var bad []int
	var errs []string
	for i, n := range c.Nodes() {
		if _, err := n.WaitView(rejoinWait, ok); err != nil {
			bad = append(bad, i)
			errs = append(errs, err.Error())
		}
	}
	if len(bad) == 0 {
		return
	}
	var b strings.Builder
	for _, i := range bad {
		n := c.Node(i)
		fmt.Fprintf(&b, "\n--- %s: log before the dump:\n%s\n--- %s: goroutines:\n%s", n.Name, timelineFrom(n.LogTail(64<<10)), n.Name, n.Dump())
	}
	t.Fatalf("%s: the cluster is not whole: %s%s", when, strings.Join(errs, "; "), b.String())
}

// timelineFrom drops the per-exchange lines of a node's log.
func timelineFrom(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg="exchange re-homed"`) {
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}
