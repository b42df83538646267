package broker

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/wire"
)

// TestHandlerGetsTimeRemaining: a handler receives what remains of the
// request's deadline when it is delivered, not the timeout the requester
// sent: here a routing function (a redirect to another exchange) takes
// 300 ms of a 10 s deadline, and the handler's Aux is at most 9,700 ms.
// Deadlines never travel as a clock reading, so clocks that differ
// between machines (nodes of a cluster) cannot change them.
func TestHandlerGetsTimeRemaining(t *testing.T) {
	b := New(Config{Node: "n1", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer b.Close()
	const spent = 300 * time.Millisecond
	fun := Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: Fun}, RouteFunc: func(*courier.RouteInput) (courier.Route, error) {
		time.Sleep(spent) // routing that takes its time: the point of the test, not a wait
		return courier.Route{Redirect: "work"}, nil
	}}
	if _, err := b.Declare("front", fun); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Declare("work", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: RoundRobin}}); err != nil {
		t.Fatal(err)
	}
	var handler eventSink
	h := b.Open(&handler, "handler")
	h.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "front", Aux: wire.RoleHandler})
	h.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 2, Attach: 2, Name: "work", Aux: wire.RoleHandler})
	var requester eventSink
	req := b.Open(&requester, "requester")
	for _, tc := range []struct{ aux, max uint64 }{{10_000, 10_000 - uint64(spent/time.Millisecond)}, {0, 0}} {
		req.Handle(&wire.Frame{Type: wire.TypeRequest, Ref: 7 + tc.aux, Name: "front", Aux: tc.aux, Body: []byte("x")})
		got := handler.requests()
		if len(got) != 1 || got[0].Attach != 2 {
			t.Fatalf("handler received %d requests, want 1; the requester got %+v", len(got), requester.frames)
		}
		if aux := got[0].Aux; aux > tc.max || tc.aux != 0 && aux == 0 {
			t.Errorf("deadline %d ms: the handler got Aux %d ms, want 1 to %d", tc.aux, aux, tc.max)
		}
		handler.reset()
	}
}
