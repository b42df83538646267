package queue

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// confirms records the confirms of enqueues.
type confirms struct {
	mu   sync.Mutex
	errs []error
}

func (c *confirms) fn() func(error) {
	return func(err error) {
		c.mu.Lock()
		c.errs = append(c.errs, err)
		c.mu.Unlock()
	}
}

func (c *confirms) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.errs)
}

func enqueueDup(t testing.TB, q *Queue, producer string, seq uint64, c *confirms) uint64 {
	t.Helper()
	id, err := q.Enqueue(Message{Body: fmt.Appendf(nil, "%s/%d", producer, seq), Producer: producer, Seq: seq}, c.fn(), nil)
	must(t, err)
	return id
}

// TestDedupResendStoresOnce: a resend of a (producer, seq) the window
// holds gets the first id and its confirm, and is not stored; another
// producer's same seq, or a message without a producer, is stored.
func TestDedupResendStoresOnce(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	var c confirms
	a := enqueueDup(t, q, "p", 1, &c)
	if b := enqueueDup(t, q, "p", 1, &c); b != a {
		t.Fatalf("resend got id %d, want %d", b, a)
	}
	other := enqueueDup(t, q, "p2", 1, &c)
	next := enqueueDup(t, q, "p", 2, &c)
	plain := mustEnqueue(t, q, Message{Body: []byte("x")})
	if len(slices.Compact([]uint64{a, other, next, plain})) != 4 {
		t.Fatalf("ids %d %d %d %d", a, other, next, plain)
	}
	checkStats(t, q, 4, 0, 0)
	if got := e.j.Stats().ByKind[KindEnqueue]; got != 4 {
		t.Fatalf("%d enqueue records, want 4", got)
	}
	if c.n() != 4 {
		t.Fatalf("%d confirms, want 4", c.n())
	}
	if s := q.Stats(); s.Deduplicated != 1 || s.DedupPairs != 3 || s.Published != 4 {
		t.Fatalf("stats %+v", s)
	}
}

// TestDedupResendWaitsForTheFirstConfirm: a resend that comes before the
// first one is durable is confirmed with it, not before.
func TestDedupResendWaitsForTheFirstConfirm(t *testing.T) {
	e := newEnv(t)
	e.j.Manual = true
	q := e.queue(nil)
	var first, resend confirms
	a := enqueueDup(t, q, "p", 7, &first)
	if b := enqueueDup(t, q, "p", 7, &resend); b != a {
		t.Fatalf("resend got id %d, want %d", b, a)
	}
	if first.n()+resend.n() != 0 {
		t.Fatal("confirmed before the record is durable")
	}
	e.j.Sync()
	if first.n() != 1 || resend.n() != 1 || resend.errs[0] != nil {
		t.Fatalf("after sync: first %v, resend %v", first.errs, resend.errs)
	}
	// Durable now: a resend is confirmed at once.
	enqueueDup(t, q, "p", 7, &resend)
	if resend.n() != 2 {
		t.Fatal("a resend of a durable message was not confirmed")
	}
}

// TestDedupFailedRecordIsStoredAgain: if the first record may be lost,
// its resend is stored afresh.
func TestDedupFailedRecordIsStoredAgain(t *testing.T) {
	e := newEnv(t)
	e.j.Manual = true
	q := e.queue(nil)
	var c confirms
	a := enqueueDup(t, q, "p", 1, &c)
	enqueueDup(t, q, "p", 1, &c) // waits with the first
	// Fail the pending confirms, as a journal that lost them would.
	e.j.mu.Lock()
	pending := e.j.pending
	e.j.pending = nil
	e.j.mu.Unlock()
	bad := errors.New("disk gone")
	for _, done := range pending {
		done(bad)
	}
	if c.n() != 2 || !errors.Is(c.errs[0], bad) || !errors.Is(c.errs[1], bad) {
		t.Fatalf("confirms %v", c.errs)
	}
	if b := enqueueDup(t, q, "p", 1, &c); b == a {
		t.Fatal("a resend after a failed record was not stored again")
	}
}

