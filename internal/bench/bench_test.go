package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/bench"
	"github.com/courier-mq/courier/node"
)

var (
	sequentialLine = regexp.MustCompile(`^Sequential (\d+) cycles in ~(\d+) seconds \((\d+) cycles/s\)$`)
	parallelLine   = regexp.MustCompile(`^Parallel (\d+) (\d+) cycles in ~(\d+) seconds \((\d+) cycles/s\)$`)
	latencyLine    = regexp.MustCompile(`^Sequential latency p50 \d+\.\d us, p99 \d+\.\d us, p99\.9 \d+\.\d us \((\d+) cycles, max \d+\.\d us\)$`)
	publishedLine  = regexp.MustCompile(`^Published (\d+) messages in ~(\d+) seconds \((\d+) msgs/s\)$`)
	deliveredLine  = regexp.MustCompile(`^Delivered (\d+) messages in ~(\d+) seconds \((\d+) msgs/s\)$`)
	lostLine       = regexp.MustCompile(`^Lost (\d+) of (\d+) deliveries \(\d+\.\d{3}%\), (\d+) out of order$`)
)

func tinyReqResp(target bench.Target) bench.Config {
	return bench.Config{
		Target:        target,
		Counts:        []int{20, 30, 50},
		Parallel:      []int{2, 4, 10, 100},
		ParallelCount: 200,
		Warmup:        10,
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// lines returns the output's lines that match re, with their submatches.
func lines(out string, re *regexp.Regexp) [][]string {
	var m [][]string
	for _, l := range strings.Split(out, "\n") {
		if s := re.FindStringSubmatch(l); s != nil {
			m = append(m, s)
		}
	}
	return m
}

func checkReqResp(t *testing.T, cfg bench.Config) {
	t.Helper()
	var stages []string
	cfg.Progress = func(stage string, done, total int64) {
		if len(stages) == 0 || stages[len(stages)-1] != stage {
			stages = append(stages, stage)
		}
	}
	res, err := bench.RunReqResp(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunReqResp: %v", err)
	}
	var out bytes.Buffer
	if err := res.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Logf("output:\n%s", text)

	seq := lines(text, sequentialLine)
	if len(seq) != 3 {
		t.Fatalf("%d Sequential lines, want 3", len(seq))
	}
	for i, want := range []string{"20", "30", "50"} {
		if seq[i][1] != want {
			t.Errorf("Sequential line %d: %q cycles, want %s", i, seq[i][1], want)
		}
	}
	par := lines(text, parallelLine)
	if len(par) != 4 {
		t.Fatalf("%d Parallel lines, want 4", len(par))
	}
	for i, want := range []string{"2", "4", "10", "100"} {
		if par[i][1] != want || par[i][2] != "200" {
			t.Errorf("Parallel line %d: P %s, %s cycles; want P %s, 200 cycles", i, par[i][1], par[i][2], want)
		}
	}
	lat := lines(text, latencyLine)
	if len(lat) != 1 || lat[0][1] != "100" {
		t.Errorf("latency lines %q, want one over 100 cycles", lat)
	}
	if !strings.Contains(text, "CPU ") {
		t.Errorf("no CPU line")
	}
	// Every line of the classic block stands alone: nothing else on it.
	for _, l := range strings.Split(text, "\n") {
		if (strings.Contains(l, "cycles in ~")) && !sequentialLine.MatchString(l) && !parallelLine.MatchString(l) {
			t.Errorf("malformed line %q", l)
		}
	}
	if len(stages) != 7 || stages[0] != "Sequential 20" || stages[6] != "Parallel 100" {
		t.Errorf("progress stages %q", stages)
	}

	var js bytes.Buffer
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON output: %v", err)
	}
	if back["scenario"] != "reqresp" || len(back["runs"].([]any)) != 7 {
		t.Errorf("JSON: scenario %v, %d runs", back["scenario"], len(back["runs"].([]any)))
	}
}

func checkPubSub(t *testing.T, cfg bench.Config) {
	t.Helper()
	cfg.Subscribers, cfg.Count, cfg.Drain = 3, 500, 2*time.Second
	res, err := bench.RunPubSub(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunPubSub: %v", err)
	}
	var out bytes.Buffer
	if err := res.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Logf("output:\n%s", text)
	pub, del, lost := lines(text, publishedLine), lines(text, deliveredLine), lines(text, lostLine)
	if len(pub) != 1 || len(del) != 1 || len(lost) != 1 {
		t.Fatalf("want one Published, Delivered and Lost line each")
	}
	if pub[0][1] != "500" || lost[0][2] != "1500" {
		t.Errorf("published %s, expected deliveries %s; want 500 and 1500", pub[0][1], lost[0][2])
	}
	// An embedded node pushes back rather than drop: nothing is lost,
	// nothing reordered.
	if del[0][1] != "1500" || lost[0][1] != "0" || lost[0][3] != "0" {
		t.Errorf("delivered %s, lost %s, out of order %s; want 1500, 0, 0", del[0][1], lost[0][1], lost[0][3])
	}
}

func TestReqRespEmbedded(t *testing.T) {
	checkReqResp(t, tinyReqResp(bench.Target{Kind: bench.KindEmbedded}))
}

func TestPubSubEmbedded(t *testing.T) {
	checkPubSub(t, bench.Config{Target: bench.Target{Kind: bench.KindEmbedded}})
}

// startServer runs a node that serves the network on a free loopback
// port, in this process.
func startServer(t testing.TB) bench.Target {
	t.Helper()
	_, target := startNode(t, "")
	return target
}

// startNode runs a node that serves the network on a free loopback port,
// and the management API on http unless it is "", in this process.
func startNode(t testing.TB, http string) (*node.Node, bench.Target) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: http, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	target, err := bench.ParseTarget(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	return n, target
}

func TestReqRespServer(t *testing.T) {
	checkReqResp(t, tinyReqResp(startServer(t)))
}

func TestPubSubServer(t *testing.T) {
	checkPubSub(t, bench.Config{Target: startServer(t)})
}

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		url  string
		kind bench.Kind
		bad  bool
	}{
		{"", bench.KindEmbedded, false},
		{"courier://127.0.0.1:7400", bench.KindCourier, false},
		{"nats://127.0.0.1:4222", bench.KindNATS, false},
		{"amqp://guest:guest@127.0.0.1:5672/", bench.KindAMQP, false},
		{"http://127.0.0.1", "", true},
	} {
		t.Run(fmt.Sprintf("%q", tc.url), func(t *testing.T) {
			got, err := bench.ParseTarget(tc.url)
			if (err != nil) != tc.bad {
				t.Fatalf("err = %v, bad = %v", err, tc.bad)
			}
			if got.Kind != tc.kind {
				t.Errorf("kind %q, want %q", got.Kind, tc.kind)
			}
			if strings.Contains(got.String(), "guest:guest") {
				t.Errorf("String() shows the password: %s", got)
			}
		})
	}
}

