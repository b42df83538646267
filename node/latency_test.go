package node_test

import (
	"errors"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// TestRequestLatency: a request-response exchange counts each request
// once in its latency histogram when its last response leaves: a
// unicast request, a broadcast to two handlers, a chunked response, an
// error response. A request that found no handler is not counted, and
// other patterns have no histogram.
func TestRequestLatency(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := testutil.Context(t, 20*time.Second)
	count := func(name string) uint64 {
		var s broker.LatencySnapshot
		n.Broker().Exchange(name).Latency().AddTo(&s)
		return s.Count()
	}
	h := n.Connect()
	rr, err := h.ReqResp(ctx, "rr", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rr.Handle(ctx, func(r *courier.Request) {
		switch string(r.Body()) {
		case "stream":
			r.Chunk([]byte("a"))
			r.Chunk([]byte("b"))
			r.End()
		case "fail":
			r.Fail(errors.New("no"))
		default:
			r.Reply([]byte("pong"))
		}
	}); err != nil {
		t.Fatal(err)
	}
	bc, err := h.ReqResp(ctx, "bc", courier.Broadcast)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := bc.Handle(ctx, func(r *courier.Request) { r.Reply([]byte("pong")) }); err != nil {
			t.Fatal(err)
		}
	}
	c := n.Connect()
	req, _ := c.ReqResp(ctx, "rr")
	for range 5 {
		if _, err := req.Request(ctx, courier.Message{Body: []byte("ping")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := req.Request(ctx, courier.Message{Body: []byte("fail")}); err == nil {
		t.Fatal("a failed request did not fail")
	}
	st, err := req.RequestStream(ctx, courier.Message{Body: []byte("stream")})
	if err != nil {
		t.Fatal(err)
	}
	for st.Next() {
	}
	if st.Err() != nil {
		t.Fatal(st.Err())
	}
	breq, _ := c.ReqResp(ctx, "bc")
	for range 3 {
		if rs, err := breq.RequestAll(ctx, courier.Message{Body: []byte("ping")}); err != nil || len(rs) != 2 {
			t.Fatalf("broadcast: %d responses, %v", len(rs), err)
		}
	}
	if got := count("rr"); got != 7 {
		t.Errorf("rr: %d requests in the histogram, want 7", got)
	}
	if got := count("bc"); got != 3 {
		t.Errorf("bc: %d requests in the histogram, want 3", got)
	}
	empty, _ := c.ReqResp(ctx, "empty", courier.RoundRobin)
	if _, err := empty.Request(ctx, courier.Message{Body: []byte("ping")}); err == nil {
		t.Fatal("a request without handler did not fail")
	}
	if got := count("empty"); got != 0 {
		t.Errorf("empty: %d requests in the histogram, want 0", got)
	}
	if _, err := c.PubSub(ctx, "news"); err != nil {
		t.Fatal(err)
	}
	if n.Broker().Exchange("news").Latency() != nil {
		t.Errorf("a pub-sub exchange has a request latency histogram")
	}
}