// TestDedupWindowAndCap: a pair is forgotten once older than the window,
// and the oldest beyond DedupMax.
func TestDedupWindowAndCap(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.DedupWindow, c.DedupMax = time.Minute, 3 })
	var c confirms
	a := enqueueDup(t, q, "p", 1, &c)
	e.clk.Advance(time.Minute)
	if enqueueDup(t, q, "p", 1, &c) != a {
		t.Fatal("forgotten at the window's edge")
	}
	e.clk.Advance(time.Nanosecond)
	b := enqueueDup(t, q, "p", 1, &c)
	if b == a {
		t.Fatal("remembered past the window")
	}
	for seq := uint64(2); seq <= 4; seq++ {
		enqueueDup(t, q, "p", seq, &c)
	}
	if s := q.Stats(); s.DedupPairs != 3 {
		t.Fatalf("window holds %d, want 3", s.DedupPairs)
	}
	if enqueueDup(t, q, "p", 1, &c) == b {
		t.Fatal("remembered beyond DedupMax")
	}
	off := e.queue(func(c *Config) { c.DedupWindow = -1 })
	x := enqueueDup(t, off, "p", 1, &c)
	if y := enqueueDup(t, off, "p", 1, &c); x == y {
		t.Fatal("deduplicated with the window off")
	}
}

// TestDedupSettledMessage: a resend of a message acked already gets its
// id and no new message; a resend that watches gets its last event.
func TestDedupSettledMessage(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	var c confirms
	a := enqueueDup(t, q, "p", 1, &c)
	w := addWorker(t, q, "w", 1)
	must(t, q.Ack(w.Consumer, w.take()[0].ID))
	var got []Event
	id, err := q.Enqueue(Message{Body: []byte("again"), Producer: "p", Seq: 1}, nil, func(ev Event) { got = append(got, ev) })
	must(t, err)
	if id != a || q.Stats().Messages() != 0 {
		t.Fatalf("resend: id %d (want %d), %d messages", id, a, q.Stats().Messages())
	}
	if len(got) != 1 || got[0].Kind != EventCompleted || got[0].ID != a {
		t.Fatalf("watcher got %+v", got)
	}
}

// TestDedupRebuiltByRecover: after a crash, the window is rebuilt from
// the enqueue records, those of acked messages included, and a version
// 1 record (written before deduplication) still loads.
func TestDedupRebuiltByRecover(t *testing.T) {
	e := newEnv(t)
	e.j.Manual = true
	q := e.queue(nil)
	var c confirms
	ids := map[uint64]uint64{}
	for seq := uint64(1); seq <= 5; seq++ {
		ids[seq] = enqueueDup(t, q, "p", seq, &c)
	}
	mustEnqueue(t, q, Message{Body: []byte("v1 record")})
	w := addWorker(t, q, "w", 1)
	must(t, q.Ack(w.Consumer, w.take()[0].ID)) // seq 1
	e.j.Sync()
	enqueueDup(t, q, "p", 6, &c) // not durable: lost in the crash
	j := e.j.Crash()
	must(t, q.Close())

	cfg := e.config()
	cfg.Journal = j
	r, err := Recover("q", cfg, j.Replay)
	must(t, err)
	if n := r.Stats().Messages(); n != 5 {
		t.Fatalf("%d messages after recovery, want 5", n)
	}
	for seq := uint64(1); seq <= 5; seq++ {
		if id := enqueueDup(t, r, "p", seq, &c); id != ids[seq] {
			t.Fatalf("resend of seq %d after recovery: id %d, want %d", seq, id, ids[seq])
		}
	}
	if n := r.Stats().Messages(); n != 5 {
		t.Fatalf("%d messages after the resends, want 5", n)
	}
	// Seq 6 was never confirmed: its resend is stored.
	if id := enqueueDup(t, r, "p", 6, &c); id <= ids[5] || r.Stats().Messages() != 6 {
		t.Fatalf("resend of the lost seq 6: id %d, %d messages", id, r.Stats().Messages())
	}
}