// The benchmarks run the scenarios for go test's profiling flags, for
// example: go test -run X -bench ReqResp/server -benchtime 100000x
// -cpuprofile cpu.prof ./internal/bench (client and server are both in
// the test process).
var benchTargets = []struct {
	name   string
	target func(testing.TB) bench.Target
}{
	{"embedded", func(testing.TB) bench.Target { return bench.Target{Kind: bench.KindEmbedded} }},
	{"server", startServer},
}

func BenchmarkReqResp(b *testing.B) {
	for _, tc := range benchTargets {
		b.Run(tc.name, func(b *testing.B) {
			cfg := bench.Config{Target: tc.target(b), Counts: []int{b.N}, Parallel: []int{}, Warmup: -1}
			res, err := bench.RunReqResp(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(res.Runs[0].Rate, "cycles/s")
			b.ReportMetric(res.Latency.P50, "p50-us")
		})
	}
}

func BenchmarkPubSub(b *testing.B) {
	for _, tc := range benchTargets {
		b.Run(tc.name, func(b *testing.B) {
			cfg := bench.Config{Target: tc.target(b), Count: b.N, Subscribers: 10}
			res, err := bench.RunPubSub(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			if res.Lost > 0 {
				b.Errorf("lost %d deliveries", res.Lost)
			}
			b.ReportMetric(res.DeliverRate, "deliveries/s")
		})
	}
}

func TestPubSubFanIn(t *testing.T) {
	cfg := bench.Config{Publishers: 4, Subscribers: 1, Count: 400, Warmup: 20, Drain: 2 * time.Second}
	res, err := bench.RunPubSub(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunPubSub: %v", err)
	}
	var out bytes.Buffer
	res.WriteText(&out)
	t.Logf("output:\n%s", out.String())
	if res.Mode != "fan-in" || res.Published != 400 || res.Delivered != 400 || res.Lost != 0 || res.OutOfOrder != 0 {
		t.Errorf("mode %s, published %d, delivered %d, lost %d, out of order %d; want fan-in, 400, 400, 0, 0",
			res.Mode, res.Published, res.Delivered, res.Lost, res.OutOfOrder)
	}
	if res.Latency.Count != 400 {
		t.Errorf("%d delivery latencies, want 400", res.Latency.Count)
	}
	if !strings.Contains(out.String(), "Pub-sub fan-in:") || !strings.Contains(out.String(), "Delivery latency p50") {
		t.Errorf("no fan-in header or delivery latency line")
	}
}

// A run bounded by time alone ends, and a rate limit holds the
// publishers to their schedule (not checked against the clock: the
// machine may be slow, so only that the run is bounded and counted).
func TestPubSubDurationRate(t *testing.T) {
	cfg := bench.Config{Subscribers: 2, Duration: 300 * time.Millisecond, Rate: 2000, Warmup: -1, Interval: 100 * time.Millisecond}
	res, err := bench.RunPubSub(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunPubSub: %v", err)
	}
	if res.Published == 0 || res.Delivered != 2*res.Published {
		t.Errorf("published %d, delivered %d", res.Published, res.Delivered)
	}
	if res.Published > 2000 {
		t.Errorf("published %d in 300ms at 2000/s", res.Published)
	}
	if len(res.Samples) == 0 || res.Samples[0].Offered != 2000 {
		t.Errorf("samples %+v, want the offered rate in them", res.Samples)
	}
}

func TestReqRespWorkersDuration(t *testing.T) {
	cfg := bench.Config{Workers: 3, Duration: 100 * time.Millisecond, Parallel: []int{4}, Warmup: 5, Rate: 5000}
	res, err := bench.RunReqResp(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunReqResp: %v", err)
	}
	if len(res.Runs) != 2 || res.Runs[0].Cycles == 0 || res.Runs[1].Cycles == 0 {
		t.Fatalf("runs %+v, want one sequential and one parallel run with cycles", res.Runs)
	}
	var out bytes.Buffer
	res.WriteText(&out)
	if len(lines(out.String(), sequentialLine)) != 1 || len(lines(out.String(), parallelLine)) != 1 {
		t.Errorf("output:\n%s", out.String())
	}
}

// The echo target runs every scenario without a broker.
func TestEcho(t *testing.T) {
	echo := bench.Target{Kind: bench.KindEcho}
	checkReqResp(t, tinyReqResp(echo))
	checkPubSub(t, bench.Config{Target: echo})
	res, err := bench.RunUsers(ctxFor(t), tinyUsers(echo))
	if err != nil {
		t.Fatalf("RunUsers: %v", err)
	}
	if res.Connected != 8 || res.Lost != 0 {
		t.Errorf("connected %d, lost %d", res.Connected, res.Lost)
	}
}

func tinyUsers(target bench.Target) bench.Config {
	return bench.Config{
		Target: target, Duration: 600 * time.Millisecond, Interval: 100 * time.Millisecond,
		Users: bench.UsersConfig{Users: 8, Ramp: 40, RequestRate: 20, PublishRate: 20},
	}
}

func checkUsers(t *testing.T, cfg bench.Config) *bench.UsersResult {
	t.Helper()
	res, err := bench.RunUsers(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunUsers: %v", err)
	}
	var out bytes.Buffer
	if err := res.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Logf("output:\n%s", text)
	if res.Connected != 8 || res.ConnectErrors != 0 {
		t.Errorf("connected %d, %d failed; want 8, 0", res.Connected, res.ConnectErrors)
	}
	if res.Requests == 0 || res.RequestErrors != 0 || res.Published == 0 || res.Delivered != res.Published {
		t.Errorf("requests %d (%d failed), published %d, delivered %d", res.Requests, res.RequestErrors, res.Published, res.Delivered)
	}
	// One per interval on a quiet machine (six here); a loaded one can
	// starve the sampler's ticker (two samples were seen at a load
	// average of 25), so the test asks for the table, not the count.
	if len(res.Samples) < 2 {
		t.Errorf("%d samples, want one per interval", len(res.Samples))
	}
	var maxUsers int64
	for _, s := range res.Samples {
		maxUsers = max(maxUsers, s.Users)
	}
	if maxUsers != 8 {
		t.Errorf("samples saw at most %d users, want 8", maxUsers)
	}
	if !strings.Contains(text, "t s  users") || !strings.Contains(text, "Connected 8 of 8 users") {
		t.Errorf("no interval table or connected line")
	}
	if !strings.Contains(text, "Kept up") && !strings.Contains(text, "Fell behind at") {
		t.Errorf("no verdict line")
	}
	return res
}

func TestUsersEmbedded(t *testing.T) {
	checkUsers(t, tinyUsers(bench.Target{Kind: bench.KindEmbedded}))
}

func TestUsersServer(t *testing.T) {
	checkUsers(t, tinyUsers(startServer(t)))
}

func TestUsersNoMapping(t *testing.T) {
	_, err := bench.RunUsers(ctxFor(t), bench.Config{Target: bench.Target{Kind: bench.KindAMQP, URL: "amqp://127.0.0.1:1/"},
		Users: bench.UsersConfig{Users: 1}, Duration: time.Second})
	if !errors.Is(err, bench.ErrNoMapping) {
		t.Errorf("users on amqp: %v, want ErrNoMapping", err)
	}
}

// Every scenario's JSON is one object that parses, with the shared
// report fields.
func TestJSON(t *testing.T) {
	for _, sc := range bench.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			cfg := tinyUsers(bench.Target{Kind: bench.KindEmbedded})
			cfg.Counts, cfg.Parallel, cfg.ParallelCount, cfg.Warmup = []int{20}, []int{2}, 40, 5
			cfg.Count, cfg.Subscribers = 50, 2
			cfg.Queue = bench.QueueConfig{Depth: 60, SampleEvery: 20, Window: 10}
			if sc.Name != "users" {
				cfg.Duration = 0
			}
			if sc.Name == "mgmt" {
				cfg.Duration, cfg.Mgmt.Queues = 500*time.Millisecond, 50
			}
			res, err := sc.Run(ctxFor(t), cfg)
			if err != nil {
				t.Fatalf("%s: %v", sc.Name, err)
			}
			var js bytes.Buffer
			if err := res.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			var back map[string]any
			dec := json.NewDecoder(&js)
			if err := dec.Decode(&back); err != nil {
				t.Fatalf("JSON: %v", err)
			}
			if dec.More() {
				t.Errorf("more than one JSON value")
			}
			for _, k := range []string{"scenario", "target", "usage", "samples", "broker_process"} {
				if _, ok := back[k]; !ok {
					t.Errorf("JSON has no %q", k)
				}
			}
			if back["scenario"] != sc.Name {
				t.Errorf("scenario %v", back["scenario"])
			}
			if len(res.Metrics()) == 0 {
				t.Errorf("no metrics")
			}
		})
	}
}

