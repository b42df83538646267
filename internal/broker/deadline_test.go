package broker

import (
	"io"
	"log/slog"
	"sync"
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

// stuckSink is a requester's connection that reads nothing: every
// RESPONSE waits until the test ends, as a client's Deliver waits up to
// the slow-consumer timeout for room in its outbox.
type stuckSink struct{ release chan struct{} }

func (s stuckSink) Deliver(f *wire.Frame) {
	if f.Type == wire.TypeResponse {
		<-s.release
	}
	f.Release()
}

// refSink records the refs and codes of the RESPONSEs it gets.
type refSink struct {
	mu   sync.Mutex
	code map[uint64]uint64
}

func (s *refSink) Deliver(f *wire.Frame) {
	if f.Type == wire.TypeResponse {
		s.mu.Lock()
		s.code[f.Ref] = f.Aux
		s.mu.Unlock()
	}
	f.Release()
}

func (s *refSink) got(ref uint64) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.code[ref]
	return c, ok
}

// TestStuckRequesterHoldsNoOtherDeadline: the sweep that fails requests
// at their deadline does not wait for one requester's connection. A
// requester that reads nothing holds the timeout RESPONSE of its own
// request; another requester's requests still get theirs at their
// deadline (within the sweep's 100 ms, and a tolerance for a loaded
// machine), round after round. Before, the sweep delivered every
// timeout itself and stopped at the first requester that did not read,
// for up to the slow-consumer timeout (here, for good): every request
// of the node then outlived its deadline.
func TestStuckRequesterHoldsNoOtherDeadline(t *testing.T) {
	b := New(Config{Node: "n1", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer b.Close()
	if _, err := b.Declare("slow", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: RoundRobin}}); err != nil {
		t.Fatal(err)
	}
	var handler eventSink // takes requests and never answers
	h := b.Open(&handler, "handler")
	h.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "slow", Aux: wire.RoleHandler})
	stuck := stuckSink{release: make(chan struct{})}
	defer close(stuck.release)
	sr := b.Open(stuck, "stuck requester")
	good := &refSink{code: map[uint64]uint64{}}
	gr := b.Open(good, "requester")
	const deadline = 100 * time.Millisecond
	const tolerance = 5 * time.Second // the machine is loaded; the sweep runs every 100 ms
	for round := range uint64(3) {
		sr.Handle(&wire.Frame{Type: wire.TypeRequest, Ref: 100 + round, Name: "slow", Aux: uint64(deadline / time.Millisecond)})
		start := time.Now()
		gr.Handle(&wire.Frame{Type: wire.TypeRequest, Ref: 200 + round, Name: "slow", Aux: uint64(deadline / time.Millisecond)})
		for {
			code, ok := good.got(200 + round)
			if ok {
				if wire.Code(code) != wire.CodeTimeout {
					t.Fatalf("round %d: the request failed with code %d, want %d (timeout)", round, code, wire.CodeTimeout)
				}
				break
			}
			if time.Since(start) > deadline+tolerance {
				t.Fatalf("round %d: no timeout %v after a request with a %v deadline: the sweep waits for a requester that does not read", round, time.Since(start), deadline)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