// TestDedupRecoverDropsExpiredPairs: pairs older than the window when
// the queue is rebuilt are not kept.
func TestDedupRecoverDropsExpiredPairs(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	var c confirms
	a := enqueueDup(t, q, "p", 1, &c)
	must(t, q.Close())
	e.clk.Advance(DefaultDedupWindow + time.Second)
	r, err := Recover("q", e.config(), e.j.Replay)
	must(t, err)
	if r.Stats().DedupPairs != 0 {
		t.Fatalf("window holds %d after its time", r.Stats().DedupPairs)
	}
	if enqueueDup(t, r, "p", 1, &c) == a {
		t.Fatal("deduplicated past the window")
	}
}

// TestDedupKeptBySnapshot: a checkpoint's snapshot keeps the pairs of
// messages settled before it, whose records the log may have dropped;
// a version 2 snapshot (before deduplication) still loads.
func TestDedupKeptBySnapshot(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	var c confirms
	a := enqueueDup(t, q, "p", 1, &c)
	b := enqueueDup(t, q, "p", 2, &c)
	w := addWorker(t, q, "w", 1)
	must(t, q.Ack(w.Consumer, w.take()[0].ID)) // a
	snap := q.AppendSnapshot(nil)
	if snap[4] != snapVersion {
		t.Fatalf("snapshot version %d", snap[4])
	}
	must(t, q.Close())

	rb := NewRebuilder()
	must(t, rb.LoadSnapshot(snap))
	r, err := rb.Build("q", e.config())
	must(t, err)
	if enqueueDup(t, r, "p", 1, &c) != a || enqueueDup(t, r, "p", 2, &c) != b || r.Stats().Messages() != 1 {
		t.Fatal("the snapshot lost the window")
	}
	must(t, r.check())

	// The same snapshot as version 2 wrote it: no dedup section.
	plain := e.queue(nil)
	mustEnqueue(t, plain, Message{Body: []byte("x")})
	v3 := plain.AppendSnapshot(nil)
	v2 := append([]byte{}, v3[:len(v3)-4]...)
	v2[4] = snapVersionRuns
	rb = NewRebuilder()
	must(t, rb.LoadSnapshot(v2))
	if rb.Len() != 1 {
		t.Fatalf("version 2 snapshot: %d messages", rb.Len())
	}
}

// TestDedupRefusesBadPairs: a producer too long, or a seq of 0, is
// refused.
func TestDedupRefusesBadPairs(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	for _, m := range []Message{
		{Producer: string(make([]byte, MaxProducerLen+1)), Seq: 1},
		{Producer: "p"},
	} {
		if _, err := q.Enqueue(m, nil, nil); !errors.Is(err, ErrBadMessage) {
			t.Fatalf("%q/%d: %v", m.Producer[:min(8, len(m.Producer))], m.Seq, err)
		}
	}
}

// BenchmarkDedupWindowBytes reports the heap a pair of the window costs:
// the map entry, the FIFO slot and the entry, the producer id shared.
func BenchmarkDedupWindowBytes(b *testing.B) {
	const n = 100_000
	p := "c-ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	for range b.N {
		var w dedupWindow
		w.init(Config{})
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range n {
			w.insert(&dedupEntry{key: dedupKey{p, uint64(i + 1)}, id: uint64(i + 1), at: 1}, 1)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/pair")
		runtime.KeepAlive(&w)
	}
}

// TestDedupConcurrentResends: resends of one pair from many goroutines,
// while the journal confirms from another, store one message; every
// one gets its id and exactly one confirm.
func TestDedupConcurrentResends(t *testing.T) {
	e := newEnv(t)
	e.j.Manual = true
	q := e.queue(nil)
	const n = 16
	var c confirms
	ids := make(chan uint64, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids <- enqueueDup(t, q, "p", 1, &c)
		}()
		go func() {
			defer wg.Done()
			e.j.Sync()
		}()
	}
	wg.Wait()
	e.j.Sync()
	close(ids)
	var first uint64
	for id := range ids {
		if first == 0 {
			first = id
		}
		if id != first {
			t.Fatalf("ids %d and %d for one pair", first, id)
		}
	}
	if c.n() != n || q.Stats().Messages() != 1 {
		t.Fatalf("%d confirms (want %d), %d messages (want 1)", c.n(), n, q.Stats().Messages())
	}
}
