package queue

import (
	"sync"
	"time"
)

// Deduplication: a producer that resends after a lost confirm names
// each message with (producer, seq) ([Message.Producer]); the queue
// remembers the pairs it stored within [Config.DedupWindow], at most
// [Config.DedupMax] of them, and answers a resend with the first
// message's id instead of storing it again.
//
// The window is a map by pair plus a FIFO of the pairs in enqueue
// order: entries leave the front when older than the window or beyond
// the cap, at the next enqueue that carries a pair. A time-bounded map
// with a cap rather than a per-producer highest seq: a Conn's submits
// from several goroutines, and those resent after a reconnect, may
// reach the queue out of seq order, and a resend must get back the very
// id of the first, which a highest seq alone cannot give.
//
// The pair travels in the enqueue record (record.go, version 2), so
// that [Recover] rebuilds the window from the records, and a snapshot
// keeps the pairs of messages already settled (snapshot.go, version 3).

// Dedup defaults.
const (
	DefaultDedupWindow = 2 * time.Minute
	DefaultDedupMax    = 100_000
	// MaxProducerLen bounds [Message.Producer] (it fits a u8 in records).
	MaxProducerLen = 255
)

// dedupKey names a message for deduplication.
type dedupKey struct {
	producer string
	seq      uint64
}

// dedupEntry is one pair in the window. id and at are set once; the
// rest is guarded by dedupWindow.mu, as the journal's done callbacks
// update it without the queue's lock.
type dedupEntry struct {
	key dedupKey
	id  uint64
	at  int64 // enqueue time, unix ns

	pending bool          // its record is not durable yet
	failed  bool          // its record may be lost: a resend stores again
	waiters []func(error) // confirms of resends while pending
	final   *Event        // the message's last event, once settled
}

// dedupWindow is a queue's window. The map and FIFO are guarded by the
// queue's lock; the entries' pending state by mu (see dedupEntry).
type dedupWindow struct {
	window int64 // ns; 0: off
	max    int
	m      map[dedupKey]*dedupEntry
	fifo   []*dedupEntry // enqueue order; fifo[head:] live
	head   int

	mu sync.Mutex
}

// init sets the window's bounds from cfg.
func (w *dedupWindow) init(cfg Config) {
	w.window, w.max = int64(cfg.DedupWindow), cfg.DedupMax
	if cfg.DedupWindow == 0 {
		w.window = int64(DefaultDedupWindow)
	}
	if cfg.DedupWindow < 0 {
		w.window = 0
	}
	if w.max == 0 {
		w.max = DefaultDedupMax
	}
}

// on reports whether the queue deduplicates.
func (w *dedupWindow) on() bool { return w.window > 0 }

// len returns the number of pairs held.
func (w *dedupWindow) len() int { return len(w.m) }

// lookup returns the live entry of k, or nil. q.mu is held.
func (w *dedupWindow) lookup(k dedupKey, now int64) *dedupEntry {
	e := w.m[k]
	if e == nil || now-e.at > w.window {
		return nil
	}
	w.mu.Lock()
	failed := e.failed
	w.mu.Unlock()
	if failed {
		return nil
	}
	return e
}

// insert remembers e, and drops what fell out of the window by now.
// Entries go in in the order of their at. q.mu is held.
func (w *dedupWindow) insert(e *dedupEntry, now int64) {
	if w.m == nil {
		w.m = make(map[dedupKey]*dedupEntry)
	}
	w.m[e.key] = e
	w.fifo = append(w.fifo, e)
	w.trim(now)
}

// trim forgets the pairs older than the window, and the oldest beyond
// max. q.mu is held.
func (w *dedupWindow) trim(now int64) {
	for w.head < len(w.fifo) {
		e := w.fifo[w.head]
		if len(w.fifo)-w.head <= w.max && now-e.at <= w.window {
			break
		}
		if w.m[e.key] == e {
			delete(w.m, e.key)
		}
		w.fifo[w.head] = nil
		w.head++
	}
	if w.head == len(w.fifo) {
		w.fifo, w.head = w.fifo[:0], 0
		if len(w.m) == 0 {
			w.m = nil // an idle queue keeps nothing
		}
	} else if w.head > len(w.fifo)/2 && w.head > 64 {
		n := copy(w.fifo, w.fifo[w.head:])
		clear(w.fifo[n:])
		w.fifo, w.head = w.fifo[:n], 0
	}
}

// confirmed wraps confirm, the first enqueue's, so that the entry learns
// when its record is durable and resends waiting for it are confirmed
// with it.
func (w *dedupWindow) confirmed(e *dedupEntry, confirm func(error)) func(error) {
	return func(err error) {
		w.mu.Lock()
		e.pending = false
		e.failed = err != nil
		ws := e.waiters
		e.waiters = nil
		w.mu.Unlock()
		if confirm != nil {
			confirm(err)
		}
		for _, c := range ws {
			c(err)
		}
	}
}

// duplicate handles an enqueue of e's pair again: confirm waits for the
// first one's record if it is not durable yet, or is queued to run once
// q.mu is released; watch gets the message's events, or its last one if
// it was settled. q.mu is held.
func (q *Queue) duplicate(e *dedupEntry, confirm func(error), watch WatchFunc) {
	q.cold.deduplicated.Add(1)
	if confirm != nil {
		w := &q.dedup
		w.mu.Lock()
		if e.pending {
			e.waiters = append(e.waiters, confirm)
			confirm = nil
		}
		w.mu.Unlock()
		if confirm != nil {
			q.out = append(q.out, event{kind: evConfirm, confirm: confirm})
		}
	}
	if watch == nil {
		return
	}
	if q.index[e.id] != nil {
		q.watchers[e.id] = append(q.watchers[e.id], &watcher{watch})
		return
	}
	ev := Event{ID: e.id, Kind: EventFailed, Reason: ReasonSettledUnknown}
	if e.final != nil {
		ev = *e.final
	}
	q.out = append(q.out, event{kind: evWatch, watch: watch, ev: ev})
}

// settled records the last event of message m, for resends that watch.
// q.mu is held.
func (q *Queue) settled(id uint64, ev Event) {
	if m := q.index[id]; m != nil && m.dk != nil {
		ev.ID = id
		m.dk.final = &ev
		m.dk = nil
	}
}

// Duplicate reports whether an enqueue of (producer, seq) now would be
// answered from the window, storing nothing: the broker asks before it
// applies a bounded queue's overflow, so that a resend to a full queue
// is confirmed rather than refused (or made room for).
func (q *Queue) Duplicate(producer string, seq uint64) bool {
	if producer == "" {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dedup.on() && q.dedup.lookup(dedupKey{producer, seq}, q.now()) != nil
}
