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

func expectOK(t *testing.T, sink *chanSink) {
	t.Helper()
	if f := sink.next(t); f.Type != wire.TypeOK {
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