func TestPlotSVG(t *testing.T) {
	res, err := bench.RunUsers(ctxFor(t), tinyUsers(bench.Target{Kind: bench.KindEmbedded}))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"users.svg", "users.png"} {
		path := filepath.Join(t.TempDir(), name)
		if err := bench.WritePlotFile(path, res.Timeline()); err != nil {
			t.Fatalf("WritePlotFile: %v", err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(name, ".png") {
			if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
				t.Errorf("%s is not a PNG", name)
			}
			continue
		}
		checkSVG(t, b)
	}
	if err := bench.WritePlotFile(filepath.Join(t.TempDir(), "x.pdf"), res.Timeline()); err == nil {
		t.Errorf("a .pdf plot did not fail")
	}
}

// checkSVG checks that b is well-formed XML with an svg root element
// that holds lines (paths) and text.
func checkSVG(t *testing.T, b []byte) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	var root string
	elems := map[string]int{}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			elems[se.Name.Local]++
		}
	}
	if root != "svg" || elems["path"] < 5 || elems["text"] < 5 {
		t.Errorf("SVG root %q, %d paths, %d texts", root, elems["path"], elems["text"])
	}
}

func TestCompare(t *testing.T) {
	var log []string
	cmp, err := bench.Compare(ctxFor(t), bench.CompareConfig{
		Targets: []bench.Target{
			{Kind: bench.KindEmbedded},
			{Kind: bench.KindNATS, URL: "nats://127.0.0.1:1"}, // nothing listens on port 1
			{Kind: bench.KindEcho},
		},
		Cases:  []string{"reqresp", "fanin"},
		Config: bench.Config{Count: 200},
		Log:    func(l string) { log = append(log, l) },
	})
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	var out bytes.Buffer
	cmp.WriteText(&out)
	text := out.String()
	t.Logf("output:\n%s", text)
	if len(cmp.Targets) != 2 || len(cmp.Skipped) != 1 || !strings.Contains(cmp.Skipped[0], "Skipping NATS at nats://127.0.0.1:1: not reachable") {
		t.Errorf("targets %q, skipped %q", cmp.Targets, cmp.Skipped)
	}
	if !strings.Contains(text, "Courier embedded/echo") {
		t.Errorf("no ratio column")
	}
	var sawRate bool
	for _, r := range cmp.Rows {
		if r.Case == "fanin" && r.Metric == "delivered" {
			sawRate = true
		}
	}
	if !sawRate {
		t.Errorf("no fanin delivered row")
	}
	var js bytes.Buffer
	cmp.WriteJSON(&js)
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Errorf("JSON: %v", err)
	}
	if _, err := bench.Compare(ctxFor(t), bench.CompareConfig{Cases: []string{"nope"}}); err == nil {
		t.Errorf("an unknown case did not fail")
	}
}

