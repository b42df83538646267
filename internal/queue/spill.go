package queue

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// Paging. A durable queue (one whose journal is a Reader) keeps in RAM
// only what its share of the node's budget allows ([Memory]):
//
//   - Bodies. Every body is in the journal already, so paging one out is
//     dropping the RAM copy (message.paged); it is read back when
//     delivered. Under pressure (PageLevel > 0) a message keeps its body
//     only if it joins the head of its level while the queue's kept
//     bytes are under bodyAllowance; the others page out at once, and
//     the bodies kept beyond the allowance are dropped a bounded number
//     at a time, newest first. A body delivered is dropped from the
//     queue (the consumer has it; a redelivery reads it back). Nothing
//     is written to page a body out: no burst of writes, ever.
//
//   - The index. Under pressure, a level's FIFO whose head holds more
//     than indexAllowance messages spills its middle to runs: whole
//     files of compact entries written through the journal's [Spiller]
//     (spillBatch messages each, one write), after which those messages
//     have no *message and no map entry. New messages then join the
//     tail, which spills in turn whenever it reaches spillBatch; the head
//     is refilled from the oldest run, refillBatch entries at a time,
//     when it falls under refillLow. A deep queue thus keeps about
//     refillLow+refillBatch+spillBatch messages a level in RAM whatever
//     its depth, and writes 52 bytes a message to its runs, evenly, as
//     messages arrive.
//
// Messages with a key, delayed or backing off, being retried and in
// flight stay in RAM (their bodies page out all the same): their
// structures (keys, the timer heap) are not FIFOs.
//
// Spilled messages expire when they come back to the head, as RabbitMQ's
// queues expire per-message TTLs only at the head.
//
// A run file, little-endian:
//
//	+--------+------+---------+-------+-----------+-------------+
//	| "CQRN" | v u8 | prio u8 | 0 0   | count u32 | crc32c u32  |   16 bytes
//	+--------+------+---------+-------+-----------+-------------+
//	count x:
//	+--------+--------------+---------+-------------+
//	| id u64 | enqueued i64 | due i64 | expires i64 |
//	+--------+--------------+---------+-------------+--------------+
//	| ref: seg u32, off u32, len u32  | size u32    | crc32c u32   |   52 bytes
//	+---------------------------------+-------------+--------------+
//	header crc: of its first 12 bytes; entry crc: of its first 48
//
// A spilled message has no key, no failed attempt (attempts 0, no
// attempt record: those are retried, in RAM), and its headers and body
// are in its enqueue record (ref).

const (
	runHeaderSize = 16
	runEntrySize  = 52
	runVersion    = 1
	// trimSteps bounds the messages looked at per operation to drop
	// bodies beyond the allowance.
	trimSteps = 1024
	// spillRetry is how long spilling pauses after a failed run write.
	spillRetry = int64(1e9)
)

// Sizes of the paged index; variables so that tests can make them small.
var (
	// spillBatch is the number of messages a run holds (at most).
	spillBatch = 4096
	// refillLow and refillBatch: the head is refilled when it holds
	// fewer than refillLow messages, refillBatch entries at a time.
	refillLow   = 512
	refillBatch = int64(1024)
	// keepMin is the least indexAllowance: a head that small is never
	// spilled.
	keepMin = 2048
)

var runMagic = [4]byte{'C', 'Q', 'R', 'N'}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// run is a spilled stretch of a level's FIFO.
type run struct {
	num            uint32 // the Spiller's run number
	next, count    uint32 // the next entry to read; entries in the run
	bytes          int64  // body bytes of the entries not yet read
	minSeg, maxSeg uint32 // of the entries' refs
	minID, maxID   uint64
	checked        bool // its header was read and matched (checkRun)
}

func (r *run) left() int64 { return int64(r.count - r.next) }

