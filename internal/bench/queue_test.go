package bench_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/bench"
)

var (
	producedLine = regexp.MustCompile(`^Produced (\d+) tasks in ~(\d+) seconds \((\d+) tasks/s, confirmed\)$`)
	consumedLine = regexp.MustCompile(`^Consumed (\d+) tasks in ~(\d+) seconds \((\d+) tasks/s, acked\)$`)
	missingLine  = regexp.MustCompile(`^Missing (\d+) of (\d+) confirmed tasks, (\d+) duplicates, (\d+) failed submits$`)
	reachedLine  = regexp.MustCompile(`^Reached depth (\d+) in ~(\d+) seconds \((\d+) iterations/s\)$`)
	depthLine    = regexp.MustCompile(`^Queue depth at the end, as the broker counts it: (\d+) \(as expected\)$`)
)

func tinyTasks(target bench.Target) bench.Config {
	return bench.Config{
		Target: target, Count: 500, Warmup: 20, Workers: 2, Drain: 5 * time.Second, Interval: 50 * time.Millisecond,
		Queue: bench.QueueConfig{Window: 50, Prefetch: 10},
	}
}

func checkTasks(t *testing.T, cfg bench.Config) {
	t.Helper()
	res, err := bench.RunTasks(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunTasks: %v", err)
	}
	var out bytes.Buffer
	if err := res.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Logf("output:\n%s", text)
	prod, cons, miss := lines(text, producedLine), lines(text, consumedLine), lines(text, missingLine)
	if len(prod) != 1 || len(cons) != 1 || len(miss) != 1 {
		t.Fatalf("want one Produced, Consumed and Missing line each")
	}
	if prod[0][1] != "500" || cons[0][1] != "500" || miss[0][1] != "0" || miss[0][4] != "0" {
		t.Errorf("produced %s, consumed %s, missing %s, failed %s; want 500, 500, 0, 0", prod[0][1], cons[0][1], miss[0][1], miss[0][4])
	}
	if rate, _ := strconv.Atoi(prod[0][3]); rate <= 0 {
		t.Errorf("produce rate %s", prod[0][3])
	}
	if res.Latency.Count != 500 || res.ConfirmLatency.Count != 500 {
		t.Errorf("%d end-to-end and %d confirm latencies, want 500 each", res.Latency.Count, res.ConfirmLatency.Count)
	}
	if res.Latency.P50 <= 0 || res.Latency.P50 > res.Latency.Max {
		t.Errorf("end-to-end latency %+v", res.Latency)
	}
	if res.Usage.ServerPeakRSS <= 0 {
		t.Errorf("no server memory: %+v", res.Usage)
	}
	for _, w := range []string{"Confirm latency p50", "End-to-end (submit to handling) latency p50", "peak RSS"} {
		if !strings.Contains(text, w) {
			t.Errorf("no %q line", w)
		}
	}
	var js bytes.Buffer
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Scenario string  `json:"scenario"`
		Produced int64   `json:"produced"`
		Consumed int64   `json:"consumed"`
		Rate     float64 `json:"produced_per_s"`
		Latency  struct {
			Count int64 `json:"count"`
		} `json:"latency_us"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON: %v", err)
	}
	if back.Scenario != "tasks" || back.Produced != 500 || back.Consumed != 500 || back.Rate <= 0 || back.Latency.Count != 500 {
		t.Errorf("JSON: %+v", back)
	}
}

func TestTasksEmbedded(t *testing.T) {
	checkTasks(t, tinyTasks(bench.Target{Kind: bench.KindEmbedded}))
}
func TestTasksServer(t *testing.T) { checkTasks(t, tinyTasks(startServer(t))) }
func TestTasksEcho(t *testing.T)   { checkTasks(t, tinyTasks(bench.Target{Kind: bench.KindEcho})) }

// A run bounded by time alone ends, at the offered rate.
func TestTasksDurationRate(t *testing.T) {
	cfg := bench.Config{Duration: 300 * time.Millisecond, Rate: 1000, Warmup: -1, Interval: 100 * time.Millisecond}
	res, err := bench.RunTasks(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunTasks: %v", err)
	}
	if res.Produced == 0 || res.Produced > 1000 || res.Consumed != res.Produced {
		t.Errorf("produced %d, consumed %d in 300ms at 1000/s", res.Produced, res.Consumed)
	}
}

func tinyBacklog(target bench.Target) bench.Config {
	return bench.Config{Target: target, Interval: 50 * time.Millisecond,
		Queue: bench.QueueConfig{Depth: 300, SampleEvery: 100, Window: 20}}
}

func checkBacklog(t *testing.T, cfg bench.Config) *bench.BacklogResult {
	t.Helper()
	res, err := bench.RunBacklog(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunBacklog: %v", err)
	}
	var out bytes.Buffer
	if err := res.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Logf("output:\n%s", text)
	// The loop published two and acked one per iteration: the queue is
	// as deep as the iterations, as the broker counts it.
	if res.Iterations != 300 || res.QueueDepth != res.Iterations || res.Published != 600 || res.Acked != 300 || res.Failed != 0 {
		t.Errorf("iterations %d, queue depth %d, published %d, acked %d, failed %d; want 300, 300, 600, 300, 0",
			res.Iterations, res.QueueDepth, res.Published, res.Acked, res.Failed)
	}
	if len(lines(text, reachedLine)) != 1 || len(lines(text, depthLine)) != 1 {
		t.Errorf("no Reached or Queue depth line")
	}
	if len(res.Curve) != 3 {
		t.Fatalf("%d curve points, want 3 (every 100 iterations)", len(res.Curve))
	}
	for i, p := range res.Curve {
		if p.Iterations != int64(100*(i+1)) || p.ServerRSS <= 0 || p.Rate <= 0 {
			t.Errorf("curve point %d: %+v", i, p)
		}
	}
	if res.Rate <= 0 || res.ConfirmLatency.Count != 600 {
		t.Errorf("rate %g, %d confirm latencies (want 600)", res.Rate, res.ConfirmLatency.Count)
	}
	var js bytes.Buffer
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Scenario   string `json:"scenario"`
		Iterations int64  `json:"iterations"`
		QueueDepth int64  `json:"queue_depth"`
		Curve      []struct {
			Iterations int64 `json:"iterations"`
			RSS        int64 `json:"server_rss_bytes"`
		} `json:"curve"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON: %v", err)
	}
	if back.Scenario != "backlog" || back.Iterations != 300 || back.QueueDepth != 300 || len(back.Curve) != 3 || back.Curve[2].RSS <= 0 {
		t.Errorf("JSON: %+v", back)
	}
	return res
}

