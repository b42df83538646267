package bench_test

import (
	"bytes"
	"context"
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

	"github.com/courier-mq/courier/internal/bench"
)

// The cross-node code paths run here against one Courier node (the
// handler and the subscribers on other connections to it, its
// /api/nodes without links) and, when nats-server is installed, against
// a real 2-server NATS cluster on loopback.

func TestReqRespHandlerURL(t *testing.T) {
	target := startServer(t)
	cfg := tinyReqResp(target)
	cfg.HandlerURL = target.URL
	res := checkCross(t, cfg)
	if !strings.Contains(res, "handler(s) connected to "+target.URL) {
		t.Errorf("no handler URL in the header:\n%s", res)
	}
}

// checkCross runs a short request-response run and checks its classic
// lines; it returns the text.
func checkCross(t *testing.T, cfg bench.Config) string {
	t.Helper()
	cfg.Counts, cfg.Parallel, cfg.ParallelCount = []int{30}, []int{100}, 300
	res, err := bench.RunReqResp(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunReqResp: %v", err)
	}
	var out bytes.Buffer
	res.WriteText(&out)
	text := out.String()
	t.Logf("output:\n%s", text)
	seq, par := lines(text, sequentialLine), lines(text, parallelLine)
	if len(seq) != 1 || seq[0][1] != "30" || len(par) != 1 || par[0][1] != "100" || par[0][2] != "300" {
		t.Errorf("want one Sequential 30 and one Parallel 100 300 line")
	}
	return text
}

func TestPubSubSpreadLinks(t *testing.T) {
	n, target := startNode(t, "127.0.0.1:0")
	cfg := bench.Config{Target: target, SubscriberURLs: []string{target.URL, target.URL}, NodesHTTP: []string{n.HTTPURL()}}
	cfg.Subscribers, cfg.Count, cfg.Drain = 5, 200, 2*time.Second
	res, err := bench.RunPubSub(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunPubSub: %v", err)
	}
	var out bytes.Buffer
	res.WriteText(&out)
	text := out.String()
	t.Logf("output:\n%s", text)
	if res.Delivered != 1000 || res.Lost != 0 || res.Servers != 2 {
		t.Errorf("delivered %d, lost %d, servers %d; want 1000, 0, 2", res.Delivered, res.Lost, res.Servers)
	}
	if !strings.Contains(text, "5 subscriber(s) spread over 2 server(s)") {
		t.Errorf("no spread in the header")
	}
	// A single node has no links: the report says so and names the
	// fields it found instead.
	if res.Links == nil || res.Links.Found != 0 || len(res.Links.Notes) != 1 ||
		!strings.Contains(res.Links.Notes[0], "no link fields in /api/nodes") || !strings.Contains(res.Links.Notes[0], ".exchanges") {
		t.Errorf("links %+v", res.Links)
	}
	if !strings.Contains(text, "Link counters over 20 publications") {
		t.Errorf("no link counter lines")
	}
}

func TestSpreadConfigRefused(t *testing.T) {
	for _, cfg := range []bench.Config{
		{HandlerURL: "courier://127.0.0.1:1"}, // embedded
		{Target: bench.Target{Kind: bench.KindCourier, URL: "courier://127.0.0.1:1"}, HandlerURL: "nats://127.0.0.1:1"},
		{Target: bench.Target{Kind: bench.KindNATS, URL: "nats://127.0.0.1:1"}, SubscriberURLs: []string{"courier://127.0.0.1:1"}},
		{Target: bench.Target{Kind: bench.KindNATS, URL: "nats://127.0.0.1:1"}, NodesHTTP: []string{"http://127.0.0.1:1"}},
		{Target: bench.Target{Kind: bench.KindCourier, URL: "courier://127.0.0.1:1"}, NodesHTTP: []string{"127.0.0.1:7480"}},
		{Target: bench.Target{Kind: bench.KindAMQP, URL: "amqp://127.0.0.1:1/"}, HandlerURL: "amqp://127.0.0.1:2/"},
	} {
		if _, err := bench.RunReqResp(ctxFor(t), cfg); err == nil || !strings.Contains(err.Error(), "bench:") {
			t.Errorf("%+v: err %v, want a refusal", cfg, err)
		}
	}
}