// runAttempt is a failed attempt replayed after a restart for a message that
// is in a run: it applies when the message is read back.
type runAttempt struct {
	attempts uint32
	due      int64
	aref     Ref
}

// headersSize is what the queue accounts for headers in RAM.
func headersSize(h map[string]string) int32 {
	if len(h) == 0 {
		return 0
	}
	n := 48
	for k, v := range h {
		n += len(k) + len(v) + 32
	}
	return int32(min(n, 1<<30))
}

// cost is what m costs in RAM.
func (m *message) cost() int64 {
	c := int64(MessageOverhead + len(m.key))
	if !m.paged {
		c += int64(m.size) + int64(m.hsize)
	}
	return c
}

// pageable reports whether m's body can be dropped: it is in the
// journal, which reads back. q.mu is held.
func (q *Queue) pageable(m *message) bool {
	return q.reader != nil && !m.paged && !m.ref.IsZero()
}

// charge adds (sign 1) or removes (-1) m's cost to the queue's
// accounting. q.mu is held.
func (q *Queue) charge(m *message, sign int64) {
	q.resident += sign * m.cost()
	if m.paged {
		q.nPaged += sign
	} else if q.journal != nil {
		q.kept += sign * (int64(m.size) + int64(m.hsize))
	}
}

// pageOut drops m's body and headers from RAM if the journal has them.
// q.mu is held.
func (q *Queue) pageOut(m *message) {
	if !q.pageable(m) {
		return
	}
	q.charge(m, -1)
	m.body, m.headers, m.paged = nil, nil, true
	q.charge(m, 1)
}

// report publishes the queue's memory counters, and adds their change to
// the budget. q.mu is held.
func (q *Queue) report() {
	now := [3]int64{q.resident, q.nPaged, q.nSpilled}
	if now == q.reported {
		return
	}
	q.stats.resident.Store(now[0])
	q.cold.pagedOut.Store(now[1])
	q.cold.spilled.Store(now[2])
	if q.mem != nil && !q.closed {
		q.mem.add(now[0]-q.reported[0], now[1]-q.reported[1], now[2]-q.reported[2])
	}
	q.reported = now
}

// pageLevel is the budget's page level; 0 without a budget.
func (q *Queue) pageLevel() float64 {
	if q.mem == nil {
		return 0
	}
	return q.mem.PageLevel()
}

// bodyAllowance is how many body bytes a durable queue keeps in RAM at
// page level p > 0: an eighth of the budget at the start of paging,
// nothing at the budget.
func (q *Queue) bodyAllowance(p float64) int64 {
	return int64((1 - p) * float64(q.mem.Budget()) / 8)
}

// indexAllowance is how many messages a level's head keeps in RAM
// before its middle spills, at page level p > 0: a sixteenth of the
// budget's worth at the start of paging, keepMin at the budget.
func (q *Queue) indexAllowance(p float64) int {
	n := (1 - p) * float64(q.mem.Budget()) / 16 / MessageOverhead
	return max(keepMin, int(min(n, 1<<30)))
}

// pageOnEnqueue decides whether m, just enqueued, keeps its body in RAM.
// q.mu is held.
func (q *Queue) pageOnEnqueue(m *message) {
	if !q.pageable(m) {
		return
	}
	p := q.pageLevel()
	if p == 0 {
		return
	}
	if m.st == stReady && m.list == &q.ready[m.prio].main && q.kept <= q.bodyAllowance(p) {
		return // at the head, within the allowance
	}
	q.pageOut(m)
}

