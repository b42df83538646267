package queue

import (
	"context"
	"fmt"
	"log/slog"
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Queue is one task queue: see the package doc for its semantics and
// threading rules. Create it with [New] (or [Rebuilder.Build] after a
// restart); every method is safe for concurrent use.
type Queue struct {
	name    string
	cfg     Config
	sched   *Scheduler
	clock   Clock
	journal Journal     // nil: transient
	reader  Reader      // journal's, if it reads back
	spiller Spiller     // journal's, if it keeps runs (and reads back)
	admit   Admitter    // journal's flow control, if any
	disk    DiskAlarmer // journal's disk alarm, if any
	mem     *Memory     // the node's budget, or nil
	log     *slog.Logger
	stats   *Counters    // atomics, in a slab: read without mu
	cold    coldCounters // atomics: read without mu

	wake int64 // guarded by sched.mu: when the scheduler calls tick
	sidx int   // guarded by sched.mu: index in sched.heap, -1 if absent

	mu        sync.Mutex // guards everything below
	gen       uint64     // bumped by lock: see [Queue.AppendSnapshotSince]
	closed    bool
	nextID    uint64
	index     map[uint64]*message // every message held, by id
	ready     [numPriorities]level
	readyMask uint16 // bit p: ready[p] is not empty
	timers    timerHeap
	armedAt   int64 // the earliest wake asked of sched and not yet run; 0: none
	keys      map[string]*keyState
	orphans   *keyQueue             // schedulable keys while no consumer can take them; nil until the first
	consumers []*Consumer           // in attach order
	byID      map[string]*Consumer  // consumers by id
	active    *Consumer             // single-active mode: the one that receives
	hungry    consumerList          // eligible consumers with credit, in round-robin order
	ring      *ring                 // eligible consumers, for keys; nil when none
	dirty     []*Consumer           // consumers to serve before the lock is released
	watchers  map[uint64][]*watcher // by message id
	out       []event               // callbacks to run once mu is released
	spare     []event               // out's other buffer
	flushing  bool                  // a goroutine is running out's callbacks
	free      []*message            // recycled messages
	freeKeys  []*keyState           // recycled key states
	enc       []byte                // record encoding buffer
	relBuf    []Ref
	rand      func() float64 // jitter source
	dedup     dedupWindow    // (producer, seq) pairs: dedup.go

	// Memory accounting and paging (memory.go, spill.go).
	resident    int64                 // bytes in RAM, as accounted
	nPaged      int64                 // messages in RAM with their body paged out
	kept        int64                 // body and header bytes of durable messages in RAM
	reported    [3]int64              // resident, nPaged and spilled as last added to mem
	runReleased map[Ref]struct{}      // after a restart: records released while their message was in a run
	runAttempts map[uint64]runAttempt // after a restart: failed attempts of messages still in runs
	runBuf      []byte                // run encoding and reading buffer
	spillHold   int64                 // no spill before this time (unix ns), after a failed one
	nSpilled    int64                 // messages in runs, all levels
	settling    []*message            // during Build: retried messages read back from runs
}

// watcher is one [Queue.Watch] registration.
type watcher struct{ fn WatchFunc }

// maxFree bounds the recycled messages a queue keeps.
const maxFree = 256

// New returns an empty queue. name is reported to dead-letter sinks and
// in logs.
func New(name string, cfg Config) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new queue %q: %w", name, err)
	}
	q := &Queue{
		name:     name,
		stats:    newCounters(),
		cfg:      cfg,
		sched:    cfg.Scheduler,
		journal:  cfg.Journal,
		log:      cfg.Logger,
		sidx:     -1,
		gen:      1,
		nextID:   1,
		index:    make(map[uint64]*message),
		keys:     make(map[string]*keyState),
		byID:     make(map[string]*Consumer),
		watchers: make(map[uint64][]*watcher),
		rand:     rand.Float64,
	}
	q.dedup.init(cfg)
	if q.sched == nil {
		q.sched = defaultScheduler()
	}
	q.clock = q.sched.clock
	if q.log == nil {
		q.log = discardLogger
	}
	if r, ok := q.journal.(Reader); ok {
		q.reader = r
		if sp, ok := q.journal.(Spiller); ok {
			q.spiller = sp
		}
	}
	if a, ok := q.journal.(Admitter); ok {
		q.admit = a
	}
	if d, ok := q.journal.(DiskAlarmer); ok {
		q.disk = d
	}
	if q.mem = cfg.Memory; q.mem != nil {
		q.mem.queues.Add(1)
	}
	return q, nil
}