func TestCompareClusters(t *testing.T) {
	n, single := startNode(t, "127.0.0.1:0")
	var log []string
	// Twelve runs: the work is bounded by counts, and the deadline only
	// guards against a hang (at a load average of 20 they took 16-20 s).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmp, err := bench.CompareClusters(ctx, bench.ClusterConfig{
		// The same node twice stands for a cluster here.
		Courier:     []string{single.URL, single.URL},
		CourierHTTP: []string{n.HTTPURL()},
		NATS:        []string{"nats://127.0.0.1:1", "nats://127.0.0.1:2"}, // nothing listens on port 1
		Single:      single.URL,
		Rounds:      2,
		Messages:    20,
		Config:      bench.Config{Count: 50, ParallelCount: 200, Subscribers: 4, Drain: 200 * time.Millisecond},
		Log:         func(l string) { log = append(log, l) },
	})
	if err != nil {
		t.Fatalf("CompareClusters: %v", err)
	}
	var out bytes.Buffer
	cmp.WriteText(&out)
	text := out.String()
	t.Logf("output:\n%s", text)
	if len(cmp.Skipped) != 1 || !strings.Contains(cmp.Skipped[0], "Skipping NATS cluster") {
		t.Errorf("skipped %q", cmp.Skipped)
	}
	if len(cmp.Labels) != 2 || cmp.Labels[0] != "Courier cluster" || cmp.Labels[1] != "Courier single" {
		t.Errorf("labels %q", cmp.Labels)
	}
	rows := map[string]bench.Row{}
	for _, r := range cmp.Rows {
		rows[r.Case+" "+r.Metric] = r
	}
	for _, k := range []string{"reqresp-cross Sequential 50", "reqresp-cross Parallel 100", "reqresp-same Sequential 50", "fanout-spread delivered"} {
		r, ok := rows[k]
		if !ok {
			t.Errorf("no row %q", k)
			continue
		}
		if r.Rounds != 2 || len(r.Values) != 2 || !(r.Values[0] > 0) || !(r.Range[0][0] <= r.Values[0] && r.Values[0] <= r.Range[0][1]) {
			t.Errorf("row %q: %+v", k, r)
		}
	}
	for _, want := range []string{"Courier cluster/Courier single", "Medians of 2 rounds", "Link counters over 20 publications", "Ratios: how many times better Courier cluster did"} {
		if !strings.Contains(text, want) {
			t.Errorf("output has no %q", want)
		}
	}
	if len(log) != 1+2*3*2 {
		t.Errorf("%d log lines, want the skip and 12 runs: %q", len(log), log)
	}
	if _, err := bench.CompareClusters(ctxFor(t), bench.ClusterConfig{Single: single.URL, Cases: []string{"nope"}}); err == nil {
		t.Errorf("an unknown case did not fail")
	}
	if _, err := bench.CompareClusters(ctxFor(t), bench.ClusterConfig{NATS: []string{single.URL}}); err == nil {
		t.Errorf("a courier URL among the NATS nodes did not fail")
	}
}

func TestIdleCourier(t *testing.T) {
	_, target := startNode(t, "")
	res, err := bench.RunIdle(ctxFor(t), bench.IdleConfig{Nodes: []string{target.URL}, Exchanges: 30,
		Window: 200 * time.Millisecond, Settle: 10 * time.Millisecond, Baseline: true})
	if err != nil {
		t.Fatalf("RunIdle: %v", err)
	}
	text := idleText(t, res)
	// The node runs in this process: its listener's process is this one.
	if len(res.Nodes) != 1 || res.Nodes[0].PID != os.Getpid() || res.Nodes[0].After.RSS <= 0 || res.Nodes[0].Before == nil {
		t.Errorf("nodes %+v", res.Nodes)
	}
	if !strings.Contains(text, "Idle cost: Courier, 1 server(s), 30 exchanges") || !strings.Contains(text, "CPU % before") {
		t.Errorf("no header or no baseline columns")
	}
	if _, err := bench.RunIdle(ctxFor(t), bench.IdleConfig{Nodes: []string{target.URL, "nats://127.0.0.1:1"}}); err == nil {
		t.Errorf("mixed kinds did not fail")
	}
}

