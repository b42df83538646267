package broker

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
)

// fakePolicy grants fixed permissions per user and exchange; set changes
// them and moves the version, as a reload does.
type fakePolicy struct {
	mu      sync.Mutex // guards perms
	perms   map[string]auth.Perm
	version atomic.Uint64
	asked   atomic.Int64
}

func newFakePolicy() *fakePolicy {
	p := &fakePolicy{perms: map[string]auth.Perm{}}
	p.version.Store(1)
	return p
}

func (p *fakePolicy) Version() uint64 { return p.version.Load() }

func (p *fakePolicy) Perms(user, exchange string) auth.Perm {
	p.asked.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.perms[user+"/"+exchange]
}

func (p *fakePolicy) set(user, exchange string, perm auth.Perm) {
	p.mu.Lock()
	p.perms[user+"/"+exchange] = perm
	p.mu.Unlock()
	p.version.Add(1)
}

// chanSink collects every frame delivered to a session.
type chanSink struct{ ch chan *wire.Frame }

func newChanSink() *chanSink { return &chanSink{ch: make(chan *wire.Frame, 1024)} }

func (c *chanSink) Deliver(f *wire.Frame) { c.ch <- f.Clone(); f.Release() }

// next returns the next frame delivered, or fails.
func (c *chanSink) next(t *testing.T) *wire.Frame {
	t.Helper()
	select {
	case f := <-c.ch:
		return f
	default:
		t.Fatal("no frame delivered")
		return nil
	}
}

func (c *chanSink) empty(t *testing.T) {
	t.Helper()
	select {
	case f := <-c.ch:
		t.Fatalf("unexpected %s frame: Ref %d Aux %d Tag %q", f.Type, f.Ref, f.Aux, f.Tag)
	default:
	}
}

func declareFrame(ref uint64, name, pattern string) *wire.Frame {
	body, _ := json.Marshal(wire.ExchangeConfig{Pattern: pattern})
	return &wire.Frame{Type: wire.TypeDeclare, Ref: ref, Name: name, Body: body}
}

func wantCode(t *testing.T, f *wire.Frame, typ wire.Type, ref uint64, code wire.Code) {
	t.Helper()
	if f.Type != typ || f.Ref != ref || wire.Code(f.Aux) != code {
		t.Fatalf("got %s Ref %d code %d (%q), want %s Ref %d code %d", f.Type, f.Ref, f.Aux, f.Tag, typ, ref, code)
	}
	if f.Flags&wire.FlagFatal != 0 {
		t.Fatalf("%s with code %d is fatal: a denial must end only its operation", f.Type, code)
	}
}

