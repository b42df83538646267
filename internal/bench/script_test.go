package bench_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// clusterScript runs scripts/cluster.sh with args and the environment
// env added, and returns its combined output.
func clusterScript(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"../../scripts/cluster.sh"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-time.After(2 * time.Minute):
			if cmd.Process != nil {
				cmd.Process.Kill()
			}
		case <-done:
		}
	}()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// A courier built before the cluster has no --cluster: the script says
// so instead of starting nodes that cannot meet.
func TestClusterScriptNoClusterFlags(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	fake := filepath.Join(dir, "courier")
	help := "Usage:\n  courier server [flags]\n\nFlags:\n      --name string   node name\n      --listen string  client listener\n"
	if err := os.WriteFile(fake, []byte("#!/bin/sh\ncat <<'EOF'\n"+help+"EOF\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"CLUSTER_DIR=" + filepath.Join(dir, "state"), "COURIER_BIN=" + fake}
	out, err := clusterScript(t, env, "start", "courier", "3")
	if err == nil || !strings.Contains(out, "has no --cluster and --join flags") || !strings.Contains(out, "start courier 1") {
		t.Errorf("start courier 3 with a pre-cluster build: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"start", "nats", "0"}, {"start", "nats", "10"}, {"start", "rabbitmq"}, {"restart", "nats"}} {
		if out, err := clusterScript(t, env, args...); err == nil || !strings.Contains(out, "usage:") {
			t.Errorf("%q: %v\n%s", args, err, out)
		}
	}
	if out, err := clusterScript(t, env, "status", "courier"); err != nil || !strings.Contains(out, "courier: no cluster") {
		t.Errorf("status with nothing started: %v\n%s", err, out)
	}
}

// portBase returns a base such that base+1 to base+n are free loopback
// ports a moment ago.
func portBase(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p+n > 65535 {
			continue
		}
		free := true
		for k := 2; k <= n; k++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+k-1))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			return p - 1
		}
	}
	t.Fatal("no run of free ports")
	return 0
}

func TestClusterScriptNATS(t *testing.T) {
	for _, bin := range []string{"bash", "nats-server", "curl"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	state := filepath.Join(t.TempDir(), "state")
	client, route, monitor := portBase(t, 2), portBase(t, 2), portBase(t, 2)
	env := []string{"CLUSTER_DIR=" + state, fmt.Sprintf("NATS_BASE=%d", client), fmt.Sprintf("NATS_ROUTE_BASE=%d", route),
		fmt.Sprintf("NATS_MONITOR_BASE=%d", monitor), "NATS_CLUSTER_NAME=script-test"}
	t.Cleanup(func() { clusterScript(t, env, "stop", "nats") })
	out, err := clusterScript(t, env, "start", "nats", "2")
	if err != nil {
		t.Fatalf("start nats 2: %v\n%s", err, out)
	}
	t.Logf("start:\n%s", out)
	if !strings.Contains(out, "2 nodes, cluster script-test, full mesh of routes") || !strings.Contains(out, "(1 up)") {
		t.Errorf("start did not report the routes up")
	}
	urls, err := clusterScript(t, env, "urls", "nats")
	want := fmt.Sprintf("nats://127.0.0.1:%d,nats://127.0.0.1:%d", client+1, client+2)
	if err != nil || strings.TrimSpace(urls) != want {
		t.Errorf("urls: %q, %v; want %s", urls, err, want)
	}
	if out, err := clusterScript(t, env, "start", "nats", "2"); err == nil || !strings.Contains(out, "already here") {
		t.Errorf("a second start: %v\n%s", err, out)
	}
	out, err = clusterScript(t, env, "stop", "nats")
	if err != nil || strings.Count(out, "stopped") != 2 {
		t.Errorf("stop: %v\n%s", err, out)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("the state directory is still there: %v", err)
	}
}

// courierPorts returns bases for cluster.sh's Courier ports such that
// node 1 to n's client (base+10K), HTTP and cluster ports (base+K) were
// free a moment ago.
func courierPorts(t *testing.T, n int) (client, http, clus int) {
	t.Helper()
	free := func(p int) bool {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		l.Close()
		return true
	}
	for range 100 {
		base := portBase(t, 1)
		ok := base+10*n <= 65535
		for k := 1; ok && k <= n; k++ {
			ok = free(base + 10*k)
		}
		if ok {
			return base, portBase(t, n), portBase(t, n)
		}
	}
	t.Fatal("no free ports")
	return 0, 0, 0
}

// start courier 2 returns once both nodes list each other alive with
// their links up, so that a benchmark started next finds a cluster.
func TestClusterScriptCourier(t *testing.T) {
	for _, bin := range []string{"bash", "curl", "go"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "courier")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/courier").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	client, httpBase, clus := courierPorts(t, 2)
	env := []string{"CLUSTER_DIR=" + filepath.Join(dir, "state"), "COURIER_BIN=" + bin,
		fmt.Sprintf("COURIER_BASE=%d", client), fmt.Sprintf("COURIER_HTTP_BASE=%d", httpBase), fmt.Sprintf("COURIER_CLUSTER_BASE=%d", clus)}
	t.Cleanup(func() { clusterScript(t, env, "stop", "courier") })
	out, err := clusterScript(t, env, "start", "courier", "2")
	if err != nil {
		t.Fatalf("start courier 2: %v\n%s", err, out)
	}
	t.Logf("start:\n%s", out)
	if !strings.Contains(out, "2 nodes joined") {
		t.Errorf("start did not wait for the nodes to join")
	}
	for k := 1; k <= 2; k++ {
		resp, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/api/nodes", httpBase+k))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(resp, `"state":"alive"`) != 2 || strings.Count(resp, `"up":true`) < 2 {
			t.Errorf("node %d right after start: %s", k, resp)
		}
	}
	urls, err := clusterScript(t, env, "urls", "courier")
	want := fmt.Sprintf("courier://127.0.0.1:%d,courier://127.0.0.1:%d", client+10, client+20)
	if err != nil || strings.TrimSpace(urls) != want {
		t.Errorf("urls: %q, %v; want %s", urls, err, want)
	}
	out, err = clusterScript(t, env, "stop", "courier")
	if err != nil || strings.Count(out, "stopped") != 2 {
		t.Errorf("stop: %v\n%s", err, out)
	}
}

// httpGet returns the body of a GET.
func httpGet(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return string(b), err
}
