package server_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// countingHandler attaches a handler to name on c that counts the
// requests it gets and echoes them.
func countingHandler(t *testing.T, c *courier.Conn, name string, opts ...courier.ExchangeOption) *atomic.Int64 {
	t.Helper()
	ctx := testutil.Context(t, 10*time.Second)
	ex, err := c.ReqResp(ctx, name, opts...)
	if err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
	var n atomic.Int64
	if _, err := ex.Handle(ctx, func(r *courier.Request) {
		n.Add(1)
		r.Reply(r.Body())
	}); err != nil {
		t.Fatal(err)
	}
	return &n
}

// TestExprLimitOverWire (issue 12, finding 1): a key or route expression
// that would build a string far over its budget fails that one request
// with code 27, before any handler sees it; the exchange, the connection
// and other requests go on. Before the limits, the same request was
// routed after building 2 MiB (and `repeat` could ask for a terabyte).
func TestExprLimitOverWire(t *testing.T) {
	n := startNodeWith(t, func(*node.Config) {})
	ctx := testutil.Context(t, 10*time.Second)
	hc := dial(t, n, client.Options{Name: "handlers"})
	funSeen := countingHandler(t, hc, "expr.fun", courier.RouteExpr(`{"key": key + key + key + key}`))
	stickySeen := countingHandler(t, hc, "expr.sticky", courier.KeyExpr(`key + key + key + key`))

	rc := dial(t, n, client.Options{Name: "requester"})
	bigKey := strings.Repeat("x", 512<<10)
	for _, name := range []string{"expr.fun", "expr.sticky"} {
		ex, err := rc.ReqResp(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ex.Request(ctx, courier.Message{Key: bigKey, Body: []byte("q")})
		mustCode(t, err, wire.CodeExprLimit)
		if !strings.Contains(err.Error(), "went over its cost limit") || !strings.Contains(err.Error(), name) {
			t.Fatalf("%s: error %q does not say which limit of which exchange", name, err)
		}
		r, err := ex.Request(ctx, courier.Message{Key: "k", Body: []byte("still here")})
		if err != nil || string(r.Body) != "still here" {
			t.Fatalf("%s: a small request after the big one: %v %v", name, r, err)
		}
	}
	if f, s := funSeen.Load(), stickySeen.Load(); f != 1 || s != 1 {
		t.Fatalf("handlers saw %d and %d requests, want only the small one each", f, s)
	}
	if err := rc.Err(); err != nil {
		t.Fatalf("the requester's connection closed: %v", err)
	}
}

// TestExprTimeLimitOverWire: an expression whose loops go on past the
// node's time limit (the cost limit set out of the way) fails its request
// with code 27 once the time limit passes.
func TestExprTimeLimitOverWire(t *testing.T) {
	n := startNodeWith(t, func(c *node.Config) {
		c.Limits.ExprCost = 1 << 50
		c.Limits.ExprTime = 20 * time.Millisecond
	})
	ctx := testutil.Context(t, 10*time.Second)
	seen := countingHandler(t, dial(t, n, client.Options{}), "expr.loops",
		courier.RouteExpr(`headers.all(a, headers.all(b, headers.all(c, headers.all(d, a + b + c + d != "")))) ? null : null`))
	ex, err := dial(t, n, client.Options{}).ReqResp(ctx, "expr.loops")
	if err != nil {
		t.Fatal(err)
	}
	h := map[string]string{}
	for i := range wire.MaxHeaders {
		h[string(rune('A'+i%26))+strings.Repeat("h", i/26)] = "v"
	}
	_, err = ex.Request(ctx, courier.Message{Header: h})
	mustCode(t, err, wire.CodeExprLimit)
	if !strings.Contains(err.Error(), "ran longer than its time limit (20ms)") {
		t.Fatalf("error %q does not name the time limit", err)
	}
	if seen.Load() != 0 {
		t.Fatal("the handler got the request")
	}
}

// TestRedirectNeedsWrite (issue 12, finding 3): a user with every
// permission on a.* only cannot reach b.rr through a routing expression
// of its own: a literal redirect there is refused at declare, and a
// computed one at request time, both with code 17; the handler of b.rr
// sees nothing. Redirects within a.* still work.
func TestRedirectNeedsWrite(t *testing.T) {
	n, dir := startWithUsers(t, false)
	ctx := testutil.Context(t, 10*time.Second)
	victim := countingHandler(t, n.Connect(), "b.rr", courier.RoundRobin)
	all := auth.Patterns{"a.*"}
	addUser(t, n, dir, "mallory", "malpw", auth.Permissions{Configure: all, Write: all, Read: all})
	m, err := dialURL(t, "courier://mallory:malpw@"+n.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}

	// The finding as reported: a literal redirect, with a forged header.
	_, err = m.ReqResp(ctx, "a.r", courier.RouteExpr(`{"redirect": "b.rr", "headers": {"x-forged": "yes"}}`))
	if we := wantWireCode(t, err, wire.CodeUnauthorized); !strings.Contains(we.Msg, `"b.rr"`) || !strings.Contains(we.Msg, "write") {
		t.Fatalf("declare with a forbidden redirect: %q", we.Msg)
	}
	if ex, _ := n.Connect().ReqResp(ctx, "a.r", courier.Passive()); ex != nil {
		t.Fatal("the refused exchange a.r exists")
	}

	// A redirect the expression computes: checked when a request takes it.
	countingHandler(t, m, "a.computed", courier.RouteExpr(`{"redirect": headers["to"], "headers": {"x-forged": "yes"}}`))
	own := countingHandler(t, m, "a.own", courier.RoundRobin)
	ex, err := m.ReqResp(ctx, "a.computed")
	if err != nil {
		t.Fatal(err)
	}
	_, err = ex.Request(ctx, courier.Message{Header: map[string]string{"to": "b.rr"}, Body: []byte("q")})
	if we := wantWireCode(t, err, wire.CodeUnauthorized); !strings.Contains(we.Msg, `"b.rr"`) || !strings.Contains(we.Msg, "a.computed") {
		t.Fatalf("request redirected to b.rr: %q", we.Msg)
	}
	// To an exchange it may write to, the redirect works.
	if r, err := ex.Request(ctx, courier.Message{Header: map[string]string{"to": "a.own"}, Body: []byte("hi")}); err != nil || string(r.Body) != "hi" {
		t.Fatalf("redirect within a.*: %v %v", r, err)
	}
	// And so does a literal one.
	countingHandler(t, m, "a.literal", courier.RouteExpr(`{"redirect": "a.own"}`))
	lit, err := m.ReqResp(ctx, "a.literal")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lit.Request(ctx, courier.Message{Body: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	if got := own.Load(); got != 2 {
		t.Fatalf("a.own got %d requests, want 2", got)
	}
	if got := victim.Load(); got != 0 {
		t.Fatalf("the handler of b.rr got %d requests from a user without write on it", got)
	}
	if err := m.Err(); err != nil {
		t.Fatalf("the connection closed: %v", err)
	}
}
