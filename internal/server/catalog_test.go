package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// gatedCatalog is a cluster's catalog whose declares wait for the test
// to open their gate, then apply to the broker as the metadata group's
// observer would.
type gatedCatalog struct {
	b *broker.Broker

	mu       sync.Mutex
	gate     chan struct{} // closed by release
	inFlight int
	most     int
	calls    []string
}

func newGatedCatalog(b *broker.Broker) *gatedCatalog {
	return &gatedCatalog{b: b, gate: make(chan struct{})}
}

func (c *gatedCatalog) Declare(ctx context.Context, name string, cfg wire.ExchangeConfig, user string, trusted bool) error {
	c.mu.Lock()
	c.inFlight++
	c.most = max(c.most, c.inFlight)
	c.calls = append(c.calls, name)
	gate := c.gate
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.inFlight--
		c.mu.Unlock()
	}()
	select {
	case <-gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return c.b.ApplyDeclare(name, cfg, user, trusted)
}

func (c *gatedCatalog) Delete(ctx context.Context, name string) error { return c.b.ApplyDelete(name) }

func (c *gatedCatalog) Sync(ctx context.Context) error { return nil }

// waiting returns the declares waiting at the gate.
func (c *gatedCatalog) waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inFlight
}

func (c *gatedCatalog) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.gate)
}

func declareFrame(ref uint64, name string) *wire.Frame {
	body, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternPubSub})
	return &wire.Frame{Type: wire.TypeDeclare, Ref: ref, Name: name, Body: body}
}

// nextAnswer reads frames until an OK, ERROR or PONG, skipping CREDIT.
func (c *raw) nextAnswer() *wire.Frame {
	c.t.Helper()
	for {
		f := c.next()
		if f == nil {
			c.t.Fatal("connection closed")
		}
		if f.Type != wire.TypeCredit {
			return f
		}
	}
}

// TestClusterDeclaresOffReadLoop: in a cluster, a connection's DECLAREs
// wait for the catalog together, not one after the other on the read
// loop, and the frames after them go on meanwhile (a PING is answered);
// an ATTACH of an exchange being declared waits for that declare, and
// then finds the exchange.
func TestClusterDeclaresOffReadLoop(t *testing.T) {
	n := startNode(t, 0)
	cat := newGatedCatalog(n.Broker())
	n.Broker().SetCatalog(cat)
	c := dialRaw(t, n)
	c.hello()
	const k = 8
	for i := range k {
		c.send(declareFrame(uint64(i+1), fmt.Sprintf("d%d", i)))
	}
	c.send(&wire.Frame{Type: wire.TypePing})
	testutil.WaitForf(t, 20*time.Second, func() bool { return cat.waiting() == k }, "%d declares at the catalog at once", k)
	if f := c.nextAnswer(); f.Type != wire.TypePong {
		t.Fatalf("a PING behind %d declares in flight: got %+v, want PONG", k, f)
	}
	// ATTACH of d0 waits for d0's declare, which is still at the gate.
	c.send(&wire.Frame{Type: wire.TypeAttach, Ref: 100, Attach: 1, Name: "d0", Aux: wire.RoleSubscriber, Body: []byte(`{"patterns":["#"]}`)})
	cat.release()
	seen := map[uint64]bool{}
	for len(seen) < k+1 {
		f := c.nextAnswer()
		if f.Type != wire.TypeOK {
			t.Fatalf("answer %+v (%s)", f, f.Tag)
		}
		if f.Ref == 100 && !seen[1] {
			t.Fatal("ATTACH d0 answered before the DECLARE of d0 sent before it")
		}
		seen[f.Ref] = true
	}
}

// TestClusterDeclaresBounded: a connection has at most 64 declares in
// flight; the read loop waits for a slot for the next ones, which are
// all answered once the catalog answers.
func TestClusterDeclaresBounded(t *testing.T) {
	n := startNode(t, 0)
	cat := newGatedCatalog(n.Broker())
	n.Broker().SetCatalog(cat)
	c := dialRaw(t, n)
	c.hello()
	const k = 80
	for i := range k {
		c.send(declareFrame(uint64(i+1), fmt.Sprintf("b%d", i)))
	}
	testutil.WaitForf(t, 20*time.Second, func() bool { return cat.waiting() == 64 }, "64 declares at the catalog")
	cat.release()
	for range k {
		if f := c.nextAnswer(); f.Type != wire.TypeOK {
			t.Fatalf("answer %+v (%s)", f, f.Tag)
		}
	}
	cat.mu.Lock()
	defer cat.mu.Unlock()
	if cat.most > 64 || len(cat.calls) != k {
		t.Fatalf("%d declares at the catalog at most (bound 64), %d calls of %d", cat.most, len(cat.calls), k)
	}
}

// TestClusterDeclareThenDeleteInOrder: a DELETE of an exchange waits for
// its DECLARE sent before it on the same connection, and a second
// DECLARE for the DELETE: the effects are those of the order sent.
func TestClusterDeclareThenDeleteInOrder(t *testing.T) {
	n := startNode(t, 0)
	cat := newGatedCatalog(n.Broker())
	n.Broker().SetCatalog(cat)
	c := dialRaw(t, n)
	c.hello()
	c.send(declareFrame(1, "x"))
	c.send(&wire.Frame{Type: wire.TypeDelete, Ref: 2, Name: "x"})
	c.send(&wire.Frame{Type: wire.TypeList, Ref: 3})
	testutil.WaitForf(t, 20*time.Second, func() bool { return cat.waiting() == 1 }, "the declare at the catalog")
	cat.release()
	for ref := uint64(1); ref <= 3; ref++ {
		f := c.nextAnswer()
		if f.Type != wire.TypeOK || f.Ref != ref {
			t.Fatalf("answer %d: %+v (%s)", ref, f, f.Tag)
		}
		if ref == 3 && string(f.Body) != "[]" {
			t.Fatalf("LIST after DECLARE and DELETE: %s", f.Body)
		}
	}
}