func TestBacklogEmbedded(t *testing.T) {
	checkBacklog(t, tinyBacklog(bench.Target{Kind: bench.KindEmbedded}))
}
func TestBacklogServer(t *testing.T) { checkBacklog(t, tinyBacklog(startServer(t))) }
func TestBacklogEcho(t *testing.T)   { checkBacklog(t, tinyBacklog(bench.Target{Kind: bench.KindEcho})) }

// A backlog bounded by time stops before its depth, and says so; the
// queue is still as deep as the iterations.
func TestBacklogDuration(t *testing.T) {
	cfg := bench.Config{Duration: 200 * time.Millisecond, Queue: bench.QueueConfig{Depth: 1 << 30, SampleEvery: 1 << 20}}
	res, err := bench.RunBacklog(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunBacklog: %v", err)
	}
	var out bytes.Buffer
	res.WriteText(&out)
	if res.Iterations == 0 || res.QueueDepth != res.Iterations || len(res.Curve) != 1 {
		t.Errorf("iterations %d, queue depth %d, %d curve points", res.Iterations, res.QueueDepth, len(res.Curve))
	}
	if !strings.Contains(out.String(), "Stopped at depth ") {
		t.Errorf("no Stopped line:\n%s", out.String())
	}
}

// The backlog's chart is drawn over the queue's depth.
func TestBacklogPlot(t *testing.T) {
	res := checkBacklog(t, tinyBacklog(bench.Target{Kind: bench.KindEcho}))
	tl := res.Timeline()
	if !tl.ByDepth || len(tl.Samples) != 3 || tl.Samples[2].Depth != 300 {
		t.Fatalf("timeline %+v", tl)
	}
	path := filepath.Join(t.TempDir(), "backlog.svg")
	if err := bench.WritePlotFile(path, tl); err != nil {
		t.Fatalf("WritePlotFile: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkSVG(t, b)
	if !bytes.Contains(b, []byte("queue depth (messages)")) {
		t.Errorf("the chart's axis is not the queue depth")
	}
}

func TestQueueCompare(t *testing.T) {
	cmp, err := bench.Compare(ctxFor(t), bench.CompareConfig{
		Targets: []bench.Target{{Kind: bench.KindEmbedded}, {Kind: bench.KindEcho}},
		Cases:   []string{"tasks", "backlog"},
		Config:  bench.Config{Count: 200, Queue: bench.QueueConfig{Depth: 200}},
	})
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	want := map[string]bool{"tasks/produced": false, "tasks/consumed": false, "backlog/iterations": false}
	for _, r := range cmp.Rows {
		if _, ok := want[r.Case+"/"+r.Metric]; ok {
			want[r.Case+"/"+r.Metric] = true
		}
	}
	for k, ok := range want {
		if !ok {
			t.Errorf("no %s row", k)
		}
	}
	if len(cmp.Errors) > 0 {
		t.Errorf("errors: %q", cmp.Errors)
	}
}

// The mappings onto NATS JetStream and RabbitMQ run when a peer is
// given (scripts/peers.sh starts them), for example:
//
//	COURIER_BENCH_NATS=nats://127.0.0.1:4222 \
//	COURIER_BENCH_AMQP=amqp://guest:guest@127.0.0.1:5672/ go test -run Peers ./internal/bench
func TestQueuePeers(t *testing.T) {
	for _, env := range []string{"COURIER_BENCH_NATS", "COURIER_BENCH_AMQP"} {
		t.Run(env, func(t *testing.T) {
			url := os.Getenv(env)
			if url == "" {
				t.Skipf("%s not set", env)
			}
			target, err := bench.ParseTarget(url)
			if err != nil {
				t.Fatal(err)
			}
			checkTasks(t, tinyTasks(target))
			checkBacklog(t, tinyBacklog(target))
		})
	}
}

// MaxRSS stops a backlog once the server's memory passes it.
func TestBacklogMaxRSS(t *testing.T) {
	cfg := bench.Config{Target: bench.Target{Kind: bench.KindEcho},
		Queue: bench.QueueConfig{Depth: 1 << 30, SampleEvery: 1 << 20, MaxRSS: 1}}
	res, err := bench.RunBacklog(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunBacklog: %v", err)
	}
	var out bytes.Buffer
	res.WriteText(&out)
	if !res.OverRSS || res.Iterations == 0 || res.QueueDepth != res.Iterations || !strings.Contains(out.String(), "the server's RSS passed") {
		t.Errorf("over %v, iterations %d, depth %d:\n%s", res.OverRSS, res.Iterations, res.QueueDepth, out.String())
	}
}
