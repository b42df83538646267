package server_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// TestSubmitDeduplicated: SUBMITs with the same pid and seq, on two
// connections and across a restart of the node, store one task and are
// all confirmed with its id; another seq, or none, is a new task; a bad
// pid is refused.
func TestSubmitDeduplicated(t *testing.T) {
	dir := t.TempDir()
	start := func() *node.Node {
		n, err := node.Start(node.Config{DataDir: dir, Listen: "127.0.0.1:0", Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	n := start()
	ctx := testutil.Context(t, 20*time.Second)
	if _, err := n.Connect().Tasks(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}
	ref := uint64(0)
	submit := func(c *raw, tag string) *wire.Frame {
		t.Helper()
		ref++
		c.send(&wire.Frame{Type: wire.TypeSubmit, Flags: wire.FlagReply, Ref: ref, Name: "jobs", Tag: tag, Body: []byte("x")})
		for {
			g := c.next()
			if g == nil {
				t.Fatal("the connection closed")
			}
			if g.Type != wire.TypeCredit {
				if g.Ref != ref {
					t.Fatalf("answer to ref %d, want %d", g.Ref, ref)
				}
				return g
			}
		}
	}
	ok := func(c *raw, tag string) uint64 {
		t.Helper()
		g := submit(c, tag)
		if g.Type != wire.TypeOK {
			t.Fatalf("submit %q: %s %q", tag, g.Type, g.Tag)
		}
		return g.Aux
	}
	depth := func(n *node.Node) int64 { return n.Broker().Queue("jobs").Stats().Messages() }

	c := dialRaw(t, n)
	if w := c.hello(); !w.Dedup {
		t.Fatal("WELCOME does not offer dedup")
	}
	id := ok(c, "pid=p1;seq=1")
	if again := ok(c, "pid=p1;seq=1"); again != id {
		t.Fatalf("resend: task %d, want %d", again, id)
	}
	c2 := dialRaw(t, n)
	c2.hello()
	if again := ok(c2, "ttl=60000;pid=p1;seq=1"); again != id {
		t.Fatalf("resend on another connection: task %d, want %d", again, id)
	}
	if depth(n) != 1 {
		t.Fatalf("%d tasks, want 1", depth(n))
	}
	other := ok(c2, "pid=p1;seq=2")
	plain := ok(c2, "")
	if other == id || plain == id || other == plain || depth(n) != 3 {
		t.Fatalf("ids %d %d %d, %d tasks", id, other, plain, depth(n))
	}
	for _, tag := range []string{"pid=p1", "pid=bad pid;seq=1", "pid=p1;seq=0"} {
		if g := submit(c2, tag); g.Type != wire.TypeError || wire.Code(g.Aux) != wire.CodeBadOptions {
			t.Errorf("submit %q: %s %d %q, want bad options", tag, g.Type, g.Aux, g.Tag)
		}
	}

	// Across a restart: the window comes back with the queue.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = start()
	c3 := dialRaw(t, n)
	c3.hello()
	if again := ok(c3, "pid=p1;seq=1"); again != id {
		t.Fatalf("resend after a restart: task %d, want %d", again, id)
	}
	if again := ok(c3, "pid=p1;seq=2"); again != other {
		t.Fatalf("resend after a restart: task %d, want %d", again, other)
	}
	if depth(n) != 3 {
		t.Fatalf("%d tasks after the restart and resends, want 3", depth(n))
	}
}

// TestDedupWindowOption: dedup_window_ms -1 turns deduplication off for
// a task exchange, a window is echoed in the exchange's info, and the
// option is refused out of its range or on another pattern.
func TestDedupWindowOption(t *testing.T) {
	n := startNode(t, 0)
	ctx := testutil.Context(t, 20*time.Second)
	conn := n.Connect()
	if _, err := conn.Tasks(ctx, "nodedup", courier.DedupWindow(-1)); err != nil {
		t.Fatal(err)
	}
	short, err := conn.Tasks(ctx, "short", courier.DedupWindow(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if ms := short.Info().DedupWindowMS; ms != 5000 {
		t.Fatalf("info says dedup_window_ms %d", ms)
	}
	c := dialRaw(t, n)
	c.hello()
	ids := map[uint64]bool{}
	for ref := uint64(1); ref <= 2; ref++ {
		c.send(&wire.Frame{Type: wire.TypeSubmit, Flags: wire.FlagReply, Ref: ref, Name: "nodedup", Tag: "pid=p;seq=1", Body: []byte("x")})
		g := c.next()
		for g != nil && g.Type == wire.TypeCredit {
			g = c.next()
		}
		if g == nil || g.Type != wire.TypeOK {
			t.Fatalf("submit: %+v", g)
		}
		ids[g.Aux] = true
	}
	if len(ids) != 2 || n.Broker().Queue("nodedup").Stats().Messages() != 2 {
		t.Fatalf("with the window off: ids %v", ids)
	}
	for _, cfg := range []string{
		`{"pattern":"tasks","dedup_window_ms":-2}`,
		`{"pattern":"tasks","dedup_window_ms":315360000001}`,
		`{"pattern":"pubsub","dedup_window_ms":1000}`,
	} {
		c.send(&wire.Frame{Type: wire.TypeDeclare, Ref: 9, Name: "bad", Body: []byte(cfg)})
		g := c.next()
		for g != nil && g.Type == wire.TypeCredit {
			g = c.next()
		}
		if g == nil || g.Type != wire.TypeError || wire.Code(g.Aux) != wire.CodeBadOptions {
			t.Errorf("declare %s: %+v, want code 6", cfg, g)
		}
	}
}

// TestDedupFullQueue: a resend to a queue at its max_length is answered
// with the stored task's id, not refused, and drops nothing from a
// drop-head queue.
func TestDedupFullQueue(t *testing.T) {
	n := startNode(t, 0)
	ctx := testutil.Context(t, 20*time.Second)
	conn := n.Connect()
	for _, name := range []string{"full.reject", "full.drop"} {
		opts := []courier.ExchangeOption{courier.MaxLength(1)}
		if name == "full.drop" {
			opts = append(opts, courier.DropHead())
		}
		if _, err := conn.Tasks(ctx, name, opts...); err != nil {
			t.Fatal(err)
		}
		c := dialRaw(t, n)
		c.hello()
		var ids []uint64
		for ref := uint64(1); ref <= 2; ref++ {
			c.send(&wire.Frame{Type: wire.TypeSubmit, Flags: wire.FlagReply, Ref: ref, Name: name, Tag: "pid=p;seq=1", Body: []byte("x")})
			g := c.next()
			for g != nil && g.Type == wire.TypeCredit {
				g = c.next()
			}
			if g == nil || g.Type != wire.TypeOK {
				t.Fatalf("%s: submit %d: %+v", name, ref, g)
			}
			ids = append(ids, g.Aux)
		}
		st := n.Broker().Queue(name).Stats()
		if ids[0] != ids[1] || st.Messages() != 1 || st.DeadLettered != 0 {
			t.Fatalf("%s: ids %v, %d tasks, %d dead-lettered", name, ids, st.Messages(), st.DeadLettered)
		}
	}
}
