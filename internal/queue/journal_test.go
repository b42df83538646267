package queue

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestJournalRecordsEachChange(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	w := addWorker(t, q, "w", 1)
	id := mustEnqueue(t, q, Message{Body: []byte("x"), Key: "k", Headers: map[string]string{"h": "v"}, Priority: 2})
	recs := e.j.Records()
	if len(recs) != 1 || recs[0].Kind != KindEnqueue {
		t.Fatalf("after enqueue: %+v", recs)
	}
	r, err := decodeEnqueue(recs[0].Payload)
	must(t, err)
	if r.id != id || string(r.body) != "x" || r.key != "k" || r.headers["h"] != "v" || r.prio != 2 || r.enqueued != epoch.UnixNano() {
		t.Fatalf("enqueue record %+v", r)
	}
	must(t, q.Nack(w.Consumer, id, true))
	recs = e.j.Records()
	if len(recs) != 2 || recs[1].Kind != KindAttempt {
		t.Fatalf("after a nack: %+v", recs)
	}
	a, err := decodeAttempt(recs[1].Payload)
	must(t, err)
	if a.id != id || a.attempts != 1 || a.due != epoch.Add(100*time.Millisecond).UnixNano() {
		t.Fatalf("attempt record %+v", a)
	}
	e.clk.Advance(time.Second)
	must(t, q.Nack(w.Consumer, id, true))
	recs = e.j.Records()
	// A second attempt record, and the release of the first.
	if len(recs) != 4 || recs[2].Kind != KindAttempt || recs[3].Kind != KindRelease || !slices.Equal(recs[3].Released, []Ref{recs[1].Ref}) {
		t.Fatalf("after a second nack: %+v", recs)
	}
	e.clk.Advance(time.Second)
	must(t, q.Ack(w.Consumer, id))
	recs = e.j.Records()
	if len(recs) != 5 || !slices.Equal(recs[4].Released, []Ref{recs[0].Ref, recs[2].Ref}) {
		t.Fatalf("after the ack: %+v", recs)
	}
	if e.j.Live() != 0 || e.j.Stats().BadReleases != 0 {
		t.Fatalf("live %d, stats %+v", e.j.Live(), e.j.Stats())
	}
}

func TestConfirmOnlyOnceDurable(t *testing.T) {
	e := newEnv(t)
	e.j.Manual = true
	q := e.queue(nil)
	var confirmed []int
	for i := range 3 {
		_, err := q.Enqueue(Message{Body: body(i)}, func(err error) {
			must(t, err)
			confirmed = append(confirmed, i)
		}, nil)
		must(t, err)
	}
	if len(confirmed) != 0 {
		t.Fatal("confirmed before the journal made it durable")
	}
	e.j.Sync()
	if !slices.Equal(confirmed, []int{0, 1, 2}) {
		t.Fatalf("confirmed %v", confirmed)
	}
	// A transient queue confirms at once.
	tq := e.queue(func(c *Config) { c.Journal = nil })
	ok := false
	_, err := tq.Enqueue(Message{}, func(err error) { ok = err == nil }, nil)
	must(t, err)
	if !ok {
		t.Fatal("transient queue did not confirm")
	}
}

func TestEnqueueRefusedWhenJournalFails(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	boom := errors.New("disk full")
	e.j.FailNext(boom)
	called := false
	if _, err := q.Enqueue(Message{Body: []byte("x")}, func(error) { called = true }, nil); !errors.Is(err, boom) {
		t.Fatalf("enqueue: %v", err)
	}
	if called {
		t.Fatal("confirm called for a refused message")
	}
	if s := q.Stats(); s.Messages() != 0 || s.Published != 0 || s.Bytes != 0 {
		t.Fatalf("a refused message counted: %+v", s)
	}
	if id := mustEnqueue(t, q, Message{}); id != 1 {
		t.Fatalf("next id %d, want 1", id)
	}
	// A failing release still acks in memory, and says so.
	w := addWorker(t, q, "w", 1)
	e.j.FailNext(boom)
	if err := q.Ack(w.Consumer, 1); !errors.Is(err, ErrJournal) || !errors.Is(err, boom) {
		t.Fatalf("ack: %v", err)
	}
	checkStats(t, q, 0, 0, 0)
}