// NextID returns the id the next message will get; ids are never
// reused. A checkpoint keeps it for [Rebuilder.NextID].
func (q *Queue) NextID() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.nextID
}

// Name returns the queue's name.
func (q *Queue) Name() string { return q.name }

// Close stops the queue: its timers stop, and every later call fails with
// [ErrClosed]. Messages are kept in the journal, not released: Close is
// for shutdown, not deletion. Watchers get [EventLost].
func (q *Queue) Close() error {
	q.lock()
	defer q.unlock()
	if q.closed {
		return ErrClosed
	}
	q.closed = true
	// Watchers learn that their message's outcome will not be known
	// here; the message itself stays as it is (not settled).
	for id, ws := range q.watchers {
		for _, w := range ws {
			q.out = append(q.out, event{kind: evWatch, watch: w.fn, ev: Event{ID: id, Kind: EventLost}})
		}
	}
	clear(q.watchers)
	q.sched.unschedule(q)
	if q.mem != nil {
		q.mem.add(-q.reported[0], -q.reported[1], -q.reported[2])
		q.reported = [3]int64{}
		q.mem.queues.Add(-1)
	}
	for _, c := range q.consumers {
		c.gone.Store(true)
	}
	return nil
}

func (q *Queue) now() int64 { return q.clock.Now().UnixNano() }

// Enqueue adds a message and returns its id, assigned by the queue in
// increasing order. confirm, if not nil, is called once the message is
// durable (at once for a transient queue), or with the journal's error;
// it must not block nor call the queue (see [Journal]). watch, if not
// nil, receives the message's events, as with [Queue.Watch].
//
// If Enqueue returns an error the message was not added and confirm is
// not called.
func (q *Queue) Enqueue(msg Message, confirm func(error), watch WatchFunc) (uint64, error) {
	if msg.Priority > MaxPriority {
		return 0, fmt.Errorf("enqueue: %w: priority %d above %d", ErrBadMessage, msg.Priority, MaxPriority)
	}
	if msg.TTL < 0 {
		return 0, fmt.Errorf("enqueue: %w: negative TTL %v", ErrBadMessage, msg.TTL)
	}
	if len(msg.Headers) > 0 || len(msg.Key) > maxKeyLen {
		if err := checkHeaders(msg.Key, msg.Headers); err != nil {
			return 0, fmt.Errorf("enqueue: %w", err)
		}
	}
	if len(msg.Producer) > MaxProducerLen || msg.Producer != "" && msg.Seq == 0 {
		return 0, fmt.Errorf("enqueue: %w: producer of %d bytes, seq %d", ErrBadMessage, len(msg.Producer), msg.Seq)
	}
	if q.admit != nil {
		if err := q.admit.Admit(context.Background()); err != nil {
			return 0, fmt.Errorf("enqueue: %w", err)
		}
	}
	q.lock()
	if q.closed {
		q.mu.Unlock()
		return 0, ErrClosed
	}
	now := q.now()
	var dk *dedupEntry
	if msg.Producer != "" && q.dedup.on() {
		k := dedupKey{msg.Producer, msg.Seq}
		if e := q.dedup.lookup(k, now); e != nil {
			q.duplicate(e, confirm, watch)
			id := e.id
			q.finish(now)
			return id, nil
		}
		dk = &dedupEntry{key: k, id: q.nextID, at: now, pending: q.journal != nil}
		if q.journal != nil {
			confirm = q.dedup.confirmed(dk, confirm)
		}
	}
	m := q.alloc()
	m.id = q.nextID
	m.body, m.size, m.headers, m.key, m.prio = msg.Body, len(msg.Body), msg.Headers, msg.Key, msg.Priority
	m.hsize = headersSize(msg.Headers)
	m.enqueued = now
	start := now
	if !msg.DueAt.IsZero() {
		if due := msg.DueAt.UnixNano(); due > now {
			m.due, start = due, due
		}
	}
	ttl := q.cfg.TTL
	if msg.TTL > 0 && (ttl == 0 || msg.TTL < ttl) {
		ttl = msg.TTL
	}
	if ttl > 0 {
		m.expires = start + int64(ttl)
	}
	m.dk = dk // appendEnqueue records its pair
	if q.journal != nil {
		q.enc = appendEnqueue(q.enc[:0], m)
		ref, err := q.journal.Append(KindEnqueue, q.enc, confirm)
		if err != nil {
			q.recycle(m)
			q.mu.Unlock()
			return 0, fmt.Errorf("enqueue: %w", err)
		}
		m.ref = ref
	} else if confirm != nil {
		q.out = append(q.out, event{kind: evConfirm, confirm: confirm})
	}
	q.nextID++
	q.index[m.id] = m
	if dk != nil {
		q.dedup.insert(dk, now)
		q.cold.dedupHeld.Store(int64(q.dedup.len()))
	}
	q.charge(m, 1)
	q.stats.published.Add(1)
	q.cold.bytes.Add(int64(m.size))
	if watch != nil {
		q.watchers[m.id] = append(q.watchers[m.id], &watcher{watch})
	}
	if m.due != 0 {
		m.st = stDelayed
		m.at = m.due
		q.timers.push(m)
		q.stats.delayed.Add(1)
	} else {
		q.stats.ready.Add(1)
		q.makeReady(m, false)
	}
	q.pageOnEnqueue(m)
	id := m.id
	q.finish(now)
	return id, nil
}

