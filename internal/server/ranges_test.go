package server_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// TestHugeNumbersFromTheWire sends 2^62 wherever a client gives a
// duration or a count (issue 12, finding 9): every one is refused with a
// clear error instead of overflowing (a backoff of 2^62 ms was 0, a TTL
// of 2^62 ms none at all).
func TestHugeNumbersFromTheWire(t *testing.T) {
	const huge = 1 << 62
	n := startNode(t, 0)
	ctx := testutil.Context(t, 10*time.Second)
	trusted := n.Connect()
	svc, err := trusted.ReqResp(ctx, "svc", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Handle(ctx, func(r *courier.Request) { r.Reply([]byte("a")) }); err != nil {
		t.Fatal(err)
	}
	if _, err := trusted.Tasks(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}

	c := dialRaw(t, n)
	c.hello()
	ref := uint64(0)
	expectError := func(what string, code wire.Code, f *wire.Frame) {
		t.Helper()
		ref++
		f.Ref = ref
		c.send(f)
		g := c.next()
		for g != nil && g.Type == wire.TypeCredit {
			g = c.next()
		}
		switch {
		case g == nil:
			t.Fatalf("%s: the connection closed", what)
		case g.Ref != ref || wire.Code(g.Aux) != code || (g.Type != wire.TypeError && g.Flags&wire.FlagError == 0):
			t.Errorf("%s: got %s ref %d aux %d %q, want error code %d", what, g.Type, g.Ref, g.Aux, g.Tag, code)
		default:
			t.Logf("%s: %s", what, g.Tag)
		}
	}
	for i, cfg := range []wire.ExchangeConfig{
		{Pattern: wire.PatternTasks, TTLMS: huge},
		{Pattern: wire.PatternTasks, BackoffMS: huge},
		{Pattern: wire.PatternTasks, BackoffMaxMS: huge},
		{Pattern: wire.PatternTasks, MaxLength: huge},
		{Pattern: wire.PatternTasks, MaxBytes: huge},
		{Pattern: wire.PatternTasks, MaxAttempts: huge},
		{Pattern: wire.PatternTasks, MaxAttempts: -2},
	} {
		body, _ := json.Marshal(cfg)
		name := fmt.Sprintf("huge%d", i)
		expectError("declare "+string(body), wire.CodeBadOptions, &wire.Frame{Type: wire.TypeDeclare, Name: name, Body: body})
		if n.Broker().Exchange(name) != nil {
			t.Errorf("declared with %s", body)
		}
	}
	for _, tag := range []string{
		fmt.Sprintf("ttl=%d", huge),
		fmt.Sprintf("due=%d", huge),
		fmt.Sprintf("due=%d", time.Now().Add(11*365*24*time.Hour).UnixMilli()),
	} {
		expectError("submit "+tag, wire.CodeBadOptions, &wire.Frame{Type: wire.TypeSubmit, Flags: wire.FlagReply, Name: "jobs", Tag: tag, Body: []byte("x")})
	}
	expectError("request deadline 2^62 ms", wire.CodeDeadlineTooLong, &wire.Frame{Type: wire.TypeRequest, Name: "svc", Aux: huge, Body: []byte("q")})
	spec, _ := json.Marshal(wire.AttachSpec{Prefetch: huge})
	expectError("attach prefetch 2^62", wire.CodeBadOptions, &wire.Frame{Type: wire.TypeAttach, Attach: 1, Name: "jobs", Aux: wire.RoleWorker, Body: spec})

	// A HELLO asking for a heartbeat of 2^62 ms is refused: fatal code 6.
	h := dialRaw(t, n)
	body, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, HeartbeatMS: huge})
	h.send(&wire.Frame{Type: wire.TypeHello, Body: body})
	h.expectFatal(wire.CodeBadOptions)
}
