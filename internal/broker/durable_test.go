package broker

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/wire"
)

// TestCheckpointUnchangedQueues: a checkpoint writes the queues that did
// not change since the last one as they were then, and every queue that
// changed (a task added, a task acked, a durable subscription's
// patterns) as it is now. After a crash right after the second
// checkpoint, whose records are not replayed, every queue comes back as
// it was at that checkpoint.
func TestCheckpointUnchangedQueues(t *testing.T) {
	fs := store.NewMemFS()
	open := func(fs *store.MemFS) *Broker {
		t.Helper()
		b := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		// No checkpoint of its own: only the test's.
		if _, err := b.OpenStore(StoreConfig{Dir: "store", FS: fs, CheckpointEvery: time.Hour, CheckpointBytes: 1 << 40}); err != nil {
			t.Fatal(err)
		}
		return b
	}
	b := open(fs)
	defer b.Close()
	for _, name := range []string{"added", "idle", "acked"} {
		if _, err := b.Declare(name, Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternTasks}}); err != nil {
			t.Fatal(err)
		}
	}
	ev, err := b.Declare("events", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.durableSub(ev, "audit", []string{"old.#"}, nil); err != nil {
		t.Fatal(err)
	}
	enqueue := func(name string) {
		t.Helper()
		done := make(chan error, 1)
		if _, err := b.Queue(name).Enqueue(queue.Message{Body: []byte(name)}, func(err error) { done <- err }, nil); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"added", "idle", "acked"} {
		enqueue(name)
	}
	if err := b.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	idle := b.queueState(t, "idle")

	// Change all but "idle".
	enqueue("added")
	got := make(chan queue.Delivery, 1)
	q := b.Queue("acked")
	c, err := q.AddConsumer("w", queue.ConsumerConfig{Prefetch: 1, Deliver: func(d queue.Delivery) { got <- d }})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Ack(c, (<-got).ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.durableSub(ev, "audit", []string{"new.#"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if now := b.queueState(t, "idle"); !slices.Equal(now, idle) {
		t.Fatal("the unchanged queue's part of the checkpoint differs from the last one's")
	}
	if b.queueState(t, "added") == nil {
		t.Fatal("nothing kept of a small queue's part")
	}

	b2 := open(fs.Crash(nil))
	defer b2.Close()
	for name, want := range map[string]int64{"added": 2, "idle": 1, "acked": 0} {
		if got := b2.Queue(name).Stats().Messages(); got != want {
			t.Errorf("queue %s after the crash: %d tasks, want %d", name, got, want)
		}
	}
	tq, ok := b2.queues.Load("events/audit")
	if !ok {
		t.Fatal("the durable subscription is gone")
	}
	tq.(*taskQueue).defMu.Lock()
	patterns := tq.(*taskQueue).def.Patterns
	tq.(*taskQueue).defMu.Unlock()
	if !slices.Equal(patterns, []string{"new.#"}) {
		t.Errorf("the durable subscription's patterns after the crash: %q, want new.#", patterns)
	}
}

// queueState returns the part of the last checkpoint that the queue
// keeps for the next one.
func (b *Broker) queueState(t *testing.T, name string) []byte {
	t.Helper()
	v, ok := b.queues.Load(name)
	if !ok {
		t.Fatalf("no queue %s", name)
	}
	b.dur.cpMu.Lock()
	defer b.dur.cpMu.Unlock()
	return slices.Clone(v.(*taskQueue).cp.state)
}

// BenchmarkCheckpoint takes checkpoints of 10,000 and 100,000 durable
// queues with a task each, of which one changes between checkpoints,
// on the disk of b.TempDir:
//
//	go test ./internal/broker -run '^$' -bench Checkpoint -benchtime 20x
func BenchmarkCheckpoint(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			br := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if _, err := br.OpenStore(StoreConfig{Dir: b.TempDir(), CheckpointEvery: time.Hour, CheckpointBytes: 1 << 40}); err != nil {
				b.Fatal(err)
			}
			defer br.Close()
			for i := range n {
				name := fmt.Sprintf("q.%07d", i)
				if _, err := br.Declare(name, Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternTasks}}); err != nil {
					b.Fatal(err)
				}
				if _, err := br.Queue(name).Enqueue(queue.Message{Body: make([]byte, 256)}, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
			if err := br.Checkpoint(); err != nil {
				b.Fatal(err)
			}
			hot := br.Queue("q.0000000")
			b.ReportAllocs()
			for b.Loop() {
				if _, err := hot.Enqueue(queue.Message{Body: make([]byte, 256)}, nil, nil); err != nil {
					b.Fatal(err)
				}
				if err := br.Checkpoint(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(br.dur.lastSnap), "state-bytes")
		})
	}
}