// Admit waits until the queue's journal has room for a message (its
// flow control: [Admitter]), or ctx ends, without taking the queue's
// lock. [Queue.Enqueue] admits by itself, without a deadline; the broker
// calls Admit first with the publisher's context, so that a publisher
// that gives up does not wait. A transient queue admits at once.
func (q *Queue) Admit(ctx context.Context) error {
	if q.admit == nil {
		return ctx.Err()
	}
	return q.admit.Admit(ctx)
}

// Ack settles a message that c has in flight: it leaves the queue, its
// records are released, and its watchers get [EventCompleted].
func (q *Queue) Ack(c *Consumer, id uint64) error {
	q.lock()
	m, err := q.inflight(c, id, "ack")
	if err != nil {
		q.mu.Unlock()
		return err
	}
	now := q.now()
	q.takeBack(m)
	q.stats.unacked.Add(-1)
	q.stats.acked.Add(1)
	q.notify(m.id, Event{Kind: EventCompleted, Consumer: c.id}, true)
	err = q.releaseAcked(m, !c.pull)
	q.finish(now)
	if err != nil {
		return fmt.Errorf("ack %d: %w: %w", id, ErrJournal, err)
	}
	return nil
}

// Nack settles a message that c has in flight as failed. With requeue,
// it is delivered again (marked redelivered, attempts + 1) after the
// backoff, or dead-lettered with [ReasonMaxAttempts] once it has failed
// [Config.MaxAttempts] times; without, it is dead-lettered with
// [ReasonRejected].
func (q *Queue) Nack(c *Consumer, id uint64, requeue bool) error {
	q.lock()
	m, err := q.inflight(c, id, "nack")
	if err != nil {
		q.mu.Unlock()
		return err
	}
	now := q.now()
	q.takeBack(m)
	q.stats.unacked.Add(-1)
	if requeue {
		err = q.retry(m, now)
	} else {
		q.deadLetter(m, ReasonRejected)
	}
	q.finish(now)
	if err != nil {
		return fmt.Errorf("nack %d: %w: %w", id, ErrJournal, err)
	}
	return nil
}