// TestPermissionsPerOp: each operation without its permission gets code
// 17 for that operation alone; the session and its other attachments go
// on working.
func TestPermissionsPerOp(t *testing.T) {
	var logs bytes.Buffer
	b := New(Config{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	defer b.Close()
	admin := b.Open(dropSink{}, "admin")
	admin.Handle(declareFrame(1, "news", wire.PatternPubSub))
	admin.Handle(declareFrame(2, "secret", wire.PatternPubSub))
	admin.Handle(declareFrame(3, "svc", wire.PatternReqResp))

	pol := newFakePolicy()
	pol.set("bob", "news", auth.Read|auth.Write)
	pol.set("bob", "svc", auth.Read)
	sink := newChanSink()
	s := b.OpenAs(sink, "bob-client", "bob", pol)
	if s.User() != "bob" {
		t.Fatalf("User() = %q", s.User())
	}

	// Allowed: subscribe to news, and a handler on svc.
	s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 10, Attach: 1, Name: "news", Aux: wire.RoleSubscriber, Body: []byte(`{"patterns":["#"]}`)})
	wantCode(t, sink.next(t), wire.TypeOK, 10, 0)
	s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 11, Attach: 2, Name: "svc", Aux: wire.RoleHandler})
	if f := sink.next(t); f.Type == wire.TypeEvent {
		wantCode(t, sink.next(t), wire.TypeOK, 11, 0)
	} else {
		wantCode(t, f, wire.TypeOK, 11, 0)
	}

	// Denied, each for its own op.
	s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 12, Attach: 3, Name: "secret", Aux: wire.RoleSubscriber})
	wantCode(t, sink.next(t), wire.TypeError, 12, wire.CodeUnauthorized)
	s.Handle(&wire.Frame{Type: wire.TypePublish, Ref: 13, Flags: wire.FlagReply, Name: "secret", Key: "k", Body: []byte("x")})
	wantCode(t, sink.next(t), wire.TypeError, 13, wire.CodeUnauthorized)
	s.Handle(&wire.Frame{Type: wire.TypeRequest, Ref: 14, Name: "svc", Body: []byte("q")})
	f := sink.next(t)
	if f.Type != wire.TypeResponse || f.Flags&wire.FlagError == 0 || wire.Code(f.Aux) != wire.CodeUnauthorized || f.Ref != 14 {
		t.Fatalf("request without write: %s flags %x code %d ref %d", f.Type, f.Flags, f.Aux, f.Ref)
	}
	s.Handle(declareFrame(15, "fresh", wire.PatternPubSub))
	wantCode(t, sink.next(t), wire.TypeError, 15, wire.CodeUnauthorized)
	if b.Exchange("fresh") != nil {
		t.Fatal("a denied DECLARE created the exchange")
	}
	s.Handle(&wire.Frame{Type: wire.TypeDelete, Ref: 16, Name: "news"})
	wantCode(t, sink.next(t), wire.TypeError, 16, wire.CodeUnauthorized)
	if b.Exchange("news") == nil {
		t.Fatal("a denied DELETE deleted the exchange")
	}
	s.Handle(&wire.Frame{Type: wire.TypeSubscribe, Ref: 17, Attach: 1, Body: []byte(`{"patterns":["more"]}`)})
	wantCode(t, sink.next(t), wire.TypeOK, 17, 0)

	// A DECLARE of an existing exchange it may use opens it, and cannot
	// change it.
	s.Handle(declareFrame(18, "news", wire.PatternPubSub))
	wantCode(t, sink.next(t), wire.TypeOK, 18, 0)
	s.Handle(declareFrame(19, "news", wire.PatternReqResp))
	wantCode(t, sink.next(t), wire.TypeError, 19, wire.CodeClash)

	// The allowed publish still reaches the subscriber on the same session.
	s.Handle(&wire.Frame{Type: wire.TypePublish, Name: "news", Key: "k", Body: []byte("hello")})
	if m := sink.next(t); m.Type != wire.TypeMessage || m.Attach != 1 || string(m.Body) != "hello" {
		t.Fatalf("publish after denials: got %s attach %d %q", m.Type, m.Attach, m.Body)
	}

	// LIST shows only what bob may touch.
	s.Handle(&wire.Frame{Type: wire.TypeList, Ref: 20})
	ok := sink.next(t)
	var list []wire.ExchangeInfo
	json.Unmarshal(ok.Body, &list)
	if len(list) != 2 || list[0].Name != "news" || list[1].Name != "svc" {
		t.Fatalf("LIST for bob: %+v", list)
	}
	sink.empty(t)

	log := logs.String()
	for _, want := range []string{"permission denied", "user=bob", "op=publish", "exchange=secret", "need=write"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	// A client publishing in a loop without permission is logged once.
	before := strings.Count(logs.String(), "op=publish")
	for i := range 5 {
		s.Handle(&wire.Frame{Type: wire.TypePublish, Ref: uint64(30 + i), Flags: wire.FlagReply, Name: "secret", Key: "k", Body: []byte("x")})
		wantCode(t, sink.next(t), wire.TypeError, uint64(30+i), wire.CodeUnauthorized)
	}
	if after := strings.Count(logs.String(), "op=publish"); after != before {
		t.Fatalf("repeated denials logged %d more times", after-before)
	}
}

// TestPermissionsChangeOnNextOp: a session sees new permissions on its
// next operation, without reconnecting.
func TestPermissionsChangeOnNextOp(t *testing.T) {
	b := New(Config{Log: slog.New(slog.DiscardHandler)})
	defer b.Close()
	b.Open(dropSink{}, "admin").Handle(declareFrame(1, "news", wire.PatternPubSub))
	pol := newFakePolicy()
	sink := newChanSink()
	s := b.OpenAs(sink, "c", "bob", pol)
	pub := func(ref uint64) *wire.Frame {
		s.Handle(&wire.Frame{Type: wire.TypePublish, Ref: ref, Flags: wire.FlagReply, Name: "news", Key: "k", Body: []byte("x")})
		return sink.next(t)
	}
	wantCode(t, pub(1), wire.TypeError, 1, wire.CodeUnauthorized)
	pol.set("bob", "news", auth.Write)
	wantCode(t, pub(2), wire.TypeOK, 2, 0)
	asked := pol.asked.Load()
	for i := range 10 {
		wantCode(t, pub(uint64(3+i)), wire.TypeOK, uint64(3+i), 0)
	}
	if n := pol.asked.Load() - asked; n != 0 {
		t.Fatalf("the policy was asked %d times for a cached exchange", n)
	}
	pol.set("bob", "news", 0)
	wantCode(t, pub(20), wire.TypeError, 20, wire.CodeUnauthorized)
}

