package node_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// TestFlowControl: past the memory high watermark, publishers of the
// queue that holds the memory stop getting credit (over the network) or wait in
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
	cfg := node.Config{DataDir: t.TempDir(), Log: quiet(), MemoryBudget: budget / 2, MemoryHighWatermark: budget}
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
		t.Fatalf("all %d submits of %d bytes went through a %d-byte watermark: no flow control", attempts, size, budget)
	}
	if bound := int64(budget/size + 200); depth > bound {
		t.Fatalf("queue depth %d past the watermark's %d messages plus the credit window", depth, bound)
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

// TestDefaultMemory: with the default configuration a durable queue keeps
// to the default memory budget however deep it grows, pages the rest to
// disk, and its publishers are not slowed: the high watermark, 40% of
// the machine, is far. Every message comes back, in order.
func TestDefaultMemory(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	mem := n.Broker().Memory()
	if mem.Budget() != int64(node.DefaultMemoryBudget) || mem.Limit() < mem.Budget() {
		t.Fatalf("default budget %d, limit %d; want a budget of %d", mem.Budget(), mem.Limit(), node.DefaultMemoryBudget)
	}
	if m := node.MachineMemory(); m > 0 && mem.Limit() != int64(float64(m)*node.DefaultMemoryShare) && mem.Limit() != mem.Budget() {
		t.Fatalf("default limit %d, want %v of %d", mem.Limit(), node.DefaultMemoryShare, m)
	}
	ctx := testutil.Context(t, 2*time.Minute)
	c := n.Connect()
	ex, err := c.Tasks(ctx, "deep")
	if err != nil {
		t.Fatal(err)
	}
	// 64 MiB of bodies: twice the default budget.
	const count, size = 64 << 10, 1024
	var peak int64
	confirmed := make(chan error, count)
	for i := range count {
		body := make([]byte, size) // in-process, the broker keeps it
		binary.BigEndian.PutUint32(body, uint32(i))
		if err := ex.SubmitAsync(ctx, courier.Task{Body: body}, func(_ courier.TaskID, err error) { confirmed <- err }); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, mem.Used())
	}
	for range count {
		if err := <-confirmed; err != nil {
			t.Fatal(err)
		}
	}
	st := mem.Stats()
	t.Logf("%d tasks of %d bytes queued: %d bytes in RAM (peak %d), %d paged out, %d spilled, alarm %v, throttle %.2f",
		count, size, st.Used, peak, st.PagedOut, st.Spilled, st.Alarm, st.Throttle)
	if peak > mem.Budget() || st.PagedOut+st.Spilled < count/2 || st.Throttle != 0 || st.Alarm {
		t.Fatalf("not kept to the default budget of %d bytes", mem.Budget())
	}
	next := uint32(0)
	done := make(chan struct{})
	if _, err := ex.Work(ctx, func(j *courier.Job) error {
		if got := binary.BigEndian.Uint32(j.Body); got != next || len(j.Body) != size {
			t.Errorf("task %d of %d bytes, want task %d", got, len(j.Body), next)
		}
		if next++; next == count {
			close(done)
		}
		return nil
	}, courier.Prefetch(100)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("%d of %d tasks handled", next, count)
	}
}