// Progress tells the watchers of a message that c has in flight how far
// it got: percent from 0 to 100 (clamped), and a short text.
func (q *Queue) Progress(c *Consumer, id uint64, percent int, text string) error {
	q.lock()
	if _, err := q.inflight(c, id, "progress"); err != nil {
		q.mu.Unlock()
		return err
	}
	q.notify(id, Event{Kind: EventProgress, Percent: min(max(percent, 0), 100), Text: text, Consumer: c.id}, false)
	q.finish(0)
	return nil
}

// Watch registers fn for the events of message id (progress, retries,
// completion or failure) until the last one, or until cancel is called.
// It fails with [ErrNotFound] if the queue does not hold the message.
func (q *Queue) Watch(id uint64, fn WatchFunc) (cancel func(), err error) {
	q.lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, ErrClosed
	}
	if q.index[id] == nil {
		if q.maybeSpilled(id) {
			return nil, fmt.Errorf("watch %d: %w: %w", id, ErrNotFound, ErrPagedOut)
		}
		return nil, fmt.Errorf("watch %d: %w", id, ErrNotFound)
	}
	w := &watcher{fn}
	q.watchers[id] = append(q.watchers[id], w)
	return func() {
		q.lock()
		defer q.mu.Unlock()
		ws := q.watchers[id]
		for i, x := range ws {
			if x == w {
				ws = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(q.watchers, id)
		} else {
			q.watchers[id] = ws
		}
	}, nil
}

// inflight returns the message id that c has in flight. q.mu is held.
func (q *Queue) inflight(c *Consumer, id uint64, op string) (*message, error) {
	if q.closed {
		return nil, ErrClosed
	}
	if c == nil || c.q != q || c.removed {
		return nil, fmt.Errorf("%s %d: %w", op, id, ErrUnknownConsumer)
	}
	m := q.index[id]
	if m == nil || m.st != stInflight || m.owner != c {
		return nil, fmt.Errorf("%s %d: %w", op, id, ErrNotInFlight)
	}
	return m, nil
}

// takeBack takes m, in flight, from its consumer, whose credit grows. Its
// key, if any, stays blocked by m until the caller decides. q.mu is held.
func (q *Queue) takeBack(m *message) {
	c := m.owner
	c.unacked.remove(m)
	m.owner = nil
	q.updateHungry(c)
	q.kick(c)
}

// makeReady puts m, just due (or retried, with retry set), where it can
// be delivered: its key's waiting list, or the shared ready list. The
// caller has counted it ready. q.mu is held.
func (q *Queue) makeReady(m *message, retry bool) {
	m.st = stReady
	if m.expires != 0 && m.hidx < 0 {
		m.at = m.expires
		q.timers.push(m)
	}
	if m.key != "" {
		if retry && m.ks != nil && m.ks.busy == m {
			m.ks.busy = nil
		}
		q.joinKey(m, retry)
		return
	}
	lv := &q.ready[m.prio]
	switch {
	case retry:
		lv.retry.pushBack(m)
	case len(lv.runs) > 0:
		lv.tail.pushBack(m) // after the spilled middle
	default:
		lv.main.pushBack(m)
	}
	q.readyMask |= 1 << m.prio
}

// unready takes m, ready, out of the ready structures for an expiry.
// q.mu is held.
func (q *Queue) unready(m *message) {
	if k := m.ks; k != nil {
		k.waiting.remove(m)
		m.ks = nil
		if k.busy == nil {
			q.routeKey(k) // its head changed, or it is empty
		}
		return
	}
	q.unlist(m)
}

// unlist takes m off the shared ready list. q.mu is held.
func (q *Queue) unlist(m *message) {
	m.list.remove(m)
	if q.ready[m.prio].empty() {
		q.readyMask &^= 1 << m.prio
	}
}