// workload runs random operations on q: enqueues with and without keys,
// priorities, due times and TTLs; acks, nacks, consumers coming and
// going; time passing.
func workload(t *testing.T, e *env, q *Queue, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	var ws []*worker
	next := 0
	for step := range steps {
		switch op := rng.IntN(100); {
		case op < 45:
			m := Message{Body: fmt.Appendf(nil, "body-%d", step), Priority: uint8(rng.IntN(3) * 4)}
			if rng.IntN(2) == 0 {
				m.Key = fmt.Sprintf("k%d", rng.IntN(15))
			}
			if rng.IntN(4) == 0 {
				m.Headers = map[string]string{"n": fmt.Sprint(step), "t": "x"}
			}
			if rng.IntN(5) == 0 {
				m.DueAt = e.clk.Now().Add(time.Duration(rng.IntN(60)) * time.Second)
			}
			if rng.IntN(5) == 0 {
				m.TTL = time.Duration(1+rng.IntN(120)) * time.Second
			}
			mustEnqueue(t, q, m)
		case op < 75:
			for _, w := range ws {
				for _, d := range w.take() {
					var err error
					switch r := rng.IntN(10); {
					case r < 6:
						err = q.Ack(w.Consumer, d.ID)
					case r < 8:
						err = q.Nack(w.Consumer, d.ID, true)
					case r < 9:
						err = q.Nack(w.Consumer, d.ID, false)
					default:
						// Keep it in flight. Deliveries may come from
						// the store's syncer (a key freed once its ack
						// is durable): under the worker's lock.
						w.mu.Lock()
						w.got = append(w.got, d)
						w.mu.Unlock()
					}
					if err != nil && !errors.Is(err, ErrNotInFlight) {
						t.Fatal(err)
					}
				}
				break
			}
		case op < 82:
			if len(ws) < 4 {
				ws = append(ws, addWorker(t, q, fmt.Sprintf("w%d.%d", seed, next), 1+rng.IntN(5)))
				next++
			}
		case op < 86:
			if len(ws) > 0 {
				i := rng.IntN(len(ws))
				must(t, q.RemoveConsumer(ws[i].Consumer))
				ws = slices.Delete(ws, i, i+1)
			}
		default:
			e.clk.Advance(time.Duration(rng.IntN(5000)) * time.Millisecond)
		}
		if err := q.check(); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
	}
}

// sameState compares a queue before a restart with the one rebuilt:
// the same messages (those in flight are ready again), the same order
// within each key and priority level, apart from where the messages
// that were in flight go back.
func sameState(t *testing.T, before, after queueDump, inflight map[uint64]bool) {
	t.Helper()
	if !slices.Equal(before.Msgs, after.Msgs) {
		for i := range min(len(before.Msgs), len(after.Msgs)) {
			if before.Msgs[i] != after.Msgs[i] {
				t.Fatalf("message differs:\nbefore %+v\nafter  %+v", before.Msgs[i], after.Msgs[i])
			}
		}
		t.Fatalf("%d messages before, %d after", len(before.Msgs), len(after.Msgs))
	}
	if before.NextID != after.NextID {
		t.Fatalf("next id %d before, %d after", before.NextID, after.NextID)
	}
	without := func(ids []uint64) []uint64 {
		return slices.DeleteFunc(slices.Clone(ids), func(id uint64) bool { return inflight[id] })
	}
	for k, order := range before.Keys {
		if got := without(after.Keys[k]); !slices.Equal(got, order) {
			t.Fatalf("key %s: order %v before, %v after", k, order, after.Keys[k])
		}
	}
	for k, order := range after.Keys {
		if len(before.Keys[k]) == 0 && len(without(order)) > 0 {
			t.Fatalf("key %s appeared: %v", k, order)
		}
	}
	for p := range before.Levels {
		if got := without(after.Levels[p]); !slices.Equal(got, before.Levels[p]) {
			t.Fatalf("priority %d: order %v before, %v after", p, before.Levels[p], after.Levels[p])
		}
	}
}

func inflightIDs(q *Queue) map[uint64]bool {
	out := map[uint64]bool{}
	for _, m := range q.dump(false).Msgs {
		if m.State == "inflight" {
			out[m.ID] = true
		}
	}
	return out
}

func TestReplayRebuildsTheSameState(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config()
			cfg.MaxAttempts = 4
			cfg.BackoffBase = time.Second
			cfg.BackoffMax = 8 * time.Second
			q, err := New("q", cfg)
			must(t, err)
			workload(t, e, q, seed, 600)
			before := q.dump(true)
			inflight := inflightIDs(q)
			stats := q.Stats()
			must(t, q.Close())

			r, err := Recover("q", cfg, e.j.Replay)
			must(t, err)
			after := r.dump(false)
			sameState(t, before, after, inflight)
			s := r.Stats()
			if s.Ready != stats.Ready+stats.Unacked || s.Delayed != stats.Delayed || s.Bytes != stats.Bytes || s.Keys != stats.Keys {
				t.Fatalf("stats before %+v, after %+v", stats, s)
			}
			if err := r.check(); err != nil {
				t.Fatal(err)
			}
			// The rebuilt queue goes on: everything can be consumed, and
			// no journal record is left.
			w := addWorker(t, r, "after", 1000)
			for range 100 {
				e.clk.Advance(time.Minute)
				for _, d := range w.take() {
					must(t, r.Ack(w.Consumer, d.ID))
				}
			}
			if s := r.Stats(); s.Messages() != 0 {
				t.Fatalf("left after draining: %+v", s)
			}
			if n := e.j.Live(); n != 0 {
				t.Fatalf("%d journal records live after draining", n)
			}
		})
	}
}

func TestReplayIsIdempotent(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	workload(t, e, q, 99, 400)
	before := q.dump(true)
	inflight := inflightIDs(q)
	must(t, q.Close())
	// A fuzzy checkpoint makes replay see some records twice: apply the
	// whole journal, then its second half again.
	recs := e.j.Records()
	rb := NewRebuilder()
	apply := func(rs []MemRecord) {
		for _, r := range rs {
			must(t, rb.Apply(Entry(r)))
		}
	}
	apply(recs)
	apply(recs[len(recs)/2:])
	r, err := rb.Build("q", e.config())
	must(t, err)
	sameState(t, before, r.dump(false), inflight)
}

