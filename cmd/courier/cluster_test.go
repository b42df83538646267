package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

// clusterNode is a `courier server` process of a test cluster.
type clusterNode struct {
	name, cluster, http string
	proc                *cliProc
}

// startCluster runs three `courier server` processes that form one
// cluster on loopback, with the secret from COURIER_CLUSTER_SECRET, and
// waits until each lists the three alive. extra are more flags of each
// server.
func startCluster(t *testing.T, extra ...string) []*clusterNode {
	t.Helper()
	nodes := make([]*clusterNode, 3)
	var seeds []string
	for i, name := range []string{"a", "b", "c"} {
		nodes[i] = &clusterNode{name: name, cluster: "127.0.0.1:" + cliFreeClusterPort(t), http: "127.0.0.1:" + cliFreePort(t)}
		seeds = append(seeds, nodes[i].cluster)
	}
	env := []string{"COURIER_CLUSTER_SECRET=test cluster secret, 32 bytes!"}
	for _, n := range nodes {
		args := []string{"server", "--node", n.name, "--listen", "127.0.0.1:" + cliFreePort(t), "--http", n.http,
			"--data", t.TempDir(), "--cluster", n.cluster, "--join", strings.Join(seeds, ","), "--log-level", "info"}
		n.proc = cliStart(t, "", env, append(args, extra...)...)
	}
	for _, n := range nodes {
		ok := testutil.Eventually(cliWait, func() bool {
			st := nodeStates(n)
			return st["a"] == "alive" && st["b"] == "alive" && st["c"] == "alive" && linksUp(n) == 2
		})
		if !ok {
			// Every node's log: the one that is missing tells why.
			var logs strings.Builder
			for _, m := range nodes {
				fmt.Fprintf(&logs, "--- %s (cluster %s) stderr:\n%s\n", m.name, m.cluster, m.proc.stderr.String())
			}
			t.Fatalf("%s does not see a, b and c alive: %v\n%s", n.name, nodeStates(n), logs.String())
		}
	}
	return nodes
}

func getNodesOf(n *clusterNode) []apiNode {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + n.http + "/api/nodes")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var rows []apiNode
	json.NewDecoder(resp.Body).Decode(&rows)
	return rows
}

// nodeStates returns the state of each node as n sees it.
func nodeStates(n *clusterNode) map[string]string {
	st := map[string]string{}
	for _, r := range getNodesOf(n) {
		st[r.Name] = r.State
	}
	return st
}

// linksUp counts n's links that are up.
func linksUp(n *clusterNode) int {
	up := 0
	for _, r := range getNodesOf(n) {
		if r.Name != n.name {
			continue
		}
		for _, l := range r.Links {
			if l.Up {
				up++
			}
		}
	}
	return up
}

// linkUp reports whether n's link with peer is up.
func linkUp(n *clusterNode, peer string) bool {
	for _, r := range getNodesOf(n) {
		if r.Name == peer && len(r.Links) == 1 {
			return r.Links[0].Up
		}
	}
	return false
}