// retry handles a failed attempt of m, which is in no structure: it is
// dead-lettered if it has failed too often or expired, else it backs off
// (blocking its key) and comes back. It returns the journal's error, if
// any. q.mu is held.
func (q *Queue) retry(m *message, now int64) error {
	m.attempts++
	if q.cfg.MaxAttempts > 0 && m.attempts >= uint32(q.cfg.MaxAttempts) {
		q.deadLetter(m, ReasonMaxAttempts)
		return nil
	}
	if m.expires != 0 && m.expires <= now {
		q.deadLetter(m, ReasonExpired)
		return nil
	}
	delay := int64(q.cfg.backoff(m.attempts, q.rand()))
	m.due = now + delay // when it is ready again; the order of the retry lists
	var err error
	if q.journal != nil {
		q.enc = appendAttempt(q.enc[:0], m.id, m.attempts, m.due)
		var ref Ref
		if ref, err = q.journal.Append(KindAttempt, q.enc, nil); err == nil {
			old := m.aref
			m.aref = ref
			if !old.IsZero() {
				q.relBuf = append(q.relBuf[:0], old)
				err = q.journal.Release(q.relBuf, nil)
			}
		}
		if err != nil {
			q.log.Error("queue: journal failed on a retry", "queue", q.name, "id", m.id, "err", err)
		}
	}
	q.notify(m.id, Event{Kind: EventRetry, Attempts: m.attempts, Due: time.Unix(0, m.due)}, false)
	if m.ks != nil {
		m.ks.busy = m // the key waits for m, in flight until now
	}
	if delay <= 0 {
		q.stats.ready.Add(1)
		q.makeReady(m, true)
		return err
	}
	m.st = stBackoff
	m.at = m.due
	if m.expires != 0 && m.expires < m.at {
		m.at = m.expires
	}
	q.timers.push(m)
	q.stats.delayed.Add(1)
	return err
}

// deadLetter removes m, which is in no structure other than the timer
// heap and its key, for good. The sink gets it after the lock is
// released; its records are released after that. q.mu is held.
func (q *Queue) deadLetter(m *message, reason Reason) {
	if m.hidx >= 0 {
		q.timers.remove(m)
	}
	if k := m.ks; k != nil && k.busy == m {
		k.busy = nil
		q.routeKey(k)
	}
	m.ks = nil
	q.cold.deadLettered.Add(1)
	if reason == ReasonExpired {
		q.cold.expired.Add(1)
	}
	q.notify(m.id, Event{Kind: EventFailed, Attempts: m.attempts, Reason: reason}, true)
	if q.cfg.DeadLetter != nil {
		var d Delivery
		if reason == ReasonUnreadable {
			d = q.describe(m) // its body was just found unreadable (and logged): no second try
		} else {
			d = q.delivery(m)
		}
		ev := event{kind: evDeadLetter, reason: reason, d: d}
		ev.refs[0], ev.refs[1] = m.ref, m.aref
		if ev.d.Body == nil && m.paged {
			ev.reason = ReasonUnreadable
		}
		q.out = append(q.out, ev)
	} else if err := q.release(m); err != nil {
		q.log.Error("queue: journal failed on a dead letter", "queue", q.name, "id", m.id, "err", err)
	}
	q.drop(m)
}

// release releases m's records. q.mu is held.
func (q *Queue) release(m *message) error {
	if q.journal == nil || m.ref.IsZero() {
		return nil
	}
	q.relBuf = append(q.relBuf[:0], m.ref)
	if !m.aref.IsZero() {
		q.relBuf = append(q.relBuf, m.aref)
	}
	return q.journal.Release(q.relBuf, nil)
}

