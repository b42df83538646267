//go:build linux

package clustertest

import (
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
