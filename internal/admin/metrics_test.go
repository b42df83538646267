package admin_test

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/testutil"
)

// metric returns the value of the series named exactly series (with its
// labels) in a Prometheus text body; ok is false when it is absent.
func metric(body []byte, series string) (float64, bool) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindSubmatch(body)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	return v, err == nil
}

// TestMetricsRequestsStoreMemory: /metrics has the request latency
// histogram (kept after its exchange is deleted), the memory budget and
// the store's figures, with the fsync histogram; /metrics/per-object
// the exchange's latency.
func TestMetricsRequestsStoreMemory(t *testing.T) {
	h := start(t)
	ctx := testutil.Context(t, 10*time.Second)
	c := h.conn()
	rr, err := c.ReqResp(ctx, "ping", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rr.Handle(ctx, func(r *courier.Request) { r.Reply([]byte("pong")) }); err != nil {
		t.Fatal(err)
	}
	for range 7 {
		if _, err := rr.Request(ctx, courier.Message{Body: []byte("ping")}); err != nil {
			t.Fatal(err)
		}
	}
	tasks, err := c.Tasks(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.Submit(ctx, courier.Task{Body: []byte("job")}); err != nil {
		t.Fatal(err)
	}
	h.tick(time.Second)

	_, _, body := h.do("GET", "/metrics", "")
	want := map[string]func(float64) bool{
		"courier_request_duration_seconds_count":                 func(v float64) bool { return v == 7 },
		`courier_request_duration_seconds_bucket{le="+Inf"}`:     func(v float64) bool { return v == 7 },
		`courier_request_duration_seconds_bucket{le="1e-06"}`:    func(v float64) bool { return v <= 7 },
		"courier_request_duration_seconds_sum":                   func(v float64) bool { return v > 0 },
		"courier_memory_budget_bytes":                            func(v float64) bool { return v > 0 },
		"courier_memory_high_watermark_bytes":                    func(v float64) bool { return v > 0 },
		"courier_memory_budget_used_bytes":                       func(v float64) bool { return v > 0 },
		"courier_memory_throttle_level":                          func(v float64) bool { return v == 0 },
		"courier_store_sync_duration_seconds_count":              func(v float64) bool { return v >= 1 },
		`courier_store_sync_duration_seconds_bucket{le="+Inf"}`:  func(v float64) bool { return v >= 1 },
		"courier_store_segments":                                 func(v float64) bool { return v >= 1 },
		"courier_store_live_records":                             func(v float64) bool { return v >= 1 },
		"courier_store_records_total":                            func(v float64) bool { return v >= 1 },
		"courier_store_appended_bytes_total":                     func(v float64) bool { return v > 0 },
		`courier_alarm{kind="memory"}`:                           func(v float64) bool { return v == 0 },
		`courier_store_sync_duration_seconds_bucket{le="5e-05"}`: func(v float64) bool { return v >= 0 },
		`courier_request_duration_seconds_bucket{le="8.388608"}`: func(v float64) bool { return v == 7 },
	}
	for series, ok := range want {
		if v, found := metric(body, series); !found || !ok(v) {
			t.Errorf("/metrics %s = %v (found %v)", series, v, found)
		}
	}
	_, _, body = h.do("GET", "/metrics/per-object", "")
	if v, _ := metric(body, `courier_exchange_request_duration_seconds_count{exchange="ping"}`); v != 7 {
		t.Errorf("per-object latency count of ping %v, want 7", v)
	}
	if _, found := metric(body, `courier_exchange_request_duration_seconds_count{exchange="jobs"}`); found {
		t.Errorf("a task exchange has a request latency histogram")
	}

	// The node's histogram keeps the requests of a deleted exchange.
	if err := c.DeleteExchange(ctx, "ping"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, _, body = h.do("GET", "/metrics", "")
		if v, _ := metric(body, "courier_request_duration_seconds_count"); v != 7 {
			t.Errorf("after the exchange was deleted: %v requests, want 7", v)
		}
		h.tick(time.Second)
	}
}

// TestMetricsQueueTotals: the node's queue publish and deliver totals
// keep what deleted queues counted.
func TestMetricsQueueTotals(t *testing.T) {
	fq := &fakeQueues{q: map[string]*admin.QueueInfo{}}
	h := start(t, func(c *admin.Config) { c.Queues = fq })
	fq.set(admin.QueueInfo{Name: "jobs", Publish: 10, Deliver: 4, Ack: 2})
	fq.set(admin.QueueInfo{Name: "mail", Publish: 5, Deliver: 5, Ack: 5})
	h.tick(time.Second)
	check := func(when string) {
		t.Helper()
		_, _, body := h.do("GET", "/metrics", "")
		for series, want := range map[string]float64{"courier_queue_publishes_total": 15, "courier_queue_deliveries_total": 9, "courier_acks_total": 7} {
			if v, _ := metric(body, series); v != want {
				t.Errorf("%s: %s = %v, want %v", when, series, v, want)
			}
		}
	}
	check("two queues")
	fq.DeleteQueue("mail")
	check("mail deleted, before a sample")
	h.tick(time.Second)
	check("mail deleted, after a sample")
}