// releaseAcked releases the records of m, just acked, and drops it.
// With hold, a keyed message's key stays blocked until the release is
// durable: were the next task of the key delivered before, a crash (or,
// on a replicated queue, a failover) that lost the ack would deliver m
// again after it, out of order, and while it may still be in flight. A
// placeholder holds the key meanwhile (m itself is recycled). Pullers
// (AMQP's basic.get) do not hold it: a get right after a no-ack get
// finds the key's next message at once. q.mu is held.
func (q *Queue) releaseAcked(m *message, hold bool) error {
	k := m.ks
	if !hold || q.journal == nil || m.ref.IsZero() || k == nil || k.busy != m {
		err := q.release(m)
		q.drop(m)
		return err
	}
	placeholder := new(message)
	k.busy = placeholder
	q.relBuf = append(q.relBuf[:0], m.ref)
	if !m.aref.IsZero() {
		q.relBuf = append(q.relBuf, m.aref)
	}
	// The journal may call done at once, on this goroutine, with q.mu
	// held, or later on another: whichever of the two comes second
	// frees the key.
	const (
		acking = iota
		durable
		waiting
	)
	// A release that failed may be lost (a replica that stopped
	// leading, a broken log): the key stays blocked for as long as this
	// queue lives, which is not long: its journal can take nothing more.
	var state atomic.Int32
	var failed atomic.Bool
	err := q.journal.Release(q.relBuf, func(err error) {
		failed.Store(err != nil)
		if !state.CompareAndSwap(acking, durable) && err == nil {
			go q.unholdKey(k, placeholder)
		}
	})
	q.drop(m)
	if err == nil && !state.CompareAndSwap(acking, waiting) && !failed.Load() {
		q.freeKey(k, placeholder) // durable already
	}
	return err
}

// unholdKey frees k, blocked by hold while an ack's release became
// durable, and delivers what it frees.
func (q *Queue) unholdKey(k *keyState, hold *message) {
	q.lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.freeKey(k, hold)
	q.finish(q.now())
}

// freeKey unblocks k if hold still blocks it (a purge may have freed it,
// and the key state been reused since). q.mu is held.
func (q *Queue) freeKey(k *keyState, hold *message) {
	if k.busy == hold {
		k.busy = nil
		q.routeKey(k)
	}
}

// drop forgets m, which has left every structure, and recycles it.
// q.mu is held.
func (q *Queue) drop(m *message) {
	if k := m.ks; k != nil && k.busy == m {
		k.busy = nil
		q.routeKey(k)
	}
	q.cold.bytes.Add(-int64(m.size))
	q.charge(m, -1)
	delete(q.index, m.id)
	q.recycle(m)
}

// expire dead-letters m, which waits (ready, delayed or backing off),
// for its TTL. q.mu is held.
func (q *Queue) expire(m *message) {
	switch m.st {
	case stReady:
		q.unready(m)
		q.stats.ready.Add(-1)
	case stDelayed, stBackoff:
		q.stats.delayed.Add(-1)
	}
	q.deadLetter(m, ReasonExpired)
}

// tick is called by the scheduler at or after the queue's earliest
// deadline: due messages become ready, expired ones are dead-lettered.
func (q *Queue) tick(now int64) {
	q.lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.armedAt = 0
	for len(q.timers) > 0 && q.timers[0].at <= now {
		m := q.timers[0]
		q.timers.remove(m)
		switch {
		case m.expires != 0 && m.expires <= now:
			q.expire(m)
		case m.st == stDelayed || m.st == stBackoff:
			q.stats.delayed.Add(-1)
			q.stats.ready.Add(1)
			q.makeReady(m, m.st == stBackoff)
		}
	}
	q.finish(now)
}

// serve delivers to c while it has credit and something to take. q.mu is
// held.
func (q *Queue) serve(c *Consumer, now int64) {
	for c.credit() && q.deliverOne(c, now) {
	}
	q.updateHungry(c)
}

// deliverOne delivers the best message c can take: the higher priority
// of the shared ready list and c's keys, the older on a tie. An expired
// message found on the way is dead-lettered instead. It reports whether
// it did either. q.mu is held.
func (q *Queue) deliverOne(c *Consumer, now int64) bool {
	var m *message
	if q.readyMask != 0 {
		m = q.front(bits.Len16(q.readyMask) - 1)
	}
	if k := c.keys.best(); k != nil {
		if km := k.waiting.head; m == nil || km.prio > m.prio || km.prio == m.prio && km.id < m.id {
			m = km
		}
	}
	if m == nil {
		return false
	}
	if m.expires != 0 && m.expires <= now {
		q.expire(m)
		return true
	}
	d := q.delivery(m)
	if d.Body == nil && m.paged {
		// The body cannot be read back, now or later.
		q.unready(m)
		q.stats.ready.Add(-1)
		q.deadLetter(m, ReasonUnreadable)
		return true
	}
	if m.hidx >= 0 {
		q.timers.remove(m)
	}
	if k := m.ks; k != nil {
		k.waiting.remove(m)
		if k.kq != nil {
			k.kq.remove(k)
		}
		k.busy, k.owner = m, c
	} else {
		q.unlist(m)
	}
	m.st, m.owner = stInflight, c
	c.unacked.pushBack(m)
	q.stats.ready.Add(-1)
	q.stats.unacked.Add(1)
	q.stats.delivered.Add(1)
	if m.attempts > 0 {
		q.cold.redelivered.Add(1)
	}
	q.out = append(q.out, event{kind: evDeliver, c: c, d: d})
	// The consumer has the body now; a redelivery reads it back.
	q.pageOut(m)
	return true
}