// balance pages out what the budget no longer allows and refills the
// heads of spilled levels, a bounded amount per operation: at most one
// run a level. It reports whether it spilled. q.mu is held.
func (q *Queue) balance(now int64) (spilled bool) {
	for mask := q.readyMask; mask != 0; mask &= mask - 1 {
		p := 0
		for mask&(1<<p) == 0 {
			p++
		}
		if lv := &q.ready[p]; len(lv.runs) > 0 && lv.main.n < refillLow {
			q.refill(p, now)
		}
	}
	if q.reader == nil || q.mem == nil {
		return false
	}
	pl := q.mem.PageLevel()
	if pl == 0 {
		return false
	}
	if allow := q.bodyAllowance(pl); q.kept > allow+allow/4 {
		q.trimBodies(allow)
	}
	if q.spiller == nil || now < q.spillHold {
		return false
	}
	keep := q.indexAllowance(pl)
	for mask := q.readyMask; mask != 0; mask &= mask - 1 {
		p := 0
		for mask&(1<<p) == 0 {
			p++
		}
		lv := &q.ready[p]
		switch {
		case lv.main.n > keep+spillBatch:
			spilled = q.spill(p, false, now) || spilled // the head's end: a run before the others
		case len(lv.runs) > 0 && lv.tail.n >= spillBatch:
			spilled = q.spill(p, true, now) || spilled
		}
	}
	return spilled
}

// trimBodies drops bodies from the newest messages of the heads until
// the queue keeps allow bytes, looking at trimSteps messages at most.
// q.mu is held.
func (q *Queue) trimBodies(allow int64) {
	steps := 0
	for p := MaxPriority; p >= 0 && steps < trimSteps; p-- {
		for _, l := range []*msgList{&q.ready[p].tail, &q.ready[p].main} {
			for m := l.tail; m != nil && steps < trimSteps && q.kept > allow; m = m.prev {
				q.pageOut(m)
				steps++
			}
		}
	}
}

// spillable reports whether m can go to a run. q.mu is held.
func spillable(m *message) bool {
	return m.st == stReady && m.key == "" && m.attempts == 0 && m.aref.IsZero() && !m.ref.IsZero()
}

// spill moves up to spillBatch messages of level p to a new run: the
// oldest of the tail (fromTail), appended after the other runs, or the
// newest of the head, put before them. It reports whether it wrote a
// run. q.mu is held.
func (q *Queue) spill(p int, fromTail bool, now int64) bool {
	lv := &q.ready[p]
	// Pick the stretch: first..last in list order, all spillable.
	var first, last *message
	n := 0
	if fromTail {
		for m := lv.tail.head; m != nil && n < spillBatch && spillable(m); m = m.next {
			if first == nil {
				first = m
			}
			last = m
			n++
		}
	} else {
		for m := lv.main.tail; m != nil && n < spillBatch && spillable(m); m = m.prev {
			if last == nil {
				last = m
			}
			first = m
			n++
		}
	}
	if n == 0 {
		return false
	}
	r := &run{count: uint32(n), minSeg: ^uint32(0), minID: ^uint64(0)}
	buf := q.runBuf[:0]
	buf = appendRunHeader(buf, uint8(p), uint32(n))
	for m := first; ; m = m.next {
		buf = appendRunEntry(buf, m)
		r.bytes += int64(m.size)
		r.minSeg, r.maxSeg = min(r.minSeg, m.ref.Seg), max(r.maxSeg, m.ref.Seg)
		r.minID, r.maxID = min(r.minID, m.id), max(r.maxID, m.id)
		if m == last {
			break
		}
	}
	q.runBuf = buf
	num, err := q.spiller.WriteRun(buf)
	if err != nil {
		q.spillHold = now + spillRetry
		q.log.Error("queue: cannot spill the index to a run; keeping it in RAM", "queue", q.name, "err", err)
		return false
	}
	r.num = num
	for m, next := first, first; m != nil; m = next {
		next = m.next
		stop := m == last
		m.list.remove(m)
		if m.hidx >= 0 {
			q.timers.remove(m)
		}
		q.charge(m, -1)
		delete(q.index, m.id)
		q.recycle(m)
		if stop {
			break
		}
	}
	lv.spilled += int64(n)
	q.nSpilled += int64(n)
	if fromTail {
		lv.runs = append(lv.runs, r)
	} else {
		lv.runs = append(lv.runs, nil)
		copy(lv.runs[1:], lv.runs)
		lv.runs[0] = r
	}
	return true
}

