package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
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
	quiet := slog.New(slog.DiscardHandler)
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	target, err := bench.ParseTarget(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	return target
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
