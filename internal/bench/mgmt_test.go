package bench_test

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/bench"
	"github.com/courier-mq/courier/internal/queue"
)

var (
	pollLine   = regexp.MustCompile(`^Poll latency p50 \d+\.\d\d ms, p90 \d+\.\d\d ms, p99 \d+\.\d\d ms, p99\.9 \d+\.\d\d ms, max \d+\.\d\d ms \((\d+) polls\)$`)
	figureLine = regexp.MustCompile(`^Figures exact: (\d+) answers checked, (\d+) depths compared, 0 wrong, 0 queues missing`)
)

func tinyMgmt(target bench.Target) bench.Config {
	return bench.Config{
		Target: target, Duration: 1500 * time.Millisecond,
		Mgmt: bench.MgmtConfig{Queues: 300, Hot: 3, Idle: 40, Trickle: 500, Poll: 50 * time.Millisecond},
	}
}

// checkMgmt runs the mgmt scenario and checks that the load ran, the API
// was polled, and every checked figure was exact.
func checkMgmt(t *testing.T, cfg bench.Config) *bench.MgmtResult {
	t.Helper()
	res, err := bench.RunMgmt(ctxFor(t), cfg)
	if err != nil {
		t.Fatalf("RunMgmt: %v", err)
	}
	text := textOf(t, res)
	if res.Confirmed == 0 || res.Delivered == 0 || res.TrickleConfirmed == 0 {
		t.Errorf("no load: %d confirmed, %d delivered, %d trickled", res.Confirmed, res.Delivered, res.TrickleConfirmed)
	}
	if res.SubmitErrors != 0 || res.PollErrors != 0 {
		t.Errorf("%d submit errors, %d poll errors; notes %q", res.SubmitErrors, res.PollErrors, res.Notes)
	}
	var want int64 // idle queues 3 to 42 hold 1+i%7 tasks each
	for i := 3; i < 43; i++ {
		want += int64(1 + i%7)
	}
	if res.Preloaded != want {
		t.Errorf("preloaded %d tasks, want %d", res.Preloaded, want)
	}
	if m := lines(text, pollLine); len(m) != 1 || m[0][1] == "0" {
		t.Errorf("poll latency line: %q", m)
	}
	if m := lines(text, figureLine); len(m) != 1 || m[0][1] == "0" {
		t.Errorf("figures line: %q", m)
	}
	// 300 queues of about 50 bytes each: {"name":"bench.mgmt.<pid>.q0000042","messages_ready":3}
	if res.ResponseBytes < 300*40 {
		t.Errorf("response of %d bytes for 300 queues", res.ResponseBytes)
	}
	if res.Handler == nil || res.Handler.Count != res.Polls {
		t.Errorf("server handler times %+v for %d polls", res.Handler, res.Polls)
	}
	if res.Wrong != 0 || res.Missing != 0 || res.Checks == 0 || res.Checked < res.Checks*int64(300-3) {
		t.Errorf("checks %d, checked %d, wrong %d, missing %d", res.Checks, res.Checked, res.Wrong, res.Missing)
	}
	return res
}

// textOf returns a result's text, and logs it.
func textOf(t *testing.T, res bench.Result) string {
	t.Helper()
	var out bytes.Buffer
	if err := res.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("output:\n%s", out.String())
	return out.String()
}

func TestMgmtEmbedded(t *testing.T) {
	checkMgmt(t, tinyMgmt(bench.Target{Kind: bench.KindEmbedded}))
}

// The scenario against a server: its queues are deleted at the end.
func TestMgmtServer(t *testing.T) {
	n, target := startNode(t, "127.0.0.1:0")
	cfg := tinyMgmt(target)
	cfg.Mgmt.HTTP = n.HTTPURL()
	checkMgmt(t, cfg)
	left := 0
	n.Broker().RangeQueues(func(q *queue.Queue, _ bool) bool { left++; return true })
	if left != 0 {
		t.Errorf("%d queues left on the server", left)
	}
}

func TestMgmtBadConfig(t *testing.T) {
	for _, cfg := range []bench.Config{
		{Target: bench.Target{Kind: bench.KindNATS, URL: "nats://127.0.0.1:1"}},
		{Mgmt: bench.MgmtConfig{Queues: -1}},
		{Mgmt: bench.MgmtConfig{Queues: 5, Hot: 6}},
		{Mgmt: bench.MgmtConfig{HTTP: "127.0.0.1:7480"}},
	} {
		if _, err := bench.RunMgmt(ctxFor(t), cfg); err == nil {
			t.Errorf("%+v: no error", cfg.Mgmt)
		}
	}
}
