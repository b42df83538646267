package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/node"
)

// cliWait bounds every run of a test.
const cliWait = 20 * time.Second

// runBench runs courier-bench in this process with args and returns its
// standard output.
func runBench(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := benchCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), cliWait)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

func TestBenchFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string // in the output
	}{
		{"reqresp", []string{"reqresp", "--count", "20,30", "--parallel", "2", "--warmup", "5", "--workers", "2", "--size", "16"},
			[]string{"Sequential 20 cycles in ~", "Sequential 30 cycles in ~", "Parallel 2 30 cycles in ~", "16-byte ping and pong, 2 handler(s)"}},
		{"reqresp-rate", []string{"reqresp", "--duration", "100ms", "--parallel", "2", "--rate", "2000"},
			[]string{"Sequential ", "Parallel 2 ", "offered 2000 cycles/s"}},
		{"fanout", []string{"pubsub", "--count", "100", "--subscribers", "3", "--warmup", "0"},
			[]string{"Pub-sub fan-out:", "1 publisher(s), 3 subscriber(s), 100 messages", "Lost 0 of 300 deliveries"}},
		{"fanin", []string{"pubsub", "--mode", "fanin", "--publishers", "3", "--messages", "90"},
			[]string{"Pub-sub fan-in:", "3 publisher(s), 1 subscriber(s), 90 messages", "Lost 0 of 90 deliveries"}},
		{"users", []string{"users", "--users", "4", "--ramp", "40", "--duration", "500ms", "--interval", "100ms", "--request-rate", "10", "--publish-rate", "0"},
			[]string{"4 users ramped at 40/s, each 10 requests/s and 0 messages/s", "Connected 4 of 4 users"}},
		{"users-chat-ws", []string{"users", "--ws", "--room-size", "3", "--rooms-per-user", "2", "--users", "6", "--ramp", "60", "--duration", "600ms", "--interval", "100ms", "--request-rate", "0", "--publish-rate", "10"},
			[]string{"6 users ramped at 60/s, each 0 requests/s and 10 messages/s", "rooms of about 3 users, each user in 1 to 2", "Each user over WebSocket", "Connected 6 of 6 users"}},
		{"mgmt", []string{"mgmt", "--queues", "120", "--hot", "2", "--idle", "20", "--trickle", "200", "--poll", "50ms", "--duration", "500ms", "--publishers", "1", "--workers", "1", "--size", "32"},
			[]string{"120 queues: 2 hot (1 producers as fast as confirmed, 1 workers, 32-byte tasks), 20 idle with known depths, 98 with a trickle of 200/s", "/api/queues?columns=name,messages_ready every 50ms", "Figures exact: "}},
		{"echo", []string{"echo", "--count", "50", "--parallel", "4"},
			[]string{"in-process echo (no broker)", "Sequential 50 cycles in ~", "Parallel 4 50 cycles"}},
		{"harness", []string{"pubsub", "--harness", "--count", "50", "--subscribers", "2"},
			[]string{"in-process echo (no broker)", "Lost 0 of 100 deliveries"}},
		{"tasks", []string{"tasks", "--count", "200", "--workers", "2", "--prefetch", "5", "--window", "20", "--size", "64", "--warmup", "10"},
			[]string{"1 producer (confirms, window 20), 2 worker(s) (prefetch 5, ack each), 200 tasks of 64 bytes", "Produced 200 tasks in ~",
				"Consumed 200 tasks in ~", "Missing 0 of 200 confirmed tasks, 0 duplicates"}},
		{"backlog", []string{"backlog", "--depth", "300", "--sample-every", "100", "--prefetch", "5", "--window", "30"},
			[]string{"1 consumer (prefetch 5)", "(confirms pipelined, window 30)", "to depth 300", "Reached depth 300 in ~",
				"Queue depth at the end, as the broker counts it: 300 (as expected)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runBench(t, tc.args...)
			if err != nil {
				t.Fatalf("courier-bench %s: %v\n%s", strings.Join(tc.args, " "), err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output has no %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestBenchBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"pubsub", "--mode", "sideways"},
		{"reqresp", "--url", "nats://127.0.0.1:4222"},
		{"reqresp", "--embedded", "--target", "nats://127.0.0.1:4222"},
		{"reqresp", "--target", "http://127.0.0.1"},
		{"users", "--target", "amqp://127.0.0.1:5672/"}, // no mapping
		{"reqresp", "--plot", "out.pdf"},
		{"pubsub", "--publishers", "-1"},
		{"users", "--count", "5"}, // users has no --count
		{"mgmt", "--target", "nats://127.0.0.1:4222"},
		{"mgmt", "--queues", "4", "--hot", "5"},
		{"mgmt", "--http", "127.0.0.1:7480", "--url", "courier://127.0.0.1:1"},
		{"users", "--count", "5"},   // users has no --count
		{"backlog", "--count", "5"}, // backlog has --depth
		{"tasks", "--prefetch", "-1"},
		{"backlog", "--window", "-3"},
	} {
		if out, err := runBench(t, args...); err == nil {
			t.Errorf("courier-bench %s: no error\n%s", strings.Join(args, " "), out)
		}
	}
}

func TestBenchJSONAndPlot(t *testing.T) {
	plot := filepath.Join(t.TempDir(), "run.svg")
	out, err := runBench(t, "pubsub", "--count", "200", "--subscribers", "2", "--json", "--plot", plot, "--interval", "10ms", "--rate", "4000")
	if err != nil {
		t.Fatalf("courier-bench pubsub --json: %v\n%s", err, out)
	}
	var res struct {
		Scenario  string `json:"scenario"`
		Delivered int64  `json:"delivered"`
		Samples   []struct {
			T float64 `json:"t_s"`
		} `json:"samples"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&res); err != nil {
		t.Fatalf("JSON: %v\n%s", err, out)
	}
	if dec.More() {
		t.Errorf("more than one JSON value:\n%s", out)
	}
	if res.Scenario != "pubsub" || res.Delivered != 400 || len(res.Samples) == 0 {
		t.Errorf("scenario %q, delivered %d, %d samples", res.Scenario, res.Delivered, len(res.Samples))
	}
	b, err := os.ReadFile(plot)
	if err != nil {
		t.Fatalf("plot: %v", err)
	}
	if !bytes.Contains(b, []byte("<svg")) {
		t.Errorf("plot file is not SVG")
	}
}

func TestBenchCompare(t *testing.T) {
	start := time.Now()
	out, err := runBench(t, "compare", "--embedded", "--courier", "", "--nats", "nats://127.0.0.1:1", "--amqp", "",
		"--cases", "fanout", "--count", "100")
	if err != nil {
		t.Fatalf("courier-bench compare: %v\n%s", err, out)
	}
	if !strings.Contains(out, "Skipping NATS at nats://127.0.0.1:1: not reachable") || !strings.Contains(out, "delivered") {
		t.Errorf("output:\n%s", out)
	}
	t.Logf("compare took %s:\n%s", time.Since(start), out)
}

func TestBenchBacklogJSONAndPlot(t *testing.T) {
	plot := filepath.Join(t.TempDir(), "backlog.png")
	out, err := runBench(t, "backlog", "--depth", "200", "--sample-every", "50", "--json", "--plot", plot)
	if err != nil {
		t.Fatalf("courier-bench backlog --json: %v\n%s", err, out)
	}
	var res struct {
		Scenario   string `json:"scenario"`
		Iterations int64  `json:"iterations"`
		QueueDepth int64  `json:"queue_depth"`
		Curve      []struct {
			Iterations int64 `json:"iterations"`
		} `json:"curve"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("JSON: %v\n%s", err, out)
	}
	if res.Scenario != "backlog" || res.Iterations != 200 || res.QueueDepth != 200 || len(res.Curve) != 4 {
		t.Errorf("JSON: %+v", res)
	}
	b, err := os.ReadFile(plot)
	if err != nil {
		t.Fatalf("plot: %v", err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("plot file is not PNG")
	}
}

// TestBenchRoot: courier-bench is the root command, its scenarios its
// subcommands.
func TestBenchRoot(t *testing.T) {
	out, err := runBench(t, "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"courier-bench [command]", "reqresp", "pubsub", "users", "tasks", "backlog", "mgmt", "echo", "compare", "cluster", "idle"} {
		if !strings.Contains(out, want) {
			t.Errorf("help has no %q:\n%s", want, out)
		}
	}
}

// startServer runs a node that serves the network and the management
// API on free loopback ports, in this process, and returns its client
// and management URLs.
func startServer(t *testing.T) (string, string) {
	t.Helper()
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n.URL(), n.HTTPURL()
}

func TestBenchCrossNodeFlags(t *testing.T) {
	url, http := startServer(t)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"reqresp", []string{"reqresp", "--url", url, "--handler-url", url, "--count", "30", "--parallel", "100"},
			[]string{"1 handler(s) connected to " + url, "Sequential 30 cycles in ~", "Parallel 100 30 cycles in ~"}},
		{"pubsub", []string{"pubsub", "--url", url, "--subscriber-urls", url + "," + url, "--nodes-http", http, "--subscribers", "3", "--count", "50"},
			[]string{"3 subscriber(s) spread over 2 server(s)", "Lost 0 of 150 deliveries", "Link counters over 20 publications", "no link fields in /api/nodes"}},
		{"cluster", []string{"cluster", "--single", url, "--nats-nodes", "nats://127.0.0.1:1,nats://127.0.0.1:2", "--count", "30",
			"--parallel-count", "100", "--subscribers", "3", "--messages", "10", "--rounds", "2"},
			[]string{"Skipping NATS cluster", "reqresp-cross", "reqresp-same", "fanout-spread", "Parallel 100", "Medians of 2 rounds"}},
		{"idle", []string{"idle", "--url", url, "--exchanges", "20", "--window", "100ms", "--settle", "10ms", "--baseline"},
			[]string{"Idle cost: Courier, 1 server(s), 20 exchanges", "CPU % before", url}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runBench(t, tc.args...)
			if err != nil {
				t.Fatalf("courier-bench %s: %v\n%s", strings.Join(tc.args, " "), err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output has no %q:\n%s", w, out)
				}
			}
		})
	}
	for _, args := range [][]string{
		{"reqresp", "--handler-url", url},                                   // embedded
		{"reqresp", "--url", url, "--handler-url", "nats://127.0.0.1:4222"}, // another kind
		{"pubsub", "--target", "nats://127.0.0.1:1", "--nodes-http", http},  // NATS has no /api/nodes
		{"cluster"}, // no columns
		{"cluster", "--url", url, "--single", url},      // --url is not a column
		{"cluster", "--single", url, "--cases", "nope"}, // unknown case
		{"idle"}, // no servers
		{"idle", "--url", url + ",nats://127.0.0.1:1", "--window", "10ms"}, // mixed kinds
		{"idle", "--target", "amqp://127.0.0.1:5672/", "--window", "10ms"}, // no mapping
	} {
		if out, err := runBench(t, args...); err == nil {
			t.Errorf("courier-bench %s: no error\n%s", strings.Join(args, " "), out)
		}
	}
}