// delivery describes m, reading its body and headers back if they are
// paged (Body nil if that fails). q.mu is held.
func (q *Queue) delivery(m *message) Delivery {
	d := q.describe(m)
	if m.paged {
		d.Body, d.Headers = q.readBack(m)
	}
	return d
}

// describe describes m with what it holds in RAM: no body or headers if
// they are paged. q.mu is held.
func (q *Queue) describe(m *message) Delivery {
	return Delivery{
		ID: m.id, Body: m.body, Headers: m.headers, Key: m.key, Priority: m.prio,
		Attempts: m.attempts, Redelivered: m.attempts > 0, Enqueued: time.Unix(0, m.enqueued),
	}
}

// readBack reads m's body and headers back from the journal; the body is
// nil if that fails. This is the one place that knows where a paged
// message lives. q.mu is held.
func (q *Queue) readBack(m *message) ([]byte, map[string]string) {
	if q.reader == nil {
		q.log.Error("queue: message paged and the journal cannot read", "queue", q.name, "id", m.id)
		return nil, nil
	}
	p, err := q.reader.Read(m.ref)
	var r enqueueRecord
	if err == nil {
		r, err = decodeEnqueue(p)
	}
	if err == nil && (r.id != m.id || len(r.body) != m.size) {
		err = fmt.Errorf("%w: record %v holds message %d", errBadRecord, m.ref, r.id)
	}
	if err != nil {
		q.log.Error("queue: cannot read a message back", "queue", q.name, "id", m.id, "ref", m.ref, "err", err)
		return nil, nil
	}
	if r.body == nil {
		r.body = []byte{}
	}
	return r.body, r.headers
}

// finish ends every operation that may have changed what can be
// delivered: it serves the consumers that gained credit or keys, gives
// the shared ready list to the hungry consumers in turn, arms the timer,
// then releases q.mu and runs the callbacks. now 0 means no delivery can
// have become possible.
func (q *Queue) finish(now int64) {
	if now != 0 {
		q.dispatch(now)
		q.balance(now)
	}
	q.report()
	if len(q.timers) > 0 {
		if at := q.timers[0].at; q.armedAt == 0 || at < q.armedAt {
			q.armedAt = at
			q.sched.schedule(q, at)
		}
	}
	q.unlock()
}

// dispatch delivers until no consumer with credit can take anything: the
// consumers marked dirty first, then the shared ready list round-robin.
// q.mu is held.
func (q *Queue) dispatch(now int64) {
	for {
		if n := len(q.dirty); n > 0 {
			c := q.dirty[n-1]
			q.dirty[n-1] = nil
			q.dirty = q.dirty[:n-1]
			c.dirty = false
			if !c.removed {
				q.serve(c, now)
			}
			continue
		}
		c := q.hungry.head
		if q.readyMask == 0 || c == nil {
			return
		}
		q.deliverOne(c, now)
		q.hungry.rotate(c)
		q.updateHungry(c)
	}
}

// notify queues ev for the watchers of id; last forgets them. q.mu is
// held.
func (q *Queue) notify(id uint64, ev Event, last bool) {
	if last && q.dedup.len() > 0 {
		q.settled(id, ev)
	}
	ws, ok := q.watchers[id]
	if !ok {
		return
	}
	ev.ID = id
	for _, w := range ws {
		q.out = append(q.out, event{kind: evWatch, watch: w.fn, ev: ev})
	}
	if last {
		delete(q.watchers, id)
	}
}