// front returns the next message of level p, refilling its head from its
// runs if it is empty; nil if the level is empty. q.mu is held.
func (q *Queue) front(p int) *message {
	lv := &q.ready[p]
	for lv.retry.n == 0 && lv.main.n == 0 && (len(lv.runs) > 0 || lv.tail.n > 0) {
		q.refill(p, q.now())
	}
	m := lv.front()
	if m == nil {
		if lv.spilled != 0 {
			// Never expected: counted messages that no run holds. Forget
			// them rather than look for them forever.
			q.log.Error("queue: spilled messages counted and not found", "queue", q.name, "level", p, "count", lv.spilled)
			q.stats.ready.Add(-lv.spilled)
			q.nSpilled -= lv.spilled
			lv.spilled = 0
		}
		q.readyMask &^= 1 << p
	}
	return m
}

// refill reads up to refillBatch entries of level p's oldest run into
// its head; once the runs are consumed, the tail becomes the head. q.mu
// is held.
func (q *Queue) refill(p int, now int64) {
	lv := &q.ready[p]
	if len(lv.runs) == 0 {
		for m := lv.tail.head; m != nil; m = lv.tail.head {
			lv.tail.remove(m)
			lv.main.pushBack(m)
		}
		return
	}
	r := lv.runs[0]
	want := min(r.left(), refillBatch)
	got := int64(0)
	if want > 0 {
		need := int(want) * runEntrySize
		if cap(q.runBuf) < need {
			q.runBuf = make([]byte, need)
		}
		buf := q.runBuf[:need]
		n, err := 0, q.checkRun(r, p)
		if err == nil {
			n, err = q.spiller.ReadRun(r.num, runHeaderSize+int64(r.next)*runEntrySize, buf)
		}
		if err != nil || n < need {
			q.log.Error("queue: cannot read a run back; its messages are lost to the queue (their records stay in the journal)",
				"queue", q.name, "run", r.num, "entry", r.next, "err", err, "bytes", n)
			n = max(n, 0)
			buf = buf[:n-n%runEntrySize]
			lost := r.left() - int64(len(buf)/runEntrySize)
			want = int64(len(buf) / runEntrySize)
			r.count = r.next + uint32(want) // the rest is gone
			lv.spilled -= lost
			q.nSpilled -= lost
			q.stats.ready.Add(-lost)
		}
		for i := range want {
			e := buf[i*runEntrySize : (i+1)*runEntrySize]
			r.next++
			lv.spilled--
			q.nSpilled--
			got++
			q.materialize(p, e, r, now)
		}
	}
	defer func() {
		if lv.empty() {
			q.readyMask &^= 1 << p
		}
	}()
	if r.left() == 0 {
		if r.bytes != 0 {
			q.cold.bytes.Add(-r.bytes) // entries that did not decode
		}
		lv.runs = lv.runs[1:]
		if len(lv.runs) == 0 {
			lv.runs = nil
		}
		q.spiller.DropRun(r.num)
		if len(lv.runs) == 0 {
			q.refill(p, now) // the tail joins the head
		}
	}
}

