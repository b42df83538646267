package broker

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"testing"

	"github.com/courier-mq/courier/wire"
)

// heapAfterGC returns the bytes of live heap objects after a full GC.
func heapAfterGC() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// subscribeMany attaches atts subscribers of exchange ex to s, each with
// per patterns of shape (which takes the attachment's number and the
// pattern's), and fails unless every one is accepted.
func subscribeMany(t *testing.T, s *Session, sink *chanSink, ex string, atts, per int, shape string) {
	t.Helper()
	for i := range atts {
		id := uint32(i + 1)
		s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: id, Name: ex, Aux: wire.RoleSubscriber})
		expectOK(t, sink)
		ps := make([]string, per)
		for j := range ps {
			ps[j] = fmt.Sprintf(shape, i, j)
		}
		body, _ := json.Marshal(wire.PatternsBody{Patterns: ps})
		s.Handle(&wire.Frame{Type: wire.TypeSubscribe, Ref: 2, Attach: id, Body: body})
		expectOK(t, sink)
	}
}

// reply returns the next frame delivered to sink that is not an EVENT.
func reply(t *testing.T, sink *chanSink) *wire.Frame {
	t.Helper()
	for {
		if f := sink.next(t); f.Type != wire.TypeEvent {
			return f
		}
	}
}

func expectOK(t *testing.T, sink *chanSink) {
	t.Helper()
	if f := reply(t, sink); f.Type != wire.TypeOK {
		t.Fatalf("got %s %q (code %d), want OK", f.Type, f.Tag, f.Aux)
	}
}

// TestPatternMemoryFreed: the memory of a connection's patterns goes back
// once it closes, or once it unsubscribes them: the topic tree prunes the
// nodes no pattern uses any more, and does not keep the room of maps
// that grew and emptied.
func TestPatternMemoryFreed(t *testing.T) {
	b := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer b.Close()
	adm := b.Open(dropSink{}, "admin")
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternPubSub})
	adm.Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "m", Body: cfg})

	// 10 attachments × 1,000 patterns, the default limits of one
	// connection, each pattern with words of its own.
	const atts, per = 10, 1000
	for _, how := range []string{"close", "unsubscribe"} {
		t.Run(how, func(t *testing.T) {
			shape := how + ".u%d.%d.a.b.c.d.e.f.g"
			base := heapAfterGC()
			sink := newChanSink()
			s := b.Open(sink, "subscriber")
			subscribeMany(t, s, sink, "m", atts, per, shape)
			grown := heapAfterGC() - base
			if grown < 4<<20 {
				t.Fatalf("%d patterns took only %d bytes: the test measures nothing", atts*per, grown)
			}
			if how == "close" {
				s.Close()
			} else {
				for i := range atts {
					ps := make([]string, per)
					for j := range ps {
						ps[j] = fmt.Sprintf(shape, i, j)
					}
					body, _ := json.Marshal(wire.PatternsBody{Patterns: ps})
					s.Handle(&wire.Frame{Type: wire.TypeUnsubscribe, Ref: 3, Attach: uint32(i + 1), Body: body})
					expectOK(t, sink)
				}
			}
			ex := b.Exchange("m")
			ex.subMu.RLock()
			nodes := ex.subs.nodes
			ex.subMu.RUnlock()
			if nodes != 0 || s.Patterns() != 0 || b.PatternStats() != (PatternStats{}) {
				t.Fatalf("after %s: %d tree nodes, %d patterns counted for the session, %+v for the node; want none",
					how, nodes, s.Patterns(), b.PatternStats())
			}
			kept := heapAfterGC() - base
			t.Logf("%d patterns: %d bytes, %d bytes a pattern; %d bytes kept after %s", atts*per, grown, grown/(atts*per), kept, how)
			// The session, if open, and its attachments stay: a few KB.
			if kept > grown/20 {
				t.Fatalf("after %s, %d of the %d bytes the patterns took are kept", how, kept, grown)
			}
			s.Close()
		})
	}
}

// TestPatternBytesEstimate: the memory the node accounts for patterns
// (PatternStats.Bytes) is within a third of what they take on the heap,
// for patterns that share most of their words and for patterns whose
// every word is their own.
func TestPatternBytesEstimate(t *testing.T) {
	b := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer b.Close()
	adm := b.Open(dropSink{}, "admin")
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternPubSub})
	adm.Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "m", Body: cfg})
	for _, shape := range []string{
		"prices.%d.%d",
		"org.acme.region%d.host%d.cpu.#",
		"x%d.y%d.a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z.aa.bb.cc.dd",
		"%d.%d.*.tail-of-a-pattern-with-long-words-in-it.and-another-one-of-them",
	} {
		base := heapAfterGC()
		sink := newChanSink()
		s := b.Open(sink, "subscriber")
		subscribeMany(t, s, sink, "m", 10, 1000, shape)
		grown := heapAfterGC() - base
		est := b.PatternStats().Bytes
		t.Logf("%s: %d bytes on the heap, %d estimated (%.2f)", shape, grown, est, float64(est)/float64(grown))
		if est < grown*2/3 || est > grown*4/3 {
			t.Errorf("%s: %d bytes estimated for the %d the patterns take", shape, est, grown)
		}
		s.Close()
	}
}

