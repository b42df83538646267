package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// TestFlowControl: past the memory budget, publishers of the queue that
// holds the memory stop getting credit (over the network) or wait in
// Submit (embedded): the queue stays bounded however much they try to
// submit, nothing is dropped, and submitting resumes once a worker drains
// the queue. The queue is transient, so it cannot page its way out.
func TestFlowControl(t *testing.T) {
	for _, remote := range []bool{false, true} {
		name := map[bool]string{false: "Embedded", true: "Network"}[remote]
		t.Run(name, func(t *testing.T) { flowControl(t, remote) })
	}
}

func flowControl(t *testing.T, remote bool) {
	const budget, size, attempts = 256 << 10, 1024, 4000
	cfg := node.Config{DataDir: t.TempDir(), Log: quiet(), MemoryBudget: budget}
	if remote {
		cfg.Listen = "127.0.0.1:0"
		cfg.Limits.Credit = 64
	}
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := testutil.Context(t, time.Minute)
	var c *courier.Conn
	if remote {
		if c, err = client.Dial(ctx, n.URL(), client.Options{}); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	} else {
		c = n.Connect()
	}
	ex, err := c.Tasks(ctx, "flow", courier.Transient())
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, size)
	confirmed := make(chan courier.TaskID, attempts)
	submit := func(ctx context.Context) error {
		return ex.SubmitAsync(ctx, courier.Task{Body: body}, func(id courier.TaskID, err error) {
			if err != nil {
				t.Errorf("submit failed: %v", err)
			}
			confirmed <- id
		})
	}
	sent := submitUntilHeld(t, ctx, attempts, submit)
	q := n.Broker().Queue("flow")
	depth := q.Stats().Messages()
	mem := n.Broker().Memory()
	t.Logf("held back after %d submits: queue depth %d, memory used %d of %d, alarm %v", sent, depth, mem.Used(), mem.Limit(), mem.Alarm())
	if sent == attempts {
		t.Fatalf("all %d submits of %d bytes went through a %d-byte budget: no flow control", attempts, size, budget)
	}
	if bound := int64(budget/size + 200); depth > bound {
		t.Fatalf("queue depth %d past the budget's %d messages plus the credit window", depth, bound)
	}
	// A worker drains the queue; the producer goes on.
	got := make(chan struct{}, attempts)
	if _, err := ex.Work(ctx, func(*courier.Job) error { got <- struct{}{}; return nil }, courier.Prefetch(50)); err != nil {
		t.Fatal(err)
	}
	for ; sent < attempts; sent++ {
		if err := submit(ctx); err != nil {
			t.Fatalf("submit %d after the worker came: %v", sent, err)
		}
	}
	for i := range attempts {
		select {
		case <-got:
		case <-ctx.Done():
			t.Fatalf("%d of %d tasks handled", i, attempts)
		}
	}
	for i := range attempts {
		select {
		case <-confirmed:
		case <-ctx.Done():
			t.Fatalf("%d of %d submits confirmed", i, attempts)
		}
	}
	if mem.Alarm() {
		t.Fatalf("memory alarm still on after the queue drained (used %d)", mem.Used())
	}
}

// submitUntilHeld calls submit until flow control holds it back (it does
// not return within a while) or attempts were made, and returns how many
// went through.
func submitUntilHeld(t *testing.T, ctx context.Context, attempts int, submit func(context.Context) error) int {
	t.Helper()
	for sent := range attempts {
		sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		err := submit(sctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return sent
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return attempts
}
