package queue

import (
	"cmp"
	"fmt"
	"slices"
)

// Rebuilder rebuilds a queue from its journal's records after a restart:
// feed it every record of the queue in log order with [Rebuilder.Apply]
// (store.Log.Replay, dispatched by queue id), then call
// [Rebuilder.Build]. [Recover] does both for one queue's journal.
//
// Applying a record is idempotent, as a fuzzy checkpoint requires:
// an enqueue of a message already known, an attempt older than the one
// known, and a release of a record not live are ignored.
//
// A Rebuilder is not safe for concurrent use.
type Rebuilder struct {
	// LazyBodies leaves message bodies in the journal, which must then be
	// a [Reader]: they are read back when delivered, so that the restart
	// does not load the whole backlog into memory. Set it before Apply.
	LazyBodies bool

	// NextID, if above every id seen, is the id the rebuilt queue assigns
	// next. Ids must never be reused, and the records of acked messages
	// disappear with their segments: the caller keeps the queue's next id
	// in its checkpoint state ([Queue.NextID]) and sets it here.
	NextID uint64

	msgs         map[uint64]*recovered
	refs         map[Ref]uint64 // live records: enqueue and attempt records, to message ids
	maxID        uint64
	skipped      int
	fromSnapshot bool // LoadSnapshot was called: messages are paged

	replayedRecords int // applied after LoadSnapshot

	// The snapshot's runs, and the records replayed for messages in them.
	runs        []snapRun
	runReleased map[Ref]struct{}      // released refs of messages in runs
	runAttempts map[uint64]runAttempt // latest failed attempt of messages in runs
	attemptRefs map[Ref]uint64        // attempt records of runAttempts, to ids

	pairs map[dedupKey]recoveredPair // the dedup window: from records and the snapshot
}

// recoveredPair is a (producer, seq) pair being rebuilt.
type recoveredPair struct {
	id uint64
	at int64
}

// addPair records a dedup pair; the same pair seen twice keeps its
// first message (an enqueue record replayed after the snapshot that
// holds it).
func (r *Rebuilder) addPair(k dedupKey, id uint64, at int64) {
	if r.pairs == nil {
		r.pairs = make(map[dedupKey]recoveredPair)
	}
	if p, ok := r.pairs[k]; ok && p.id <= id {
		return
	}
	r.pairs[k] = recoveredPair{id: id, at: at}
}

