package main

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
)

// declaredKinds declares an exchange of every kind, with every option,
// and a durable subscription, and returns the exchanges as declared; the
// transient ones and a deleted one are left out, as a restart must.
func declaredKinds(ctx context.Context, t *testing.T, conn *courier.Conn) map[string]courier.ExchangeInfo {
	t.Helper()
	want := map[string]courier.ExchangeInfo{}
	declare := func(name string, spec courier.ExchangeSpec) {
		t.Helper()
		info, err := conn.Declare(ctx, name, spec)
		if err != nil {
			t.Fatalf("declare %s: %v", name, err)
		}
		if !spec.Transient {
			want[name] = info
		}
	}
	rr := func(strategy string) courier.ExchangeSpec {
		s := courier.ExchangeSpec{}
		s.Pattern, s.Strategy = "reqresp", strategy
		return s
	}
	for _, s := range []string{"broadcast", "round-robin", "leader", "leader-round-robin", "sticky", "least-busy"} {
		declare("rr."+s, rr(s))
	}
	declare("rr.default", rr(""))
	sf := rr("sticky-fun")
	sf.KeyExpr = `headers["tenant"]`
	declare("rr.sticky-fun", sf)
	fun := rr("fun")
	fun.RouteExpr = `{"key": key + "!"}`
	declare("rr.fun", fun)
	ps := courier.ExchangeSpec{}
	ps.Pattern = "pubsub"
	declare("ps.plain", ps)
	ps.Controlled = true
	declare("ps.controlled", ps)
	ts := courier.ExchangeSpec{}
	ts.Pattern = "tasks"
	declare("tasks.dead", ts)
	ts.Strategy, ts.MaxAttempts, ts.TTLMS, ts.BackoffMS, ts.BackoffMaxMS = "single-active", 7, 60000, 250, 9000
	ts.DeadLetter, ts.MaxLength, ts.MaxBytes, ts.Overflow = "tasks.dead", 1000, 1<<20, "drop-head"
	declare("tasks.full", ts)
	// Transient, and deleted: neither comes back.
	tr := rr("round-robin")
	tr.Transient = true
	declare("rr.transient", tr)
	tt := courier.ExchangeSpec{}
	tt.Pattern, tt.Transient = "tasks", true
	declare("tasks.transient", tt)
	tp := courier.ExchangeSpec{}
	tp.Pattern, tp.Transient = "pubsub", true
	declare("ps.transient", tp)
	declare("rr.deleted", rr("leader"))
	if err := conn.DeleteExchange(ctx, "rr.deleted"); err != nil {
		t.Fatal(err)
	}
	delete(want, "rr.deleted")
	// A durable subscription on the plain pub-sub exchange.
	ex, err := conn.PubSub(ctx, "ps.plain")
	if err != nil {
		t.Fatal(err)
	}
	a, err := ex.Subscribe(ctx, "a.#", func(*courier.Delivery) {}, courier.Durable("ps.plain.keep"))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := conn.Declare(ctx, "ps.plain", courier.ExchangeSpec{Passive: true})
	if err != nil {
		t.Fatal(err)
	}
	want["ps.plain"] = info
	return want
}

// shapeOf is an exchange's definition as a listing shows it: its
// counters, members and queue state set aside.
func shapeOf(info courier.ExchangeInfo) string {
	info.Members, info.Requests, info.Publishes, info.Leader, info.Subscribers = nil, 0, 0, "", 0
	info.Queue = nil
	b, _ := json.Marshal(info)
	return string(b)
}

// TestCrashKeepsExchangeDefinitions declares an exchange of every kind
// on a real server, kills it with SIGKILL as soon as the declarations
// are answered, and checks that each comes back exactly as declared (and
// that the transient and deleted ones do not); then it stops the server
// gracefully, so that the definitions come from a checkpoint, and
// checks again.
func TestCrashKeepsExchangeDefinitions(t *testing.T) {
	dir := t.TempDir()
	addr := "127.0.0.1:" + cliFreePort(t)
	url := "courier://" + addr
	ctx := testutil.Context(t, time.Minute)

	srv := crashServer(t, addr, dir)
	conn, err := client.Dial(ctx, url, client.Options{Name: "defs"})
	if err != nil {
		t.Fatal(err)
	}
	want := declaredKinds(ctx, t, conn)
	if err := srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-srv.done
	conn.Close()

	check := func(how string) {
		t.Helper()
		conn, err := client.Dial(ctx, url, client.Options{Name: "defs-check"})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		list, err := conn.Exchanges(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]courier.ExchangeInfo{}
		for _, e := range list {
			got[e.Name] = e
		}
		for name, w := range want {
			g, ok := got[name]
			if !ok {
				t.Errorf("after %s: exchange %s is gone", how, name)
				continue
			}
			if shapeOf(g) != shapeOf(w) {
				t.Errorf("after %s: exchange %s is\n%s\nnot as declared:\n%s", how, name, shapeOf(g), shapeOf(w))
			}
		}
		for name := range got {
			if _, ok := want[name]; !ok {
				t.Errorf("after %s: exchange %s came back", how, name)
			}
		}
		t.Logf("after %s: %d exchanges listed, %d expected back as declared (transient and deleted ones left out)", how, len(got), len(want))
		if got["ps.plain"].Subscribers != 1 {
			t.Errorf("after %s: the durable subscription of ps.plain is gone (%d subscribers)", how, got["ps.plain"].Subscribers)
		}
	}

	srv = crashServer(t, addr, dir)
	check("kill -9")
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-srv.done
	crashServer(t, addr, dir)
	check("a graceful stop")
}