// tinyChat is tinyUsers as a chat: 8 users in rooms of about 4, each in
// one or two rooms.
func tinyChat(target bench.Target, ws bool) bench.Config {
	cfg := tinyUsers(target)
	cfg.Users.RoomSize, cfg.Users.RoomsPerUser, cfg.Users.WS = 4, 2, ws
	return cfg
}

// checkChat runs a chat and checks that every message reached every user
// of its room that was there: more deliveries than publishes, none lost.
func checkChat(t *testing.T, cfg bench.Config) *bench.UsersResult {
	t.Helper()
	res, err := bench.RunUsers(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunUsers: %v", err)
	}
	var out bytes.Buffer
	res.WriteText(&out)
	t.Logf("output:\n%s", out.String())
	if res.Connected != 8 || res.ConnectErrors != 0 {
		t.Errorf("connected %d, %d failed; want 8, 0", res.Connected, res.ConnectErrors)
	}
	if res.Rooms < 2 || res.RoomSize != 4 {
		t.Errorf("%d rooms of %d, want at least 2 of 4", res.Rooms, res.RoomSize)
	}
	if res.Published == 0 || res.PublishErrors != 0 || res.Delivered <= res.Published || res.Lost != 0 {
		t.Errorf("published %d (%d failed), delivered %d, lost %d: want each message to its whole room", res.Published, res.PublishErrors, res.Delivered, res.Lost)
	}
	if !strings.Contains(out.String(), "Chat: ") {
		t.Errorf("no chat line")
	}
	return res
}