func (q *Queue) alloc() *message {
	if n := len(q.free); n > 0 {
		m := q.free[n-1]
		q.free[n-1] = nil
		q.free = q.free[:n-1]
		return m
	}
	return &message{hidx: -1}
}

func (q *Queue) recycle(m *message) {
	if len(q.free) >= maxFree {
		return
	}
	*m = message{hidx: -1}
	q.free = append(q.free, m)
}

// evKind tells events apart.
type evKind uint8

const (
	evDeliver evKind = iota + 1
	evWatch
	evDeadLetter
	evActive
	evConfirm
)

// event is a callback to run without the lock.
type event struct {
	kind    evKind
	c       *Consumer // evDeliver: to whom; evActive: the new active, or nil
	d       Delivery  // evDeliver, evDeadLetter
	refs    [2]Ref    // evDeadLetter: records to release once the sink has the message
	reason  Reason    // evDeadLetter
	watch   WatchFunc // evWatch
	ev      Event     // evWatch
	confirm func(error)
}

// lock takes q.mu to change the queue. Every change of what a snapshot
// holds takes it this way, so that a snapshot can tell whether anything
// changed since the last one (see [Queue.AppendSnapshotSince]); reads
// that change nothing may take q.mu directly.
func (q *Queue) lock() {
	q.mu.Lock()
	q.gen++
}

// unlock releases q.mu and runs the queued callbacks, in order, without
// the lock. One goroutine runs them at a time: a goroutine that finds
// another at it leaves its callbacks to it, so callbacks keep their
// order and may call the queue (an Ack from a Deliver callback is fine).
func (q *Queue) unlock() {
	if q.flushing || len(q.out) == 0 {
		q.mu.Unlock()
		return
	}
	q.flushing = true
	for len(q.out) > 0 {
		batch := q.out
		q.out = q.spare[:0]
		q.mu.Unlock()
		for i := range batch {
			q.run(&batch[i])
			batch[i] = event{}
		}
		q.mu.Lock()
		q.spare = batch[:0]
	}
	q.flushing = false
	q.mu.Unlock()
}

// run runs one callback; q.mu is not held.
func (q *Queue) run(e *event) {
	switch e.kind {
	case evDeliver:
		if !e.c.gone.Load() {
			e.c.deliver(e.d)
		}
	case evWatch:
		e.watch(e.ev)
	case evDeadLetter:
		q.cfg.DeadLetter(DeadLetter{Queue: q.name, Reason: e.reason, Message: e.d})
		if q.journal != nil && !e.refs[0].IsZero() {
			refs := e.refs[:1]
			if !e.refs[1].IsZero() {
				refs = e.refs[:2]
			}
			q.lock()
			err := q.journal.Release(refs, nil)
			q.mu.Unlock()
			if err != nil {
				q.log.Error("queue: journal failed on a dead letter", "queue", q.name, "id", e.d.ID, "err", err)
			}
		}
	case evActive:
		id := ""
		if e.c != nil {
			id = e.c.id
		}
		q.cfg.OnActive(id)
	case evConfirm:
		e.confirm(nil)
	}
}

// ToQueue returns a [Config.DeadLetter] sink that enqueues dead letters
// into target, with their body, headers, key and priority, and the
// headers x-death-queue and x-death-reason added (the original headers
// map is copied, not modified).
func ToQueue(target *Queue) func(DeadLetter) {
	return func(dl DeadLetter) {
		h := make(map[string]string, len(dl.Message.Headers)+2)
		for k, v := range dl.Message.Headers {
			h[k] = v
		}
		h["x-death-queue"] = dl.Queue
		h["x-death-reason"] = string(dl.Reason)
		_, err := target.Enqueue(Message{Body: dl.Message.Body, Headers: h, Key: dl.Message.Key, Priority: dl.Message.Priority}, nil, nil)
		if err != nil {
			target.log.Error("queue: dead letter lost", "from", dl.Queue, "to", target.name, "id", dl.Message.ID, "err", err)
		}
	}
}
