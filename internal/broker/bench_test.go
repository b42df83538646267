package broker

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/courier-mq/courier/wire"
)

// holdSink keeps the last frame delivered to it.
type holdSink struct{ last *wire.Frame }

func (h *holdSink) Deliver(f *wire.Frame) {
	if h.last != nil {
		h.last.Release()
	}
	h.last = f
}

// BenchmarkRouteRequest measures the broker alone routing one request to
// a round-robin handler and its response back: no connections, no
// goroutines, so what it allocates is the broker's own.
func BenchmarkRouteRequest(b *testing.B) {
	br := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer br.Close()
	reqSink, hSink := &holdSink{}, &holdSink{}
	req, h := br.Open(reqSink, "requester"), br.Open(hSink, "handler")
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: RoundRobin})
	req.Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "ping", Body: cfg})
	h.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "ping", Aux: wire.RoleHandler})
	body := []byte("ping")
	b.ReportAllocs()
	for i := uint64(1); b.Loop(); i++ {
		f := wire.NewFrame(wire.TypeRequest)
		f.Ref, f.Name, f.Body = i, "ping", body
		req.Handle(f)
		in := hSink.last
		if in == nil || in.Type != wire.TypeRequest {
			b.Fatalf("handler got %+v", in)
		}
		r := wire.NewFrame(wire.TypeResponse)
		r.Ref, r.Body = in.Ref, body
		h.Handle(r)
		if out := reqSink.last; out == nil || out.Type != wire.TypeResponse || out.Ref != i {
			b.Fatalf("requester got %+v", out)
		}
	}
}

// BenchmarkPublishFanOut10 measures the broker routing one publication to
// ten subscribers.
func BenchmarkPublishFanOut10(b *testing.B) {
	br := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer br.Close()
	pub := br.Open(&holdSink{}, "publisher")
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternPubSub})
	pub.Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "news", Body: cfg})
	spec, _ := json.Marshal(wire.AttachSpec{Patterns: []string{"eu.#"}})
	for range 10 {
		s := br.Open(&holdSink{}, "subscriber")
		s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "news", Aux: wire.RoleSubscriber, Body: spec})
	}
	body := make([]byte, 128)
	b.ReportAllocs()
	for b.Loop() {
		f := wire.NewFrame(wire.TypePublish)
		f.Name, f.Key, f.Body = "news", "eu.fr.paris", body
		pub.Handle(f)
	}
	b.ReportMetric(float64(b.N*10)/b.Elapsed().Seconds(), "deliveries/s")
}

// BenchmarkRouteFun is BenchmarkRouteRequest on a fun exchange: the
// evaluation of a typical route expression on each request (the first
// two read the same in expr-lang, for a comparison with it), and one with
// a loop, which runs under a deadline and in an evaluation slot.
func BenchmarkRouteFun(b *testing.B) {
	for _, src := range []string{
		`{"key": key + "!"}`,
		`size > 1000 ? {"reject": "too big"} : {"tag": "eu"}`,
		`members.exists(m, m.tag == "eu") ? {"tag": "eu"} : {"reject": "no eu"}`,
	} {
		b.Run(src, func(b *testing.B) {
			br := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			defer br.Close()
			reqSink, hSink := &holdSink{}, &holdSink{}
			req, h := br.Open(reqSink, "requester"), br.Open(hSink, "handler")
			cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: Fun, RouteExpr: src})
			req.Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "ping", Body: cfg})
			h.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "ping", Aux: wire.RoleHandler, Tag: "eu"})
			body := []byte("ping")
			b.ReportAllocs()
			for i := uint64(1); b.Loop(); i++ {
				f := wire.NewFrame(wire.TypeRequest)
				f.Ref, f.Name, f.Key, f.Body = i, "ping", "k", body
				req.Handle(f)
				in := hSink.last
				if in == nil || in.Type != wire.TypeRequest {
					b.Fatalf("handler got %+v, requester %+v", in, reqSink.last)
				}
				r := wire.NewFrame(wire.TypeResponse)
				r.Ref, r.Body = in.Ref, body
				h.Handle(r)
				if out := reqSink.last; out == nil || out.Type != wire.TypeResponse || out.Ref != i {
					b.Fatalf("requester got %+v", out)
				}
			}
		})
	}
}