// TestPatternAccounting: the patterns of a subscription asked of a
// controller count against the limits until it decides, and no longer
// once it refuses or its decision would pass a limit; a deleted
// exchange's patterns no longer count; a durable subscription's count
// against the attachment's limit and the node's total, and against the
// connection of each subscriber while it is attached, whoever changes
// the binding.
func TestPatternAccounting(t *testing.T) {
	b := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), MaxPatternsPerAttachment: 3, MaxPatternsPerConnection: 4})
	defer b.Close()
	adm := b.Open(dropSink{}, "admin")
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternPubSub, Controlled: true})
	adm.Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "cx", Body: cfg})
	adm.Handle(declareFrame(2, "dx", wire.PatternPubSub))
	ctlSink, subSink := newChanSink(), newChanSink()
	ctl, s := b.Open(ctlSink, "controller"), b.Open(subSink, "subscriber")
	ctl.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "cx", Aux: wire.RoleController})
	expectOK(t, ctlSink)
	for id := uint32(1); id <= 2; id++ {
		s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: id, Name: "cx", Aux: wire.RoleSubscriber})
		expectOK(t, subSink)
	}
	drain := func(sink *chanSink) {
		for len(sink.ch) > 0 {
			<-sink.ch
		}
	}
	drain(ctlSink) // member events
	subscribe := func(ref uint64, id uint32, ps ...string) {
		body, _ := json.Marshal(wire.PatternsBody{Patterns: ps})
		s.Handle(&wire.Frame{Type: wire.TypeSubscribe, Ref: ref, Attach: id, Body: body})
	}
	asked := func() uint64 {
		t.Helper()
		f := reply(t, ctlSink)
		if f.Type != wire.TypeSubRequest {
			t.Fatalf("controller got %s, want SUBREQUEST", f.Type)
		}
		return f.Ref
	}
	decide := func(token uint64, verdict uint64, ps ...string) {
		f := &wire.Frame{Type: wire.TypeDecision, Ref: token, Attach: 1, Aux: verdict}
		if ps != nil {
			f.Body, _ = json.Marshal(wire.PatternsBody{Patterns: ps})
		}
		ctl.Handle(f)
	}
	counts := func(conn, node int64) {
		t.Helper()
		if got, all := s.Patterns(), b.PatternStats().Patterns; got != conn || all != node {
			t.Fatalf("%d patterns counted for the connection and %d for the node, want %d and %d", got, all, conn, node)
		}
	}

	subscribe(2, 1, "a", "b")
	token := asked()
	counts(2, 0) // reserved, not yet subscribed
	subscribe(3, 2, "c", "d", "e")
	wantCode(t, reply(t, subSink), wire.TypeError, 3, wire.CodeTooManyPatterns)
	ctlSink.empty(t) // the controller was not asked
	decide(token, wire.VerdictAccept, "a", "b", "x", "y")
	wantCode(t, reply(t, subSink), wire.TypeError, 2, wire.CodeTooManyPatterns)
	wantCode(t, reply(t, ctlSink), wire.TypeError, 0, wire.CodeTooManyPatterns)
	counts(0, 0)
	subscribe(4, 1, "a")
	decide(asked(), wire.VerdictRefuse)
	wantCode(t, reply(t, subSink), wire.TypeError, 4, wire.CodeRejected)
	counts(0, 0)
	subscribe(5, 1, "a", "b")
	decide(asked(), wire.VerdictAccept)
	expectOK(t, subSink)
	counts(2, 2)
	subscribe(6, 2, "c", "d")
	subscribe(7, 2, "e") // 2 + 2 reserved + 1
	wantCode(t, reply(t, subSink), wire.TypeError, 7, wire.CodeTooManyPatterns)
	asked()
	counts(4, 2)
	if err := b.Delete("cx"); err != nil {
		t.Fatal(err)
	}
	drain(subSink)
	counts(0, 0)
	if st := b.PatternStats(); st.Bytes != 0 {
		t.Fatalf("%d bytes of patterns counted after the exchange was deleted", st.Bytes)
	}

	spec := func(ps ...string) []byte {
		body, _ := json.Marshal(wire.AttachSpec{Durable: "d1", Patterns: ps})
		return body
	}
	s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 8, Attach: 3, Name: "dx", Aux: wire.RoleSubscriber, Body: spec("p.1", "p.2", "p.3", "p.4")})
	wantCode(t, reply(t, subSink), wire.TypeError, 8, wire.CodeTooManyPatterns)
	s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 9, Attach: 3, Name: "dx", Aux: wire.RoleSubscriber, Body: spec("p.1", "p.2", "p.3", "p.3")})
	expectOK(t, subSink)
	counts(3, 3)
	otherSink := newChanSink()
	other := b.Open(otherSink, "other")
	other.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "dx", Aux: wire.RoleSubscriber, Body: spec()})
	expectOK(t, otherSink)
	body, _ := json.Marshal(wire.PatternsBody{Patterns: []string{"p.1", "p.2"}})
	other.Handle(&wire.Frame{Type: wire.TypeUnsubscribe, Ref: 2, Attach: 1, Body: body})
	expectOK(t, otherSink)
	if other.Patterns() != 1 {
		t.Fatalf("%d patterns counted for the other connection, want the binding's 1", other.Patterns())
	}
	counts(1, 1)
	subscribe(10, 3, "q.1", "q.2")
	expectOK(t, subSink)
	counts(3, 3)
	if other.Patterns() != 3 {
		t.Fatalf("%d patterns counted for the other connection, want the binding's 3", other.Patterns())
	}
	if err := b.DeleteQueue("dx/d1"); err != nil {
		t.Fatal(err)
	}
	counts(0, 0)
	if other.Patterns() != 0 {
		t.Fatalf("%d patterns counted for the other connection after the deletion", other.Patterns())
	}
}