// materialize brings one run entry back into level p's head as a paged
// message. q.mu is held.
func (q *Queue) materialize(p int, e []byte, r *run, now int64) {
	m := q.alloc()
	if !decodeRunEntry(e, m) {
		q.recycle(m)
		q.stats.ready.Add(-1)
		q.log.Error("queue: bad run entry; message lost to the queue", "queue", q.name, "run", r.num)
		return
	}
	r.bytes -= int64(m.size)
	if _, ok := q.runReleased[m.ref]; ok {
		// Acked (or dead-lettered) after the checkpoint that named the
		// run, before a restart: its records are released.
		delete(q.runReleased, m.ref)
		q.stats.ready.Add(-1)
		q.cold.bytes.Add(-int64(m.size))
		q.recycle(m)
		return
	}
	m.prio, m.paged = uint8(p), true
	q.index[m.id] = m
	q.charge(m, 1)
	if o, ok := q.runAttempts[m.id]; ok {
		// It failed after the checkpoint, before a restart.
		delete(q.runAttempts, m.id)
		m.attempts, m.due, m.aref = o.attempts, o.due, o.aref
		if q.settling != nil && m.due <= now {
			// Build sorts it with the other retried messages.
			q.stats.ready.Add(-1)
			q.settling = append(q.settling, m)
			return
		}
		if m.due > now {
			q.stats.ready.Add(-1)
			q.stats.delayed.Add(1)
			m.st = stBackoff
			m.at = m.due
			if m.expires != 0 && m.expires < m.at {
				m.at = m.expires
			}
			q.timers.push(m)
			return
		}
		q.makeReady(m, true)
		return
	}
	m.st = stReady
	if m.expires != 0 {
		m.at = m.expires
		q.timers.push(m)
	}
	q.ready[p].main.pushBack(m)
	q.readyMask |= 1 << p
}

// maybeSpilled reports whether message id may be in a run. q.mu is held.
func (q *Queue) maybeSpilled(id uint64) bool {
	for p := range q.ready {
		for _, r := range q.ready[p].runs {
			if id >= r.minID && id <= r.maxID {
				return true
			}
		}
	}
	return false
}

func appendRunHeader(b []byte, prio uint8, count uint32) []byte {
	var h [runHeaderSize]byte
	copy(h[:], runMagic[:])
	h[4], h[5] = runVersion, prio
	binary.LittleEndian.PutUint32(h[8:], count)
	binary.LittleEndian.PutUint32(h[12:], crc32.Checksum(h[:12], crcTable))
	return append(b, h[:]...)
}

func appendRunEntry(b []byte, m *message) []byte {
	var e [runEntrySize]byte
	binary.LittleEndian.PutUint64(e[0:], m.id)
	binary.LittleEndian.PutUint64(e[8:], uint64(m.enqueued))
	binary.LittleEndian.PutUint64(e[16:], uint64(m.due))
	binary.LittleEndian.PutUint64(e[24:], uint64(m.expires))
	putRef(e[32:], m.ref)
	binary.LittleEndian.PutUint32(e[44:], uint32(m.size))
	binary.LittleEndian.PutUint32(e[48:], crc32.Checksum(e[:48], crcTable))
	return append(b, e[:]...)
}

// decodeRunEntry fills m from entry e and reports whether it checks.
func decodeRunEntry(e []byte, m *message) bool {
	if len(e) != runEntrySize || binary.LittleEndian.Uint32(e[48:]) != crc32.Checksum(e[:48], crcTable) {
		return false
	}
	m.id = binary.LittleEndian.Uint64(e[0:])
	m.enqueued = int64(binary.LittleEndian.Uint64(e[8:]))
	m.due = int64(binary.LittleEndian.Uint64(e[16:]))
	m.expires = int64(binary.LittleEndian.Uint64(e[24:]))
	m.ref = getRef(e[32:])
	m.size = int(binary.LittleEndian.Uint32(e[44:]))
	return m.id != 0 && !m.ref.IsZero()
}

// checkRun reads the header of run r of level p the first time the run
// is read, and checks it: its checksum, and that it names the level and
// the count the queue recorded. Each entry has its own checksum, but a
// header that does not match means the file is not (or no longer) the
// run the queue wrote: none of its entries can be trusted to be this
// queue's. q.mu is held.
func (q *Queue) checkRun(r *run, p int) error {
	if r.checked {
		return nil
	}
	prio, count, err := readRunHeader(q.spiller, r.num)
	switch {
	case err != nil:
		return err
	case int(prio) != p || (r.next == 0 && count != r.count) || count < r.count:
		return fmt.Errorf("%w: run %d holds %d entries of level %d, the queue expects %d of level %d", errBadRecord, r.num, count, prio, r.count, p)
	}
	r.checked = true
	return nil
}