func TestUsersChatEcho(t *testing.T) {
	checkChat(t, tinyChat(bench.Target{Kind: bench.KindEcho}, false))
}

func TestUsersChatEmbedded(t *testing.T) {
	checkChat(t, tinyChat(bench.Target{Kind: bench.KindEmbedded}, false))
}

// TestUsersChatWebSocket: with WS every user dials the embedded node's
// WebSocket endpoint.
func TestUsersChatWebSocket(t *testing.T) {
	res := checkChat(t, tinyChat(bench.Target{Kind: bench.KindEmbedded}, true))
	if !res.WS {
		t.Errorf("the result does not say WebSocket")
	}
}

// TestUsersWebSocketURL: with WS and a URL, users dial that URL (here
// nothing listens there, so all of them fail), not the target.
func TestUsersWebSocketURL(t *testing.T) {
	cfg := tinyChat(bench.Target{Kind: bench.KindEmbedded}, true)
	cfg.Users.WSURL = "ws://127.0.0.1:1/ws"
	res, _ := bench.RunUsers(ctxFor(t), cfg)
	if res.Connected != 0 || res.ConnectErrors == 0 {
		t.Fatalf("connected %d, %d failed: want every user refused at ws://127.0.0.1:1", res.Connected, res.ConnectErrors)
	}
	if !strings.Contains(strings.Join(res.Notes, "\n"), "127.0.0.1:1") {
		t.Errorf("notes %q do not name the URL", res.Notes)
	}
}

// TestUsersChatServerWebSocket: against a server, users dial its
// WebSocket endpoint (--ws-url), which the server counts as its
// connections.
func TestUsersChatServerWebSocket(t *testing.T) {
	n, target := startNode(t, "127.0.0.1:0")
	cfg := tinyChat(target, true)
	cfg.Users.WSURL = "ws://" + n.HTTPAddr().String() + "/ws"
	checkChat(t, cfg)
}
