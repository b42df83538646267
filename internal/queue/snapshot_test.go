package queue

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestCheckpointThenReplayRebuildsTheSameState(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			e := newEnv(t)
			cfg := e.config()
			cfg.MaxAttempts = 4
			cfg.BackoffBase, cfg.BackoffMax = time.Second, 8*time.Second
			q, err := New("q", cfg)
			must(t, err)
			workload(t, e, q, seed, 300)
			// A fuzzy checkpoint: the position is taken, changes go on,
			// then the snapshot is taken.
			at := len(e.j.Records())
			workload(t, e, q, seed+100, 30)
			snap := q.AppendSnapshot(nil)
			workload(t, e, q, seed+200, 300)
			before, inflight := q.dump(true), inflightIDs(q)
			must(t, q.Close())

			rb := NewRebuilder()
			must(t, rb.LoadSnapshot(snap))
			for _, r := range e.j.Records()[at:] {
				must(t, rb.Apply(Entry(r)))
			}
			r, err := rb.Build("q", cfg)
			must(t, err)
			sameState(t, before, r.dump(false), inflight)
			if err := r.check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestLoadSnapshotRefusesDamage(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	for i := range 5 {
		mustEnqueue(t, q, Message{Body: body(i), Key: "k"})
	}
	snap := q.AppendSnapshot(nil)
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"magic", append([]byte("XXXX"), snap[4:]...)},
		{"truncated", snap[:len(snap)-1]},
		{"trailing", append(snap[:len(snap):len(snap)], 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rb := NewRebuilder()
			if err := rb.LoadSnapshot(tc.b); !errors.Is(err, errBadRecord) {
				t.Fatalf("got %v", err)
			}
			if rb.Len() != 0 {
				t.Fatal("a bad snapshot loaded messages")
			}
		})
	}
	rb := NewRebuilder()
	must(t, rb.LoadSnapshot(snap))
	if rb.Len() != 5 {
		t.Fatalf("loaded %d", rb.Len())
	}
}

func FuzzLoadSnapshot(f *testing.F) {
	e := newEnv(f)
	q := e.queue(nil)
	mustEnqueue(f, q, Message{Body: []byte("x"), Key: "k", Priority: 3, DueAt: epoch.Add(time.Hour)})
	mustEnqueue(f, q, Message{Body: []byte("y")})
	f.Add(q.AppendSnapshot(nil))
	mustEnqueue(f, q, Message{Body: []byte("z"), Producer: "p", Seq: 1})
	mustEnqueue(f, q, Message{Body: []byte("z"), Producer: "other", Seq: 9})
	f.Add(q.AppendSnapshot(nil))
	// A queue that spilled: the snapshot names runs.
	smallRuns(f)
	sq := e.queue(func(c *Config) { c.Memory = NewMemory(8 << 10) })
	for i := range 100 {
		mustEnqueue(f, sq, Message{Body: body(i), Priority: uint8(i % 2)})
	}
	if sq.Stats().Spilled == 0 {
		f.Fatal("nothing spilled")
	}
	f.Add(sq.AppendSnapshot(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		rb := NewRebuilder()
		if rb.LoadSnapshot(b) != nil {
			return
		}
		cfg := DefaultConfig()
		cfg.Scheduler = NewScheduler(SchedulerOptions{Clock: newFakeClock()})
		cfg.Journal = NewMemJournal()
		r, err := rb.Build("q", cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.check(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestAppendSnapshotSince: a snapshot taken at a version is reported
// unchanged while nothing was done to the queue but reads, and changed
// after anything that changes it.
func TestAppendSnapshotSince(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	snap := func(v uint64) (uint64, bool) {
		t.Helper()
		out, at, changed := q.AppendSnapshotSince([]byte("x"), v)
		if !changed && string(out) != "x" {
			t.Fatalf("unchanged, yet %d bytes appended", len(out)-1)
		}
		if changed && len(out) == 1 {
			t.Fatal("changed, yet nothing appended")
		}
		return at, changed
	}
	v, changed := snap(0)
	if !changed || v == 0 {
		t.Fatalf("first snapshot: version %d, changed %v", v, changed)
	}
	reads := func() {
		q.Stats()
		q.NextID()
		q.Consumers()
		q.Active()
		q.AppendSnapshot(nil)
	}
	reads()
	if at, changed := snap(v); changed || at != v {
		t.Fatalf("after reads only: version %d, changed %v", at, changed)
	}
	var w *worker
	var id uint64
	for _, step := range []struct {
		name string
		do   func()
	}{
		{"enqueue", func() { id = mustEnqueue(t, q, Message{Body: body(1)}) }},
		{"consumer", func() { w = addWorker(t, q, "w", 1) }},
		{"ack", func() { must(t, q.Ack(w.Consumer, id)) }},
		{"delayed", func() { mustEnqueue(t, q, Message{Body: body(2), DueAt: e.clk.Now().Add(time.Minute)}) }},
		{"due", func() { e.clk.Advance(time.Minute) }},
		{"remove consumer", func() { must(t, q.RemoveConsumer(w.Consumer)) }},
		{"purge", func() { q.Purge() }},
	} {
		if _, changed := snap(v); changed {
			t.Fatalf("before %s: changed", step.name)
		}
		step.do()
		at, changed := snap(v)
		if !changed || at == v {
			t.Fatalf("after %s: version %d (was %d), changed %v", step.name, at, v, changed)
		}
		v = at
		reads()
	}
}