// readRunHeader reads and checks the header of run num.
func readRunHeader(sp Spiller, num uint32) (prio uint8, count uint32, err error) {
	var h [runHeaderSize]byte
	n, err := sp.ReadRun(num, 0, h[:])
	if err != nil {
		return 0, 0, fmt.Errorf("read run %d: %w", num, err)
	}
	prio, count, err = checkRunHeader(h[:n])
	if err != nil {
		return 0, 0, fmt.Errorf("run %d: %w", num, err)
	}
	return prio, count, nil
}

// checkRunHeader reports whether h is a run header, with its level and
// count.
func checkRunHeader(h []byte) (prio uint8, count uint32, err error) {
	if len(h) < runHeaderSize || [4]byte(h[:4]) != runMagic || h[4] != runVersion ||
		binary.LittleEndian.Uint32(h[12:]) != crc32.Checksum(h[:12], crcTable) || h[5] > MaxPriority {
		return 0, 0, fmt.Errorf("%w: bad run header", errBadRecord)
	}
	return h[5], binary.LittleEndian.Uint32(h[8:]), nil
}

// purgeRuns removes every message in runs, as [Queue.Purge] does the
// others: their records are released and their watchers told. It reads
// every run (52 bytes a message) with the queue's lock held: a purge of
// a deep queue takes a while. It returns how many it removed. q.mu is
// held.
func (q *Queue) purgeRuns() int {
	removed := 0
	for p := range q.ready {
		lv := &q.ready[p]
		for _, r := range lv.runs {
			for r.left() > 0 {
				want := min(r.left(), 16*refillBatch)
				need := int(want) * runEntrySize
				if cap(q.runBuf) < need {
					q.runBuf = make([]byte, need)
				}
				buf := q.runBuf[:need]
				n, err := 0, q.checkRun(r, p)
				if err == nil {
					n, err = q.spiller.ReadRun(r.num, runHeaderSize+int64(r.next)*runEntrySize, buf)
				}
				if err != nil || n < need {
					q.log.Error("queue: cannot read a run to purge it; its records stay live", "queue", q.name, "run", r.num, "err", err)
					want = int64(n / runEntrySize)
					r.count = r.next + uint32(want)
				}
				var m message
				for i := range want {
					r.next++
					if !decodeRunEntry(buf[i*runEntrySize:(i+1)*runEntrySize], &m) {
						continue
					}
					r.bytes -= int64(m.size)
					q.cold.bytes.Add(-int64(m.size))
					if _, ok := q.runReleased[m.ref]; ok {
						delete(q.runReleased, m.ref)
						continue
					}
					q.relBuf = append(q.relBuf[:0], m.ref)
					if a, ok := q.runAttempts[m.id]; ok {
						delete(q.runAttempts, m.id)
						q.relBuf = append(q.relBuf, a.aref)
						m.attempts = a.attempts
					}
					if err := q.journal.Release(q.relBuf, nil); err != nil {
						q.log.Error("queue: journal failed on a purge", "queue", q.name, "id", m.id, "err", err)
					}
					q.notify(m.id, Event{Kind: EventFailed, Attempts: m.attempts, Reason: ReasonPurged}, true)
					removed++
				}
			}
			q.cold.bytes.Add(-r.bytes)
			q.spiller.DropRun(r.num)
		}
		q.stats.ready.Add(-lv.spilled)
		q.nSpilled -= lv.spilled
		lv.spilled, lv.runs = 0, nil
		// Every message of the tail is in q.index: Purge removes it.
	}
	q.runReleased, q.runAttempts = nil, nil
	return removed
}
