package queue

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
)

// replayStore dispatches the log's records to one Rebuilder per queue.
func replayStore(t *testing.T, log *store.Log, rbs map[uint32]*Rebuilder) {
	t.Helper()
	skipped, err := ReplayLog(log, func(id uint32) *Rebuilder { return rbs[id] })
	must(t, err)
	if skipped != 0 {
		t.Fatalf("%d records skipped", skipped)
	}
}

func TestStoreJournalSurvivesCrash(t *testing.T) {
	fs := store.NewMemFS()
	log, _, err := store.Open(fs, "/data", store.Options{SegmentSize: 64 << 10})
	must(t, err)
	e := newEnv(t)
	newQueue := func(name string, id uint32) (*Queue, Config) {
		cfg := e.config()
		cfg.Journal = StoreJournal{log, id}
		cfg.BackoffBase, cfg.BackoffMax = time.Second, 4*time.Second
		cfg.MaxAttempts = 5
		q, err := New(name, cfg)
		must(t, err)
		return q, cfg
	}
	q1, cfg1 := newQueue("tasks", 1)
	q2, cfg2 := newQueue("other", 2)
	var mu sync.Mutex
	confirmed := 0
	for i := range 300 {
		_, err := q2.Enqueue(Message{Body: body(i), Key: fmt.Sprint(i % 7)}, func(err error) {
			must(t, err)
			mu.Lock()
			confirmed++
			mu.Unlock()
		}, nil)
		must(t, err)
	}
	workload(t, e, q1, 7, 800)
	must(t, log.Sync())
	mu.Lock()
	if confirmed != 300 {
		t.Fatalf("%d of 300 confirmed after a sync", confirmed)
	}
	mu.Unlock()
	before1, in1 := q1.dump(true), inflightIDs(q1)
	before2 := q2.dump(true)
	q1.Close()
	q2.Close()

	// kill -9: only what was synced survives.
	log2, rec, err := store.Open(fs.Crash(nil), "/data", store.Options{SegmentSize: 64 << 10})
	must(t, err)
	defer log2.Close()
	if !rec.Clean() {
		t.Fatalf("recovery: %+v", rec)
	}
	rbs := map[uint32]*Rebuilder{1: NewRebuilder(), 2: NewRebuilder()}
	rbs[1].LazyBodies = true
	replayStore(t, log2, rbs)
	cfg1.Journal = StoreJournal{log2, 1}
	cfg2.Journal = StoreJournal{log2, 2}
	r1, err := rbs[1].Build("tasks", cfg1)
	must(t, err)
	r2, err := rbs[2].Build("other", cfg2)
	must(t, err)
	sameState(t, before1, r1.dump(false), in1)
	sameState(t, before2, r2.dump(false), nil)

	// The rebuilt queues drain, their bodies read back from the log, and
	// release every record. The next task of a key comes once the ack of
	// the one before is durable, from the log's writer: poll.
	for _, q := range []*Queue{r1, r2} {
		w := addWorker(t, q, "after", 1000)
		deadline := time.Now().Add(30 * time.Second)
		for k := 0; (k < 50 || q.Stats().Messages() > 0) && time.Now().Before(deadline); k++ {
			e.clk.Advance(time.Minute)
			got := w.take()
			for _, d := range got {
				if len(d.Body) == 0 {
					t.Fatalf("message %d delivered without its body", d.ID)
				}
				must(t, q.Ack(w.Consumer, d.ID))
			}
			if len(got) == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		if s := q.Stats(); s.Messages() != 0 {
			t.Fatalf("%s left after draining: %+v", q.Name(), s)
		}
	}
	must(t, log2.Sync())
	if st := log2.Stats(); st.BadReleases != 0 || st.LiveRecords != 0 {
		t.Fatalf("store: %d bad releases, %d live records after draining", st.BadReleases, st.LiveRecords)
	}
}

func TestStoreCheckpointThenReplay(t *testing.T) {
	fs := store.NewMemFS()
	opts := store.Options{SegmentSize: 16 << 10}
	log, _, err := store.Open(fs, "/data", opts)
	must(t, err)
	e := newEnv(t)
	cfg := e.config()
	cfg.Journal = StoreJournal{log, 1}
	cfg.BackoffBase, cfg.BackoffMax = time.Second, 4*time.Second
	q, err := New("tasks", cfg)
	must(t, err)
	workload(t, e, q, 11, 1500)
	// The checkpoint holds the queue's snapshot as the store's state.
	_, err = log.Checkpoint(func(store.Pos) ([]byte, error) { return q.AppendSnapshot(nil), nil })
	must(t, err)
	workload(t, e, q, 12, 300)
	must(t, log.Sync())
	before, inflight := q.dump(true), inflightIDs(q)
	q.Close()

	log2, rec, err := store.Open(fs.Crash(nil), "/data", opts)
	must(t, err)
	defer log2.Close()
	if rec.State == nil {
		t.Fatal("no checkpoint state")
	}
	rb := NewRebuilder()
	must(t, rb.LoadSnapshot(rec.State))
	replayStore(t, log2, map[uint32]*Rebuilder{1: rb})
	cfg.Journal = StoreJournal{log2, 1}
	r, err := rb.Build("tasks", cfg)
	must(t, err)
	sameState(t, before, r.dump(false), inflight)
	t.Logf("replayed %d records after the checkpoint; %d messages rebuilt; %d segments deleted by the checkpoint",
		rec.ReplayRecords, len(before.Msgs), log.Stats().SegmentsDeleted)
}

// TestStoreSpillCrash: a queue on the store with a tiny budget spills its
// index to the store's runs; checkpoints name them; after a crash the
// queue rebuilds from the last checkpoint and the log after it, runs
// included, and every message confirmed and not acked comes out, with
// its body, once; no record and no run is left after draining.
func TestStoreSpillCrash(t *testing.T) {
	smallRuns(t)
	fs := store.NewMemFS()
	opts := store.Options{SegmentSize: 64 << 10}
	log, _, err := store.Open(fs, "/data", opts)
	must(t, err)
	e := newEnv(t)
	cfg := e.config()
	cfg.Journal = StoreJournal{log, 1}
	cfg.Memory = NewMemory(16 << 10)
	q, err := New("tasks", cfg)
	must(t, err)
	var mu sync.Mutex
	confirmed := map[uint64]bool{}
	acked := map[uint64]bool{}
	enqueue := func(n int) {
		for i := range n {
			var id uint64
			ready := make(chan struct{})
			id, err := q.Enqueue(Message{Body: fmt.Appendf(nil, "m%d-%d", n, i), Priority: uint8(i % 2 * 5)}, func(err error) {
				<-ready
				if err == nil {
					mu.Lock()
					confirmed[id] = true
					mu.Unlock()
				}
			}, nil)
			must(t, err)
			close(ready)
		}
	}
	w := addWorker(t, q, "w", 3)
	settle := func(n int) {
		for range n {
			for _, d := range w.take() {
				if d.ID%5 == 0 {
					must(t, q.Nack(w.Consumer, d.ID, true))
					continue
				}
				must(t, q.Ack(w.Consumer, d.ID))
				acked[d.ID] = true
			}
			e.clk.Advance(time.Second)
		}
	}
	must(t, q.SetPrefetch(w.Consumer, 1))
	enqueue(800)
	settle(40)
	_, err = log.Checkpoint(func(store.Pos) ([]byte, error) { return q.AppendSnapshot(nil), nil })
	must(t, err)
	if q.Stats().Spilled == 0 {
		t.Fatal("nothing spilled")
	}
	enqueue(500)
	settle(60)
	_, err = log.Checkpoint(func(store.Pos) ([]byte, error) { return q.AppendSnapshot(nil), nil })
	must(t, err)
	enqueue(300)
	settle(50)
	must(t, log.Sync())
	before, inflight := q.dump(true), inflightIDs(q)
	spilled := q.Stats().Spilled
	q.Close()

	log2, rec, err := store.Open(fs.Crash(nil), "/data", opts)
	must(t, err)
	defer log2.Close()
	rb := NewRebuilder()
	must(t, rb.LoadSnapshot(rec.State))
	replayStore(t, log2, map[uint32]*Rebuilder{1: rb})
	cfg.Journal = StoreJournal{log2, 1}
	r, err := rb.Build("tasks", cfg)
	must(t, err)
	if err := r.check(); err != nil {
		t.Fatal(err)
	}
	sameState(t, before, r.dump(false), inflight)
	t.Logf("%d spilled before the crash; %d confirmed, %d acked; replayed %d records", spilled, len(confirmed), len(acked), rec.ReplayRecords)

	got := map[uint64]int{}
	w2 := addWorker(t, r, "after", 100)
	for range 100 {
		e.clk.Advance(time.Minute)
		for _, d := range w2.take() {
			if len(d.Body) == 0 {
				t.Fatalf("message %d delivered without its body", d.ID)
			}
			got[d.ID]++
			must(t, r.Ack(w2.Consumer, d.ID))
		}
	}
	for id := range confirmed {
		if !acked[id] && got[id] == 0 {
			t.Fatalf("confirmed message %d lost", id)
		}
	}
	for id, n := range got {
		if n > 1 || acked[id] {
			t.Fatalf("message %d delivered %d times after the restart (acked before: %v)", id, n, acked[id])
		}
	}
	_, err = log2.Checkpoint(func(store.Pos) ([]byte, error) { return r.AppendSnapshot(nil), nil })
	must(t, err)
	_, err = log2.Checkpoint(func(store.Pos) ([]byte, error) { return r.AppendSnapshot(nil), nil })
	must(t, err)
	if st := log2.Stats(); st.LiveRecords != 0 || st.Runs != 0 || st.BadReleases != 0 {
		t.Fatalf("after draining: %d live records, %d runs, %d bad releases", st.LiveRecords, st.Runs, st.BadReleases)
	}
}

// TestAcksDoNotWaitForPublishers: with the disk stalled and the store's
// MaxPending reached, a publisher waits (outside the queue's lock), and
// acks and deliveries of the same queue go on. (Not redeliveries here:
// MemFS holds its lock while a test stalls a write, so a read back
// would wait for it.)
func TestAcksDoNotWaitForPublishers(t *testing.T) {
	fs := store.NewMemFS()
	log, _, err := store.Open(fs, "/data", store.Options{SegmentSize: 64 << 10, MaxPending: 2 << 10})
	must(t, err)
	defer log.Close()
	e := newEnv(t)
	cfg := e.config()
	cfg.Journal = StoreJournal{log, 1}
	cfg.BackoffBase = 0
	q, err := New("tasks", cfg)
	must(t, err)
	for i := range 6 {
		mustEnqueue(t, q, Message{Body: body(i)})
	}
	must(t, log.Sync())
	w := addWorker(t, q, "w", 3)

	stalled := make(chan struct{})
	unstall := make(chan struct{})
	var once sync.Once
	fs.SetInjector(func(op store.Op, name string) error {
		if op == store.OpWrite {
			once.Do(func() { close(stalled) })
			<-unstall
		}
		return nil
	})
	published := make(chan struct{})
	go func() {
		defer close(published)
		for range 100 {
			if _, err := q.Enqueue(Message{Body: make([]byte, 200)}, nil, nil); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	<-stalled
	// The publisher is now held by flow control (its 100 messages do not
	// fit 2 KiB), and the writer by the disk.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 2 {
			ds := w.take()
			for _, d := range ds {
				must(t, q.Ack(w.Consumer, d.ID))
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		close(unstall)
		t.Fatal("acks waited behind a publisher held by flow control")
	}
	select {
	case <-published:
		t.Fatal("the publisher did not wait for the disk")
	default:
	}
	close(unstall)
	<-published
	fs.SetInjector(nil)
	must(t, log.Sync())
	if s := q.Stats(); s.Published != 106 {
		t.Fatalf("stats %+v", s)
	}
}