// TestClusterKill: a node killed with SIGKILL is seen at once by the
// others (the links' EOF: PeerDown, link down) and as dead in
// /api/nodes within 2 s. Tolerance: +2 s for a loaded machine (the
// polling of /api/nodes included).
func TestClusterKill(t *testing.T) {
	nodes := startCluster(t)
	out := cliOK(t, "cluster", "status", "--api", "http://"+nodes[0].http)
	for _, want := range []string{"NODE", "STATE", "a", "b", "c", "alive", nodes[2].cluster, "Links of a:"} {
		if !strings.Contains(out, want) {
			t.Errorf("cluster status lacks %q:\n%s", want, out)
		}
	}
	killed := time.Now()
	nodes[2].proc.cmd.Process.Signal(syscall.SIGKILL)
	for _, n := range nodes[:2] {
		if !testutil.Eventually(cliWait, func() bool { return !linkUp(n, "c") }) {
			t.Fatalf("%s still has its link with c up", n.name)
		}
		down := time.Since(killed)
		if !testutil.Eventually(cliWait, func() bool { return nodeStates(n)["c"] == "dead" }) {
			t.Fatalf("%s never sees c dead: %v", n.name, nodeStates(n))
		}
		dead := time.Since(killed)
		t.Logf("%s: link with c down %s after SIGKILL, c dead %s after", n.name, down.Round(time.Millisecond), dead.Round(time.Millisecond))
		if down > time.Second+2*time.Second {
			t.Errorf("%s: link down %s after the kill, want at once (tolerance 3s)", n.name, down)
		}
		if dead > 2*time.Second+2*time.Second {
			t.Errorf("%s: c dead %s after the kill, want within 2s (tolerance +2s)", n.name, dead)
		}
		// A kill breaks the links: a cut, at warn ("links down", at info,
		// is for a peer that said it was leaving).
		if log := n.proc.stderr.String(); !strings.Contains(log, "cluster: node link cut") && !strings.Contains(log, "cluster: links down") {
			t.Errorf("%s does not log the links down", n.name)
		}
	}
	// memberlist agrees, in its own time.
	for _, n := range nodes[:2] {
		n.proc.waitStderr(t, `msg="cluster: node dead" component=cluster node=c`)
	}
	if st := nodeStates(nodes[0]); st["a"] != "alive" || st["b"] != "alive" {
		t.Errorf("survivors: %v", st)
	}
}

// TestClusterStop: a node stopped with SIGSTOP (alive but silent) is
// declared dead within about 3 s: its links are cut after 3 s of
// silence (the link heartbeats find a half-open link), memberlist suspects it within about 1 s and declares it dead
// 1 to 2 s later. Tolerance: +2 s for a loaded machine. After SIGCONT it
// comes back alive.
func TestClusterStop(t *testing.T) {
	nodes := startCluster(t)
	stopped := time.Now()
	nodes[1].proc.cmd.Process.Signal(syscall.SIGSTOP)
	defer nodes[1].proc.cmd.Process.Signal(syscall.SIGCONT)
	for _, n := range []*clusterNode{nodes[0], nodes[2]} {
		// The link heartbeats find the silent link first.
		if !testutil.Eventually(cliWait, func() bool { return !linkUp(n, "b") }) {
			t.Fatalf("%s keeps its link with a stopped node up", n.name)
		}
		down := time.Since(stopped)
		t.Logf("%s: link with b down %s after SIGSTOP", n.name, down.Round(time.Millisecond))
		if down > 3*time.Second+2*time.Second {
			t.Errorf("%s: link with b down %s after SIGSTOP, want about 3s (tolerance +2s)", n.name, down)
		}
	}
	for _, n := range []*clusterNode{nodes[0], nodes[2]} {
		if !testutil.Eventually(cliWait, func() bool { return nodeStates(n)["b"] == "dead" }) {
			t.Fatalf("%s never sees b dead: %v\nstderr:\n%s", n.name, nodeStates(n), n.proc.stderr.String())
		}
		dead := time.Since(stopped)
		t.Logf("%s: b dead %s after SIGSTOP", n.name, dead.Round(time.Millisecond))
		if dead > 3*time.Second+2*time.Second {
			t.Errorf("%s: b dead %s after SIGSTOP, want about 3s (tolerance +2s)", n.name, dead)
		}
		if linkUp(n, "b") {
			t.Errorf("%s: link with a stopped node up", n.name)
		}
	}
	nodes[1].proc.cmd.Process.Signal(syscall.SIGCONT)
	for _, n := range nodes {
		if !testutil.Eventually(cliWait, func() bool { return nodeStates(n)["b"] == "alive" && linksUp(n) == 2 }) {
			t.Fatalf("%s: b not back after SIGCONT: %v", n.name, nodeStates(n))
		}
	}
}

// TestClusterInsecureRefused: a cluster address beyond loopback without
// a secret or TLS stops the server at start, saying why and what to do.
func TestClusterInsecureRefused(t *testing.T) {
	r := cliRun(t, "server", "--listen", "127.0.0.1:0", "--http", "off", "--data", t.TempDir(), "--log-level", "error",
		"--cluster", "0.0.0.0:0", "--cluster-advertise", "192.0.2.1:7500")
	if r.code == 0 || !strings.Contains(r.stderr, "refusing the cluster address") || !strings.Contains(r.stderr, "--cluster-secret-file") {
		t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
}
