package queue

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
)

// storeJournal is the adapter the integration needs: one queue's share
// of the node's store.Log. It lives in a test so that the package does
// not depend on the store yet; this test proves the interface maps onto
// the store's API.
type storeJournal struct {
	log *store.Log
	id  uint32 // the queue's id in the log
}

var (
	_ Journal = storeJournal{}
	_ Reader  = storeJournal{}
)

func toStore(r Ref) store.Ref   { return store.Ref{Pos: store.Pos{Seg: r.Seg, Off: r.Off}, Len: r.Len} }
func fromStore(r store.Ref) Ref { return Ref{Seg: r.Seg, Off: r.Off, Len: r.Len} }

func (j storeJournal) Append(kind Kind, payload []byte, done func(error)) (Ref, error) {
	r, err := j.log.Append(j.id, store.Kind(kind), payload, done)
	return fromStore(r), err
}

func (j storeJournal) Release(refs []Ref, done func(error)) error {
	sr := make([]store.Ref, len(refs))
	for i, r := range refs {
		sr[i] = toStore(r)
	}
	return j.log.Release(j.id, sr, done)
}

func (j storeJournal) Read(ref Ref) ([]byte, error) {
	rec, err := j.log.Read(toStore(ref), nil)
	return rec.Payload, err
}

// replayStore dispatches the log's records to one Rebuilder per queue.
func replayStore(t *testing.T, log *store.Log, rbs map[uint32]*Rebuilder) {
	t.Helper()
	var rel []store.Ref
	err := log.Replay(func(rec store.Record) error {
		rb := rbs[rec.Queue]
		if rb == nil {
			return fmt.Errorf("record of unknown queue %d", rec.Queue)
		}
		e := Entry{Ref: fromStore(rec.Ref), Kind: Kind(rec.Kind), Payload: rec.Payload}
		if rec.Kind == store.KindRelease {
			var err error
			if rel, err = rec.Released(rel[:0]); err != nil {
				return err
			}
			for _, r := range rel {
				e.Released = append(e.Released, fromStore(r))
			}
		}
		return rb.Apply(e)
	})
	must(t, err)
}

func TestStoreJournalSurvivesCrash(t *testing.T) {
	fs := store.NewMemFS()
	log, _, err := store.Open(fs, "/data", store.Options{SegmentSize: 64 << 10})
	must(t, err)
	e := newEnv(t)
	newQueue := func(name string, id uint32) (*Queue, Config) {
		cfg := e.config()
		cfg.Journal = storeJournal{log, id}
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
	cfg1.Journal = storeJournal{log2, 1}
	cfg2.Journal = storeJournal{log2, 2}
	r1, err := rbs[1].Build("tasks", cfg1)
	must(t, err)
	r2, err := rbs[2].Build("other", cfg2)
	must(t, err)
	sameState(t, before1, r1.dump(false), in1)
	sameState(t, before2, r2.dump(false), nil)

	// The rebuilt queues drain, their bodies read back from the log, and
	// release every record.
	for _, q := range []*Queue{r1, r2} {
		w := addWorker(t, q, "after", 1000)
		for range 50 {
			e.clk.Advance(time.Minute)
			for _, d := range w.take() {
				if len(d.Body) == 0 {
					t.Fatalf("message %d delivered without its body", d.ID)
				}
				must(t, q.Ack(w.Consumer, d.ID))
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
	cfg.Journal = storeJournal{log, 1}
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
	cfg.Journal = storeJournal{log2, 1}
	r, err := rb.Build("tasks", cfg)
	must(t, err)
	sameState(t, before, r.dump(false), inflight)
	t.Logf("replayed %d records after the checkpoint; %d messages rebuilt; %d segments deleted by the checkpoint",
		rec.ReplayRecords, len(before.Msgs), log.Stats().SegmentsDeleted)
}