// TestReauthorizeDetachesRevoked: after a change, attachments whose
// permission went are detached with an EVENT; others stay.
func TestReauthorizeDetachesRevoked(t *testing.T) {
	b := New(Config{Log: slog.New(slog.DiscardHandler)})
	defer b.Close()
	admin := b.Open(dropSink{}, "admin")
	admin.Handle(declareFrame(1, "news", wire.PatternPubSub))
	admin.Handle(declareFrame(2, "sport", wire.PatternPubSub))
	pol := newFakePolicy()
	pol.set("bob", "news", auth.Read)
	pol.set("bob", "sport", auth.Read)
	sink := newChanSink()
	s := b.OpenAs(sink, "c", "bob", pol)
	s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "news", Aux: wire.RoleSubscriber, Body: []byte(`{"patterns":["#"]}`)})
	s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 2, Attach: 2, Name: "sport", Aux: wire.RoleSubscriber, Body: []byte(`{"patterns":["#"]}`)})
	wantCode(t, sink.next(t), wire.TypeOK, 1, 0)
	wantCode(t, sink.next(t), wire.TypeOK, 2, 0)
	if n := b.Reauthorize(); n != 0 {
		t.Fatalf("Reauthorize without a change detached %d", n)
	}
	pol.set("bob", "news", 0)
	if n := b.Reauthorize(); n != 1 {
		t.Fatalf("Reauthorize detached %d, want 1", n)
	}
	ev := sink.next(t)
	if ev.Type != wire.TypeEvent || ev.Aux != wire.EventDetached || ev.Attach != 1 || !strings.Contains(ev.Tag, "permission revoked") {
		t.Fatalf("got %s aux %d attach %d %q, want EVENT detached for attachment 1", ev.Type, ev.Aux, ev.Attach, ev.Tag)
	}
	if s.Attachments() != 1 || b.Exchange("news").Subscribers() != 0 {
		t.Fatalf("after revoke: %d attachments, %d news subscribers", s.Attachments(), b.Exchange("news").Subscribers())
	}
	admin.Handle(&wire.Frame{Type: wire.TypePublish, Name: "news", Key: "k", Body: []byte("x")})
	admin.Handle(&wire.Frame{Type: wire.TypePublish, Name: "sport", Key: "k", Body: []byte("goal")})
	if m := sink.next(t); m.Type != wire.TypeMessage || m.Attach != 2 {
		t.Fatalf("got %s for attachment %d, want the sport MESSAGE only", m.Type, m.Attach)
	}
	sink.empty(t)
}

// TestPermissionCheckAllocs: a cached check allocates nothing.
func TestPermissionCheckAllocs(t *testing.T) {
	b := New(Config{Log: slog.New(slog.DiscardHandler)})
	defer b.Close()
	pol := newFakePolicy()
	pol.set("bob", "news", auth.Write)
	s := b.OpenAs(dropSink{}, "c", "bob", pol)
	name := strings.Clone("news")
	s.allowed(auth.Write, name)
	if n := testing.AllocsPerRun(1000, func() {
		if !s.allowed(auth.Write, name) {
			t.Fatal("denied")
		}
	}); n != 0 {
		t.Fatalf("a cached permission check allocates %v times", n)
	}
}

func BenchmarkPermissionCheck(b *testing.B) {
	br := New(Config{Log: slog.New(slog.DiscardHandler)})
	defer br.Close()
	pol := newFakePolicy()
	pol.set("bob", "news", auth.Write)
	s := br.OpenAs(dropSink{}, "c", "bob", pol)
	b.ReportAllocs()
	for b.Loop() {
		s.allowed(auth.Write, "news")
	}
}

// TestPermissionsTasks: SUBMIT needs write, WATCH write or read, a worker
// read.
func TestPermissionsTasks(t *testing.T) {
	b := New(Config{Log: slog.New(slog.DiscardHandler)})
	defer b.Close()
	b.Open(dropSink{}, "admin").Handle(declareFrame(1, "jobs", wire.PatternTasks))
	if b.Exchange("jobs") == nil {
		t.Fatal("no tasks exchange")
	}
	pol := newFakePolicy()
	pol.set("w", "jobs", auth.Read)
	sink := newChanSink()
	s := b.OpenAs(sink, "c", "w", pol)
	s.Handle(&wire.Frame{Type: wire.TypeSubmit, Ref: 1, Flags: wire.FlagReply, Name: "jobs", Body: []byte("task")})
	wantCode(t, sink.next(t), wire.TypeError, 1, wire.CodeUnauthorized)
	s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 2, Attach: 1, Name: "jobs", Aux: wire.RoleWorker})
	f := sink.next(t)
	for f.Type == wire.TypeEvent { // the worker group's leader event
		f = sink.next(t)
	}
	wantCode(t, f, wire.TypeOK, 2, 0)
	pol.set("w", "jobs", 0)
	s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 3, Attach: 2, Name: "jobs", Aux: wire.RoleWorker})
	wantCode(t, sink.next(t), wire.TypeError, 3, wire.CodeUnauthorized)
	s.Handle(&wire.Frame{Type: wire.TypeWatch, Ref: 4, Name: "jobs", Aux: 1})
	wantCode(t, sink.next(t), wire.TypeError, 4, wire.CodeUnauthorized)
}