func TestCrashKeepsWhatWasConfirmed(t *testing.T) {
	e := newEnv(t)
	e.j.Manual = true
	q := e.queue(nil)
	confirmed := map[uint64]bool{}
	enqueue := func(n int) {
		for i := range n {
			var id uint64
			id, err := q.Enqueue(Message{Body: body(i)}, func(err error) {
				if err == nil {
					confirmed[id] = true
				}
			}, nil)
			must(t, err)
		}
	}
	enqueue(10)
	e.j.Sync()
	enqueue(5) // appended, not durable, not confirmed
	w := addWorker(t, q, "w", 3)
	for _, d := range w.take() {
		must(t, q.Ack(w.Consumer, d.ID)) // releases not durable: they come back
	}
	r, err := Recover("q", e.config(), e.j.Crash().Replay)
	must(t, err)
	var got []uint64
	for _, m := range r.dump(false).Msgs {
		got = append(got, m.ID)
	}
	var want []uint64
	for id := range confirmed {
		want = append(want, id)
	}
	slices.Sort(want)
	if len(want) != 10 || !slices.Equal(got, want) {
		t.Fatalf("after the crash: %v; confirmed %v", got, want)
	}
	if next := r.NextID(); next != 11 {
		t.Fatalf("next id %d", next)
	}
}

func TestLazyBodiesReadBackOnDelivery(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	for i := range 50 {
		mustEnqueue(t, q, Message{Body: body(i), Headers: map[string]string{"i": fmt.Sprint(i)}})
	}
	must(t, q.Close())
	rb := NewRebuilder()
	rb.LazyBodies = true
	must(t, e.j.Replay(rb.Apply))
	r, err := rb.Build("q", e.config())
	must(t, err)
	r.mu.Lock()
	for _, m := range r.index {
		if m.body != nil {
			t.Fatal("body loaded at restart")
		}
	}
	r.mu.Unlock()
	if s := r.Stats(); s.Bytes != q.Stats().Bytes {
		t.Fatalf("bytes %d, want %d", s.Bytes, q.Stats().Bytes)
	}
	w := addWorker(t, r, "w", 100)
	got := w.take()
	if len(got) != 50 {
		t.Fatalf("got %d", len(got))
	}
	for i, d := range got {
		if string(d.Body) != string(body(i)) || d.Headers["i"] != fmt.Sprint(i) {
			t.Fatalf("delivery %d: %q %v", i, d.Body, d.Headers)
		}
	}
	// Without a Reader, lazy bodies are refused.
	rb = NewRebuilder()
	rb.LazyBodies = true
	cfg := e.config()
	cfg.Journal = journalOnly{e.j}
	if _, err := rb.Build("q", cfg); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("lazy without a reader: %v", err)
	}
}

// journalOnly hides MemJournal's Reader.
type journalOnly struct{ Journal }

// failingReader is a journal whose record bad cannot be read back; it
// counts the tries in badReads, if set.
type failingReader struct {
	*MemJournal
	bad      Ref
	badReads *atomic.Int64
}

func (j failingReader) Read(ref Ref) ([]byte, error) {
	if ref == j.bad {
		if j.badReads != nil {
			j.badReads.Add(1)
		}
		return nil, errors.New("checksum mismatch")
	}
	return j.MemJournal.Read(ref)
}

func TestUnreadableBodyIsDeadLettered(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	mustEnqueue(t, q, Message{Body: []byte("lost"), Key: "k"})
	mustEnqueue(t, q, Message{Body: []byte("next"), Key: "k"})
	must(t, q.Close())
	rb := NewRebuilder()
	rb.LazyBodies = true
	must(t, e.j.Replay(rb.Apply))
	cfg := e.config()
	var reads atomic.Int64
	cfg.Journal = failingReader{e.j, e.j.Records()[0].Ref, &reads}
	var logged bytes.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logged, nil)) // written under the queue's lock
	r, err := rb.Build("q", cfg)
	must(t, err)
	w := addWorker(t, r, "w", 10)
	got := w.take()
	if len(got) != 1 || got[0].ID != 2 || string(got[0].Body) != "next" {
		t.Fatalf("got %+v; the unreadable message should not block its key", got)
	}
	if dl := e.deadLetters(); len(dl) != 1 || dl[0].Reason != ReasonUnreadable || dl[0].Message.ID != 1 {
		t.Fatalf("dead letters %+v", dl)
	}
	// Read once, logged once (it was read and logged again to dead-letter it).
	r.mu.Lock()
	lines := strings.Count(logged.String(), "cannot read a message back")
	r.mu.Unlock()
	if n := reads.Load(); n != 1 || lines != 1 {
		t.Errorf("the unreadable record was read %d times and logged %d times, want once:\n%s", n, lines, logged.String())
	}
	if err := r.check(); err != nil {
		t.Fatal(err)
	}
}
