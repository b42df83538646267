package queue

import (
	"fmt"
	"slices"
	"sync"
)

// MemJournal is an in-memory [Journal] and [Reader] for tests: it keeps
// every record in order, as a log would, and replays them. By default a
// record is durable as soon as it is appended (done is called before
// Append returns); with Manual set, done callbacks wait for [MemJournal.Sync],
// and [MemJournal.Crash] keeps only what was synced, so that tests can
// check what a publisher was told against what survives.
//
// It is safe for concurrent use.
type MemJournal struct {
	// Manual holds done callbacks until Sync. Set it before use.
	Manual bool

	mu      sync.Mutex    // guards the fields below
	recs    []MemRecord   // every record, in order
	live    map[Ref]int   // live records: index in recs
	synced  int           // recs[:synced] are durable
	pending []func(error) // done callbacks waiting for Sync
	next    uint32        // offset of the next record
	fail    error         // returned by the next Append/Release
	stats   MemJournalStats
	runs    map[uint32][]byte // every run written; dropped ones are kept, as a store keeps them until a checkpoint
	dropped map[uint32]bool
	nextRun uint32
}

// MemRecord is one record of a [MemJournal].
type MemRecord struct {
	Ref      Ref
	Kind     Kind
	Payload  []byte
	Released []Ref
}

// MemJournalStats counts a MemJournal's calls.
type MemJournalStats struct {
	Appends, Releases     int          // calls
	Released, BadReleases int          // records released; released but not live
	ByKind                map[Kind]int // appends by kind
}

var (
	_ Journal = (*MemJournal)(nil)
	_ Reader  = (*MemJournal)(nil)
	_ Spiller = (*MemJournal)(nil)
)

// NewMemJournal returns an empty journal.
func NewMemJournal() *MemJournal {
	return &MemJournal{live: make(map[Ref]int), next: 16, stats: MemJournalStats{ByKind: map[Kind]int{}},
		runs: map[uint32][]byte{}, dropped: map[uint32]bool{}, nextRun: 1}
}

// Append implements [Journal]. The payload is copied.
func (j *MemJournal) Append(kind Kind, payload []byte, done func(error)) (Ref, error) {
	j.mu.Lock()
	if err := j.fail; err != nil {
		j.fail = nil
		j.mu.Unlock()
		return Ref{}, err
	}
	ref := j.add(MemRecord{Kind: kind, Payload: slices.Clone(payload)})
	j.live[ref] = len(j.recs) - 1
	j.stats.Appends++
	j.stats.ByKind[kind]++
	call := j.confirm(done)
	j.mu.Unlock()
	if call {
		done(nil)
	}
	return ref, nil
}

// Release implements [Journal]. Releasing a record that is not live (a
// bug in the caller) is counted in [MemJournalStats].BadReleases.
func (j *MemJournal) Release(refs []Ref, done func(error)) error {
	j.mu.Lock()
	if err := j.fail; err != nil {
		j.fail = nil
		j.mu.Unlock()
		return err
	}
	j.add(MemRecord{Kind: KindRelease, Released: slices.Clone(refs)})
	for _, r := range refs {
		if _, ok := j.live[r]; !ok {
			j.stats.BadReleases++
			continue
		}
		delete(j.live, r)
		j.stats.Released++
	}
	j.stats.Releases++
	call := j.confirm(done)
	j.mu.Unlock()
	if call {
		done(nil)
	}
	return nil
}

// add appends rec and returns its ref. j.mu is held.
func (j *MemJournal) add(rec MemRecord) Ref {
	n := uint32(len(rec.Payload) + 12*len(rec.Released))
	rec.Ref = Ref{Seg: 1, Off: j.next, Len: n}
	j.next += 16 + n
	j.recs = append(j.recs, rec)
	if !j.Manual {
		j.synced = len(j.recs)
	}
	return rec.Ref
}

// confirm reports whether done should be called now, or keeps it for
// Sync. j.mu is held.
func (j *MemJournal) confirm(done func(error)) bool {
	if done == nil {
		return false
	}
	if j.Manual {
		j.pending = append(j.pending, done)
		return false
	}
	return true
}

// Sync makes every record durable and calls the waiting done callbacks,
// in order.
func (j *MemJournal) Sync() {
	j.mu.Lock()
	j.synced = len(j.recs)
	p := j.pending
	j.pending = nil
	j.mu.Unlock()
	for _, done := range p {
		done(nil)
	}
}

// Crash returns a new journal holding only the records made durable by
// Sync, as a log would be found after kill -9. Waiting done callbacks
// are dropped.
func (j *MemJournal) Crash() *MemJournal {
	j.mu.Lock()
	defer j.mu.Unlock()
	c := NewMemJournal()
	c.next = j.next
	c.nextRun = j.nextRun
	for n, r := range j.runs {
		c.runs[n] = r
		c.dropped[n] = j.dropped[n]
	}
	for _, rec := range j.recs[:j.synced] {
		c.recs = append(c.recs, rec)
		if rec.Kind == KindRelease {
			for _, r := range rec.Released {
				delete(c.live, r)
			}
		} else {
			c.live[rec.Ref] = len(c.recs) - 1
		}
	}
	c.synced = len(c.recs)
	return c
}

// FailNext makes the next Append or Release fail with err.
func (j *MemJournal) FailNext(err error) {
	j.mu.Lock()
	j.fail = err
	j.mu.Unlock()
}

// Replay calls fn with every durable record in order, release records
// included, as store.Log.Replay does for a queue.
func (j *MemJournal) Replay(fn func(Entry) error) error {
	j.mu.Lock()
	recs := slices.Clone(j.recs[:j.synced])
	j.mu.Unlock()
	for _, r := range recs {
		if err := fn(Entry(r)); err != nil {
			return err
		}
	}
	return nil
}

// Read implements [Reader].
func (j *MemJournal) Read(ref Ref) ([]byte, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	i, ok := j.live[ref]
	if !ok {
		return nil, fmt.Errorf("read %v: not a live record", ref)
	}
	return j.recs[i].Payload, nil
}

// Live returns the number of records appended and not released.
func (j *MemJournal) Live() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.live)
}

// Records returns a copy of every record, in order.
func (j *MemJournal) Records() []MemRecord {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.recs)
}

// Stats returns the journal's counters.
func (j *MemJournal) Stats() MemJournalStats {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.stats
	s.ByKind = make(map[Kind]int, len(j.stats.ByKind))
	for k, v := range j.stats.ByKind {
		s.ByKind[k] = v
	}
	return s
}

// WriteRun implements [Spiller]. The data is copied.
func (j *MemJournal) WriteRun(data []byte) (uint32, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.fail; err != nil {
		j.fail = nil
		return 0, err
	}
	n := j.nextRun
	j.nextRun++
	j.runs[n] = slices.Clone(data)
	return n, nil
}

// ReadRun implements [Spiller]; dropped runs can still be read (a store
// deletes them only after a checkpoint).
func (j *MemJournal) ReadRun(num uint32, off int64, buf []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	r, ok := j.runs[num]
	if !ok {
		return 0, fmt.Errorf("read run %d: no such run", num)
	}
	if off > int64(len(r)) {
		return 0, nil
	}
	return copy(buf, r[off:]), nil
}

// DropRun implements [Spiller].
func (j *MemJournal) DropRun(num uint32) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.runs[num]; ok {
		j.dropped[num] = true
	}
}

// Runs implements [Spiller]: the runs not dropped.
func (j *MemJournal) Runs() []uint32 {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []uint32
	for n := range j.runs {
		if !j.dropped[n] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}