// BenchmarkExprDeadline measures what the deadline costs an expression
// with a loop: its evaluation as the broker runs it (a context with a
// timeout, checked between iterations) and without.
func BenchmarkExprDeadline(b *testing.B) {
	e, err := compileExpr(`members.exists(m, m.tag == "eu") ? {"tag": "eu"} : {"reject": "no eu"}`, exprLimits{cost: DefaultExprCost, time: DefaultExprTime})
	if err != nil {
		b.Fatal(err)
	}
	in := &RouteInput{Key: "k", Members: []wire.Member{{ID: "c1.1", ServiceTag: "us"}, {ID: "c2.1", ServiceTag: "eu"}}}
	b.Run("deadline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.route(&exprVars{in: in}, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("none", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := e.prog.Eval(&exprVars{in: in}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkTopicMatch measures the topic tree alone, without the
// exchange's cache of matches per key: 1,000 subscribers with a pattern
// each among literal, '*' and '#' ones, matched against keys of one to
// four words, the empty key and keys with empty words among them.
func BenchmarkTopicMatch(b *testing.B) {
	tr := newTopicTree()
	for i := range 1000 {
		a := fakeMember(fmt.Sprint(i))
		switch i % 4 {
		case 0:
			tr.insert(fmt.Sprintf("eu.c%d.city", i), a)
		case 1:
			tr.insert(fmt.Sprintf("eu.*.c%d", i), a)
		case 2:
			tr.insert(fmt.Sprintf("c%d.#", i), a)
		default:
			tr.insert(fmt.Sprintf("#.c%d", i), a)
		}
	}
	tr.insert("#", fakeMember("all"))
	keys := []string{"eu.c4.city", "eu.x.c5", "c6.a.b.c", "a.b.c7", "", "eu..c9", "x"}
	var out []*Attachment
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		out = tr.match(keys[i%len(keys)], out[:0])
		if len(out) == 0 {
			b.Fatal("no match")
		}
	}
}

// nopPeers is node links that lead nowhere: a broker with them is in a
// cluster of one, where every exchange is homed locally.
type nopPeers struct{}

func (nopPeers) Send(string, *wire.Frame) error        { return nil }
func (nopPeers) SendControl(string, *wire.Frame) error { return nil }

// BenchmarkRouteRequestClustered is BenchmarkRouteRequest on a broker
// with node links (SetPeers): its exchanges keep views, and the request
// routes to a local handler, which should cost what it does alone.
func BenchmarkRouteRequestClustered(b *testing.B) {
	br := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer br.Close()
	br.SetPeers(nopPeers{})
	reqSink, hSink := &holdSink{}, &holdSink{}
	req, h := br.Open(reqSink, "requester"), br.Open(hSink, "handler")
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: RoundRobin})
	req.Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "ping", Body: cfg})
	h.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "ping", Aux: wire.RoleHandler})
	if br.Exchange("ping").cl == nil {
		b.Fatal("the exchange keeps no view")
	}
	body := []byte("ping")
	b.ReportAllocs()
	for i := uint64(1); b.Loop(); i++ {
		f := wire.NewFrame(wire.TypeRequest)
		f.Ref, f.Name, f.Body = i, "ping", body
		req.Handle(f)
		in := hSink.last
		if in == nil || in.Type != wire.TypeRequest {
			b.Fatalf("handler got %+v", in)
		}
		r := wire.NewFrame(wire.TypeResponse)
		r.Ref, r.Body = in.Ref, body
		h.Handle(r)
		if out := reqSink.last; out == nil || out.Type != wire.TypeResponse || out.Ref != i {
			b.Fatalf("requester got %+v", out)
		}
	}
}