func idleText(t *testing.T, res *bench.IdleResult) string {
	t.Helper()
	var out bytes.Buffer
	if err := res.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("output:\n%s", out.String())
	return out.String()
}

// startNATSCluster runs n nats-servers with a full mesh of routes on
// free loopback ports, and returns their client URLs; it skips the test
// when nats-server is not installed.
func startNATSCluster(t *testing.T, n int) []string {
	t.Helper()
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Skip("nats-server is not installed (scripts/install-peers.sh)")
	}
	client, route, monitor := freePorts(t, n), freePorts(t, n), freePorts(t, n)
	var urls []string
	for k := range n {
		var routes []string
		for j := range n {
			if j != k {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", route[j]))
			}
		}
		dir := t.TempDir()
		cmd := exec.Command(bin, "-n", fmt.Sprintf("t%d", k), "-a", "127.0.0.1", "-p", fmt.Sprint(client[k]),
			"-m", fmt.Sprint(monitor[k]), "--cluster_name", "bench-test",
			"--cluster", fmt.Sprintf("nats://127.0.0.1:%d", route[k]), "--routes", strings.Join(routes, ","),
			"-l", filepath.Join(dir, "log"))
		if err := cmd.Start(); err != nil {
			t.Fatalf("nats-server: %v", err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", client[k]))
	}
	// Every server has its routes once its monitor says so.
	deadline := time.Now().Add(30 * time.Second)
	for k := range n {
		for !routesUp(monitor[k], n-1) {
			if time.Now().After(deadline) {
				t.Fatalf("nats-server %d: routes not up within 30s", k)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return urls
}

func routesUp(port, want int) bool {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/routez", port))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return bytes.Contains(b, fmt.Appendf(nil, `"num_routes": %d`, want))
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

func TestNATSCluster(t *testing.T) {
	urls := startNATSCluster(t, 2)
	a, err := bench.ParseTarget(urls[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Run("reqresp-cross", func(t *testing.T) {
		text := checkCross(t, bench.Config{Target: a, HandlerURL: urls[1], Warmup: 10})
		// The CPU figures sum both servers.
		if !strings.Contains(text, "Servers (2 processes, summed)") {
			t.Errorf("the server figures are not of both servers")
		}
	})
	t.Run("fanout-spread", func(t *testing.T) {
		cfg := bench.Config{Target: a, SubscriberURLs: urls, Subscribers: 6, Count: 300, Drain: 2 * time.Second}
		res, err := bench.RunPubSub(ctxFor(t), cfg)
		if err != nil {
			t.Fatalf("RunPubSub: %v", err)
		}
		if res.Published != 300 || res.Lost != 0 || res.Delivered != 1800 || res.OutOfOrder != 0 {
			t.Errorf("published %d, delivered %d, lost %d, out of order %d", res.Published, res.Delivered, res.Lost, res.OutOfOrder)
		}
	})
	t.Run("idle", func(t *testing.T) {
		res, err := bench.RunIdle(ctxFor(t), bench.IdleConfig{Nodes: urls, Exchanges: 100, Window: 200 * time.Millisecond, Settle: 10 * time.Millisecond})
		if err != nil {
			t.Fatalf("RunIdle: %v", err)
		}
		text := idleText(t, res)
		if len(res.Nodes) != 2 || res.Nodes[0].Name != "nats-server" || res.Nodes[0].PID == res.Nodes[1].PID {
			t.Errorf("nodes %+v", res.Nodes)
		}
		if !strings.Contains(text, "100 subscriptions spread over them") || !strings.Contains(text, "total") {
			t.Errorf("no header or no total")
		}
	})
	t.Run("compare", func(t *testing.T) {
		cmp, err := bench.CompareClusters(ctxFor(t), bench.ClusterConfig{NATS: urls, Cases: []string{"reqresp-cross"},
			Config: bench.Config{Count: 30, ParallelCount: 100, Warmup: 5}})
		if err != nil {
			t.Fatalf("CompareClusters: %v", err)
		}
		if len(cmp.Labels) != 1 || cmp.Labels[0] != "NATS cluster" || len(cmp.Rows) == 0 {
			t.Errorf("labels %q, %d rows", cmp.Labels, len(cmp.Rows))
		}
	})
}