// installPairs puts the pairs still within the window into q's, oldest
// first, at most its max; messages held get theirs. q.mu is held.
func (r *Rebuilder) installPairs(q *Queue, now int64) {
	w := &q.dedup
	if !w.on() || len(r.pairs) == 0 {
		return
	}
	es := make([]*dedupEntry, 0, len(r.pairs))
	for k, p := range r.pairs {
		if now-p.at <= w.window {
			es = append(es, &dedupEntry{key: k, id: p.id, at: p.at})
		}
	}
	slices.SortFunc(es, func(a, b *dedupEntry) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	if len(es) > w.max {
		es = es[len(es)-w.max:]
	}
	for _, e := range es {
		w.insert(e, now)
		if m := q.index[e.id]; m != nil {
			m.dk = e
		}
	}
	q.cold.dedupHeld.Store(int64(w.len()))
}

// recovered is a message being rebuilt.
type recovered struct {
	m    *message
	join int64 // when it joined the queue: enqueued, or its original due time
	tail bool  // goes after the level's runs: not at its head when the snapshot was taken
	// replayed: from an enqueue record replayed after the snapshot. A
	// fuzzy checkpoint may also hold it in a run.
	replayed bool
}

// NewRebuilder returns an empty Rebuilder.
func NewRebuilder() *Rebuilder {
	return &Rebuilder{msgs: make(map[uint64]*recovered), refs: make(map[Ref]uint64), attemptRefs: make(map[Ref]uint64)}
}

// Apply applies one record. A record that does not decode is skipped and
// reported in the error (wrapping nothing from the journal: the caller
// may log it and go on); the Rebuilder stays usable.
func (r *Rebuilder) Apply(e Entry) error {
	r.replayedRecords++
	switch e.Kind {
	case KindEnqueue:
		rec, err := decodeEnqueue(e.Payload)
		if err != nil {
			r.skipped++
			return fmt.Errorf("replay %v: %w", e.Ref, err)
		}
		r.maxID = max(r.maxID, rec.id)
		if rec.producer != "" {
			r.addPair(dedupKey{rec.producer, rec.seq}, rec.id, rec.enqueued)
		}
		if r.msgs[rec.id] != nil {
			return nil
		}
		m := &message{
			id: rec.id, size: len(rec.body), headers: rec.headers, key: rec.key, prio: rec.prio,
			enqueued: rec.enqueued, due: rec.due, expires: rec.expires, ref: e.Ref, hidx: -1,
		}
		if r.LazyBodies {
			m.paged, m.headers = true, nil
		} else {
			m.body = slices.Clone(rec.body)
		}
		r.msgs[rec.id] = &recovered{m: m, join: max(rec.enqueued, rec.due), tail: true, replayed: true}
		r.refs[e.Ref] = rec.id
	case KindAttempt:
		rec, err := decodeAttempt(e.Payload)
		if err != nil {
			r.skipped++
			return fmt.Errorf("replay %v: %w", e.Ref, err)
		}
		x := r.msgs[rec.id]
		if x == nil && len(r.runs) > 0 {
			// Perhaps a message of a run, read back after the checkpoint.
			if a, ok := r.runAttempts[rec.id]; !ok || rec.attempts >= a.attempts {
				if r.runAttempts == nil {
					r.runAttempts = make(map[uint64]runAttempt)
				}
				r.runAttempts[rec.id] = runAttempt{attempts: rec.attempts, due: rec.due, aref: e.Ref}
				r.attemptRefs[e.Ref] = rec.id
			}
			return nil
		}
		if x == nil || rec.attempts < x.m.attempts {
			return nil // released already, or an older attempt
		}
		x.m.attempts, x.m.due, x.m.aref = rec.attempts, rec.due, e.Ref
		r.refs[e.Ref] = rec.id
	case KindRelease:
		for _, ref := range e.Released {
			id, ok := r.refs[ref]
			if !ok {
				r.releaseSpilled(ref)
				continue
			}
			delete(r.refs, ref)
			x := r.msgs[id]
			switch {
			case x == nil:
			case x.m.ref == ref:
				if x.replayed && id <= r.maxRunID() {
					// A fuzzy checkpoint may hold it in a run too.
					r.releaseSpilled(ref)
				}
				delete(r.msgs, id)
				if !x.m.aref.IsZero() {
					delete(r.refs, x.m.aref)
				}
			case x.m.aref == ref:
				x.m.aref = Ref{}
			}
		}
	default:
		r.skipped++
		return fmt.Errorf("replay %v: %w: kind %v", e.Ref, errBadRecord, e.Kind)
	}
	return nil
}

// releaseSpilled applies the release of ref, which no message in RAM
// holds: if a snapshot named runs, it may be a record of a message in
// one, read back, settled and released after the checkpoint.
func (r *Rebuilder) releaseSpilled(ref Ref) {
	if len(r.runs) == 0 {
		return
	}
	if id, ok := r.attemptRefs[ref]; ok {
		delete(r.attemptRefs, ref)
		if a, ok := r.runAttempts[id]; ok && a.aref == ref {
			delete(r.runAttempts, id) // settled: its enqueue record is released with it
		}
		return
	}
	if r.runReleased == nil {
		r.runReleased = make(map[Ref]struct{})
	}
	r.runReleased[ref] = struct{}{}
}

// maxRunID is the highest message id in the snapshot's runs.
func (r *Rebuilder) maxRunID() uint64 {
	var n uint64
	for _, sr := range r.runs {
		n = max(n, sr.maxID)
	}
	return n
}

// dedupe removes from the messages replayed those that the snapshot's
// runs hold too: a fuzzy checkpoint's runs may hold messages enqueued
// after its position. The run's entry is where the message stands; a
// failed attempt replayed for it waits for the entry to be read back.
// Only runs that may hold such messages are read: those of the window
// between the checkpoint's position and its snapshot.
func (r *Rebuilder) dedupe(sp Spiller) error {
	top := r.maxRunID()
	lo := ^uint64(0)
	for id, x := range r.msgs {
		if x.replayed && id <= top {
			lo = min(lo, id)
		}
	}
	if lo > top {
		return nil
	}
	for _, sr := range r.runs {
		if sr.maxID < lo || sr.left() == 0 {
			continue
		}
		if prio, _, err := readRunHeader(sp, sr.num); err != nil || prio != sr.prio {
			// Not the run the snapshot names: the queue drops it when it
			// reads it (checkRun), and the replayed messages stay.
			continue
		}
		buf := make([]byte, sr.left()*runEntrySize)
		n, err := sp.ReadRun(sr.num, runHeaderSize+int64(sr.next)*runEntrySize, buf)
		if err != nil {
			return fmt.Errorf("read run %d: %w", sr.num, err)
		}
		var e message
		for i := 0; i+runEntrySize <= n; i += runEntrySize {
			if !decodeRunEntry(buf[i:i+runEntrySize], &e) {
				continue
			}
			x := r.msgs[e.id]
			if x == nil || !x.replayed || x.m.ref != e.ref {
				continue
			}
			delete(r.msgs, e.id)
			delete(r.refs, e.ref)
			if m := x.m; m.attempts > 0 {
				if r.runAttempts == nil {
					r.runAttempts = make(map[uint64]runAttempt)
				}
				r.runAttempts[m.id] = runAttempt{attempts: m.attempts, due: m.due, aref: m.aref}
				r.attemptRefs[m.aref] = m.id
			}
		}
	}
	return nil
}

// Len returns the number of messages rebuilt so far.
func (r *Rebuilder) Len() int { return len(r.msgs) }

// Skipped returns the number of records that did not decode.
func (r *Rebuilder) Skipped() int { return r.skipped }

// Build returns the rebuilt queue, as [New] would with name and cfg
// (cfg.Journal is the journal the records came from). Messages keep
// their ids, attempts, due times and expiries; the order of each
// priority level and of each key is the order in which messages joined
// the queue (retried ones: the order in which they came back). Messages that were in flight are ready again, and not
// marked redelivered unless they had failed before: deliveries are not
// journaled. Messages that expired while the node was down are
// dead-lettered by the first tick.
func (r *Rebuilder) Build(name string, cfg Config) (*Queue, error) {
	q, err := New(name, cfg)
	if err != nil {
		return nil, err
	}
	if (r.LazyBodies || r.fromSnapshot) && q.reader == nil {
		return nil, fmt.Errorf("rebuild %q: %w: paged messages need a Journal that is a Reader", name, ErrBadConfig)
	}
	q.index = make(map[uint64]*message, len(r.msgs)) // sized once, not grown a million times
	if len(r.runs) > 0 && q.spiller == nil {
		return nil, fmt.Errorf("rebuild %q: %w: the snapshot names runs and the Journal is not a Spiller", name, ErrBadConfig)
	}
	if len(r.runs) > 0 {
		if err := r.dedupe(q.spiller); err != nil {
			return nil, fmt.Errorf("rebuild %q: %w", name, err)
		}
	}
	all := make([]*recovered, 0, len(r.msgs))
	for _, x := range r.msgs {
		all = append(all, x)
	}
	slices.SortFunc(all, func(a, b *recovered) int {
		if c := cmp.Compare(a.join, b.join); c != 0 {
			return c
		}
		return cmp.Compare(a.m.id, b.m.id)
	})
	q.lock()
	now := q.now()
	q.nextID = max(r.maxID+1, r.NextID)
	// The heads of the levels that have runs: the messages that were
	// before the runs, in order; then the runs; then the rest.
	hasRuns := [numPriorities]bool{}
	for _, sr := range r.runs {
		hasRuns[sr.prio] = true
	}
	head := func(x *recovered) bool {
		m := x.m
		return hasRuns[m.prio] && !x.tail && m.attempts == 0 && m.key == "" && m.due <= now
	}
	for _, x := range all {
		if m := x.m; head(x) {
			q.index[m.id] = m
			q.cold.bytes.Add(int64(m.size))
			q.charge(m, 1)
			q.stats.ready.Add(1)
			q.makeReady(m, false)
		}
	}
	q.installRuns(r.runs)
	q.runReleased, q.runAttempts = r.runReleased, r.runAttempts
	q.settling = make([]*message, 0)
	q.settleRuns(r.replayedRecords + int(refillBatch))
	retried := q.settling // plain messages ready after a failure: in the order they came back
	q.settling = nil
	for _, x := range all {
		m := x.m
		if head(x) {
			continue
		}
		q.charge(m, 1)
		if m.attempts > 0 && m.due <= now && m.key == "" {
			q.index[m.id] = m
			q.cold.bytes.Add(int64(m.size))
			retried = append(retried, m)
			continue
		}
		q.index[m.id] = m
		q.cold.bytes.Add(int64(m.size))
		switch {
		case m.attempts > 0 && m.due > now && (m.key == "" || q.keys[m.key] == nil || q.keys[m.key].busy == nil):
			m.st = stBackoff
			m.at = m.due
			if m.expires != 0 && m.expires < m.at {
				m.at = m.expires
			}
			q.timers.push(m)
			q.stats.delayed.Add(1)
			if m.key != "" {
				k := q.keys[m.key]
				if k == nil {
					k = q.newKey(m.key)
				}
				k.busy, m.ks = m, k
			}
		case m.due > now:
			m.st = stDelayed
			m.at = m.due
			q.timers.push(m)
			q.stats.delayed.Add(1)
		default:
			q.stats.ready.Add(1)
			q.makeReady(m, false)
		}
	}
	slices.SortFunc(retried, func(a, b *message) int {
		if c := cmp.Compare(a.due, b.due); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	for _, m := range retried {
		q.stats.ready.Add(1)
		q.makeReady(m, true)
	}
	r.installPairs(q, now)
	r.msgs = nil
	r.refs = nil
	r.runs, r.runReleased, r.runAttempts, r.pairs = nil, nil, nil, nil
	// The messages replayed may be many (what a fast publisher wrote
	// since the checkpoint): page them out now, not one run an operation.
	for q.report(); q.balance(now); q.report() {
	}
	q.finish(now)
	return q, nil
}

// settleRuns reads back the heads of the runs while replayed records
// wait for messages in them (read back, then settled or failed, after
// the checkpoint, before the restart): those messages were at the front
// of their runs, so that the queue finds them where they were, and the
// records that wait do not outlive the restart. It reads budget entries
// at most a level. q.mu is held.
func (q *Queue) settleRuns(budget int) {
	now := q.now()
	for p := range q.ready {
		lv := &q.ready[p]
		for read := 0; read < budget && len(lv.runs) > 0 && len(q.runAttempts)+len(q.runReleased) > 0; read += int(refillBatch) {
			q.refill(p, now)
		}
	}
}

// installRuns puts the runs of a snapshot in the middle of their levels,
// and drops the journal's other runs of the queue: written after the
// checkpoint, or consumed before it, nothing names them. q.mu is held.
func (q *Queue) installRuns(runs []snapRun) {
	named := map[uint32]bool{}
	for _, sr := range runs {
		r := sr.run
		named[r.num] = true
		lv := &q.ready[sr.prio]
		lv.runs = append(lv.runs, &r)
		lv.spilled += r.left()
		q.nSpilled += r.left()
		q.stats.ready.Add(r.left())
		q.cold.bytes.Add(r.bytes)
		q.readyMask |= 1 << sr.prio
	}
	if q.spiller == nil {
		return
	}
	for _, num := range q.spiller.Runs() {
		if !named[num] {
			q.spiller.DropRun(num)
		}
	}
}

// Recover rebuilds a queue from a journal's records, bodies in memory:
// replay calls its argument with each record in log order, as
// [MemJournal.Replay] does. Records that do not decode are skipped and
// logged. Use a [Rebuilder] to leave bodies on disk, or to feed records
// dispatched from a log shared by many queues.
func Recover(name string, cfg Config, replay func(func(Entry) error) error) (*Queue, error) {
	r := NewRebuilder()
	log := cfg.Logger
	if log == nil {
		log = discardLogger
	}
	err := replay(func(e Entry) error {
		if err := r.Apply(e); err != nil {
			log.Warn("queue: skipped a journal record", "queue", name, "err", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("recover %q: %w", name, err)
	}
	return r.Build(name, cfg)
}
