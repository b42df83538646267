package queue

import (
	"encoding/binary"
	"fmt"
	"maps"
)

// A snapshot is a queue's index for a checkpoint (store.Log.Checkpoint
// keeps the caller's state): the metadata and record refs of every
// message in RAM, not bodies or headers, which stay in the journal, and
// references to the runs that hold the index of the spilled messages
// (see spill.go), not their contents: its size follows what the queue
// keeps in RAM, not its depth. A restart loads it with
// [Rebuilder.LoadSnapshot], then applies only the records written after
// the checkpoint, so that its work follows what was written since, not
// the depth of the queue. Little-endian:
//
//	+--------+------+-------+------------+-----------+
//	| "CQSN" | v u8 | 0 0 0 | nextID u64 | count u64 |   24 bytes
//	+--------+------+-------+------------+-----------+
//	count x:
//	+--------+--------------+---------+-------------+--------------+----------+
//	| id u64 | enqueued i64 | due i64 | expires i64 | attempts u32 | size u32 |
//	+--------+--------------+---------+-------------+--------------+----------+
//	| ref: seg u32, off u32, len u32 | aref: seg, off, len | prio u8 | flags u8 |
//	+--------------------------------+---------------------+---------+----------+
//	| keyLen u16 | key |                                       68 bytes + key
//	+------------+-----+
//	flags: bit 0: the message is at the head of its level (before its
//	runs), or in flight
//
//	version 2 goes on (version 1 ends here: no runs):
//	+-----------+---------------+---------------+-------+
//	| nruns u32 | nreleased u32 | nattempts u32 | 0 u32 |   16 bytes
//	+-----------+---------------+---------------+-------+
//	nruns x, each level's runs in order, oldest first:
//	+---------+---------+-------+----------+-----------+-----------+
//	| num u32 | prio u8 | 0 0 0 | next u32 | count u32 | bytes i64 |
//	+---------+---------+-------+----------+-----------+-----------+
//	| minSeg u32 | maxSeg u32 | minID u64 | maxID u64 |             48 bytes
//	+------------+------------+-----------+-----------+
//	nreleased x: ref (12 bytes): released while its message was in a run
//	nattempts x: | id u64 | attempts u32 | due i64 | aref (12) |   32 bytes
//	  failed attempts of messages in runs
//
//	version 3 goes on (version 2 ends here: no dedup window):
//	+-----------+
//	| npairs u32|
//	+-----------+
//	npairs x, oldest first: the (producer, seq) window (dedup.go)
//	| pidLen u8 | producer | seq u64 | id u64 | at i64 |
//
// The runs' last two lists are empty but after a restart from a checkpoint
// that named runs: records replayed for messages that were then in a run
// (read back, delivered and acked or failed before the crash) wait there
// until their run entry is read back.

var snapMagic = [4]byte{'C', 'Q', 'S', 'N'}

const (
	snapHeaderSize  = 24
	snapEntrySize   = 68
	snapVersion     = 3
	snapVersionRuns = 2
	snapSectionSize = 16
	snapRunSize     = 48
	snapAttemptSize = 32
	snapFlagHead    = 1
)

// AppendSnapshot appends the queue's snapshot to dst. Call it from the
// snapshot function of store.Log.Checkpoint: it takes the queue's lock,
// under which every record is appended with its change, so the snapshot
// reflects every record before the checkpoint's position (and perhaps
// some after, which replay applies idempotently). Messages in flight are
// included: after a restart they are ready again. Runs it names must be
// durable before the checkpoint is: store.Log.Checkpoint syncs them.
func (q *Queue) AppendSnapshot(dst []byte) []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.appendSnapshot(dst)
}

// AppendSnapshotSince is [Queue.AppendSnapshot] for a checkpoint that
// kept the queue's last snapshot: version is the one that snapshot was
// taken at (0 for none). If nothing changed since, it appends nothing
// and returns changed false: the last snapshot is still exact, and may
// be written again in its place. Otherwise it appends the snapshot and
// returns the version it was taken at.
//
// "Nothing changed" is judged conservatively: every call that may
// change the queue (an enqueue, a delivery, an ack, a consumer coming or
// going, a timer) counts as a change, whether or not it changed what
// the snapshot holds.
func (q *Queue) AppendSnapshotSince(dst []byte, version uint64) (out []byte, at uint64, changed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if version != 0 && version == q.gen {
		return dst, version, false
	}
	return q.appendSnapshot(dst), q.gen, true
}

// appendSnapshot appends the snapshot; q.mu is held.
func (q *Queue) appendSnapshot(dst []byte) []byte {
	dst = append(dst, snapMagic[:]...)
	dst = append(dst, snapVersion, 0, 0, 0)
	dst = binary.LittleEndian.AppendUint64(dst, q.nextID)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(q.index)))
	for _, m := range q.index {
		var e [snapEntrySize]byte
		binary.LittleEndian.PutUint64(e[0:], m.id)
		binary.LittleEndian.PutUint64(e[8:], uint64(m.enqueued))
		binary.LittleEndian.PutUint64(e[16:], uint64(m.due))
		binary.LittleEndian.PutUint64(e[24:], uint64(m.expires))
		binary.LittleEndian.PutUint32(e[32:], m.attempts)
		binary.LittleEndian.PutUint32(e[36:], uint32(m.size))
		putRef(e[40:], m.ref)
		putRef(e[52:], m.aref)
		e[64] = m.prio
		if m.list != nil && m.list == &q.ready[m.prio].main || m.st == stInflight {
			e[65] = snapFlagHead
		}
		binary.LittleEndian.PutUint16(e[66:], uint16(len(m.key)))
		dst = append(dst, e[:]...)
		dst = append(dst, m.key...)
	}
	nruns := 0
	for p := range q.ready {
		nruns += len(q.ready[p].runs)
	}
	if nruns == 0 {
		// Nothing left for them to match.
		q.runReleased, q.runAttempts = nil, nil
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(nruns))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(q.runReleased)))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(q.runAttempts)))
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	for p := range q.ready {
		for _, r := range q.ready[p].runs {
			var b [snapRunSize]byte
			binary.LittleEndian.PutUint32(b[0:], r.num)
			b[4] = uint8(p)
			binary.LittleEndian.PutUint32(b[8:], r.next)
			binary.LittleEndian.PutUint32(b[12:], r.count)
			binary.LittleEndian.PutUint64(b[16:], uint64(r.bytes))
			binary.LittleEndian.PutUint32(b[24:], r.minSeg)
			binary.LittleEndian.PutUint32(b[28:], r.maxSeg)
			binary.LittleEndian.PutUint64(b[32:], r.minID)
			binary.LittleEndian.PutUint64(b[40:], r.maxID)
			dst = append(dst, b[:]...)
		}
	}
	for ref := range q.runReleased {
		var b [12]byte
		putRef(b[:], ref)
		dst = append(dst, b[:]...)
	}
	for id, a := range q.runAttempts {
		var b [snapAttemptSize]byte
		binary.LittleEndian.PutUint64(b[0:], id)
		binary.LittleEndian.PutUint32(b[8:], a.attempts)
		binary.LittleEndian.PutUint64(b[12:], uint64(a.due))
		putRef(b[20:], a.aref)
		dst = append(dst, b[:]...)
	}
	return q.appendSnapDedup(dst)
}

// appendSnapDedup appends the version 3 section: the window's pairs,
// oldest first. q.mu is held.
func (q *Queue) appendSnapDedup(dst []byte) []byte {
	w := &q.dedup
	live := w.fifo[w.head:]
	at := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	n := uint32(0)
	for _, e := range live {
		if w.m[e.key] != e {
			continue
		}
		w.mu.Lock()
		failed := e.failed
		w.mu.Unlock()
		if failed {
			continue
		}
		dst = append(dst, uint8(len(e.key.producer)))
		dst = append(dst, e.key.producer...)
		dst = binary.LittleEndian.AppendUint64(dst, e.key.seq)
		dst = binary.LittleEndian.AppendUint64(dst, e.id)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(e.at))
		n++
	}
	binary.LittleEndian.PutUint32(dst[at:], n)
	return dst
}

// snapPair is a dedup pair of a snapshot.
type snapPair struct {
	k  dedupKey
	id uint64
	at int64
}

// decodeSnapDedup decodes the version 3 section and returns the rest of
// p.
func decodeSnapDedup(p []byte, nextID uint64) ([]snapPair, []byte, error) {
	if len(p) < 4 {
		return nil, p, fmt.Errorf("%w: no dedup section", errBadRecord)
	}
	n := uint64(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if n > uint64(len(p)/26) {
		return nil, p, fmt.Errorf("%w: %d dedup pairs in %d bytes", errBadRecord, n, len(p))
	}
	pairs := make([]snapPair, 0, n)
	for range n {
		if len(p) < 1 || p[0] == 0 || int(p[0])+25 > len(p) {
			return nil, p, fmt.Errorf("%w: dedup pair truncated", errBadRecord)
		}
		l := int(p[0])
		k := dedupKey{string(p[1 : 1+l]), binary.LittleEndian.Uint64(p[1+l:])}
		id := binary.LittleEndian.Uint64(p[9+l:])
		at := int64(binary.LittleEndian.Uint64(p[17+l:]))
		p = p[25+l:]
		if k.seq == 0 || id == 0 || id >= nextID {
			return nil, p, fmt.Errorf("%w: bad dedup pair for message %d", errBadRecord, id)
		}
		pairs = append(pairs, snapPair{k, id, at})
	}
	return pairs, p, nil
}

func putRef(b []byte, r Ref) {
	binary.LittleEndian.PutUint32(b, r.Seg)
	binary.LittleEndian.PutUint32(b[4:], r.Off)
	binary.LittleEndian.PutUint32(b[8:], r.Len)
}

func getRef(b []byte) Ref {
	return Ref{Seg: binary.LittleEndian.Uint32(b), Off: binary.LittleEndian.Uint32(b[4:]), Len: binary.LittleEndian.Uint32(b[8:])}
}

// LoadSnapshot starts the rebuild from a snapshot made by
// [Queue.AppendSnapshot]; apply the records written after it next. The
// messages it holds are paged: their bodies and headers are read back
// from the journal, which must be a [Reader], when they are delivered.
// Call it first, at most once; it returns an error, and loads nothing,
// if the snapshot does not decode.
func (r *Rebuilder) LoadSnapshot(b []byte) error {
	if len(b) < snapHeaderSize || [4]byte(b[:4]) != snapMagic || b[4] < 1 || b[4] > snapVersion {
		return fmt.Errorf("load snapshot: %w: bad header", errBadRecord)
	}
	version := b[4]
	nextID := binary.LittleEndian.Uint64(b[8:])
	count := binary.LittleEndian.Uint64(b[16:])
	p := b[snapHeaderSize:]
	if count > uint64(len(p)/snapEntrySize) {
		return fmt.Errorf("load snapshot: %w: %d entries in %d bytes", errBadRecord, count, len(p))
	}
	msgs := make(map[uint64]*recovered, count)
	for range count {
		if len(p) < snapEntrySize {
			return fmt.Errorf("load snapshot: %w: truncated", errBadRecord)
		}
		m := &message{
			id:       binary.LittleEndian.Uint64(p[0:]),
			enqueued: int64(binary.LittleEndian.Uint64(p[8:])),
			due:      int64(binary.LittleEndian.Uint64(p[16:])),
			expires:  int64(binary.LittleEndian.Uint64(p[24:])),
			attempts: binary.LittleEndian.Uint32(p[32:]),
			size:     int(binary.LittleEndian.Uint32(p[36:])),
			ref:      getRef(p[40:]),
			aref:     getRef(p[52:]),
			prio:     p[64],
			paged:    true,
			hidx:     -1,
		}
		n := int(binary.LittleEndian.Uint16(p[66:]))
		tail := p[65]&snapFlagHead == 0
		p = p[snapEntrySize:]
		if n > len(p) || m.prio > MaxPriority || m.id == 0 || m.id >= nextID || msgs[m.id] != nil {
			return fmt.Errorf("load snapshot: %w: bad entry for message %d", errBadRecord, m.id)
		}
		m.key, p = string(p[:n]), p[n:]
		join := m.enqueued
		if m.attempts == 0 {
			join = max(m.enqueued, m.due)
		}
		msgs[m.id] = &recovered{m: m, join: join, tail: tail}
	}
	var sec snapRuns
	if version >= snapVersionRuns {
		var err error
		if sec, p, err = decodeSnapRuns(p, nextID, version == snapVersionRuns); err != nil {
			return fmt.Errorf("load snapshot: %w", err)
		}
	}
	var pairs []snapPair
	if version >= 3 {
		var err error
		if pairs, p, err = decodeSnapDedup(p, nextID); err != nil {
			return fmt.Errorf("load snapshot: %w", err)
		}
	}
	if len(p) != 0 {
		return fmt.Errorf("load snapshot: %w: %d bytes after the entries", errBadRecord, len(p))
	}
	for _, sp := range pairs {
		r.addPair(sp.k, sp.id, sp.at)
	}
	r.runs = sec.runs
	r.runReleased = sec.released
	r.runAttempts = sec.attempts
	for id, a := range sec.attempts {
		r.attemptRefs[a.aref] = id
	}
	// LoadSnapshot comes first: the maps are empty, and a deep queue's
	// would otherwise grow, rehashing, a million entries at a time.
	if len(r.msgs) == 0 {
		r.msgs = msgs
	} else {
		maps.Copy(r.msgs, msgs)
	}
	if len(r.refs) == 0 {
		r.refs = make(map[Ref]uint64, len(msgs))
	}
	for id, x := range msgs {
		r.refs[x.m.ref] = id
		if !x.m.aref.IsZero() {
			r.refs[x.m.aref] = id
		}
	}
	r.NextID = max(r.NextID, nextID)
	r.maxID = max(r.maxID, nextID-1)
	r.fromSnapshot = true
	return nil
}

// snapRuns is the version 2 part of a snapshot.
type snapRuns struct {
	runs     []snapRun
	released map[Ref]struct{}
	attempts map[uint64]runAttempt
}

// snapRun is a run as a snapshot names it.
type snapRun struct {
	run
	prio uint8
}

// decodeSnapRuns decodes the runs, released refs and attempts of a
// version 2 snapshot, and returns the rest of p.
// last says the section ends the snapshot (version 2).
func decodeSnapRuns(p []byte, nextID uint64, last bool) (snapRuns, []byte, error) {
	var s snapRuns
	if len(p) < snapSectionSize {
		return s, p, fmt.Errorf("%w: no run section", errBadRecord)
	}
	nruns := uint64(binary.LittleEndian.Uint32(p))
	nrel := uint64(binary.LittleEndian.Uint32(p[4:]))
	natt := uint64(binary.LittleEndian.Uint32(p[8:]))
	p = p[snapSectionSize:]
	if size := nruns*snapRunSize + nrel*12 + natt*snapAttemptSize; size > uint64(len(p)) || last && size != uint64(len(p)) {
		return s, p, fmt.Errorf("%w: run section of %d bytes", errBadRecord, len(p))
	}
	seen := map[uint32]bool{}
	for range nruns {
		r := snapRun{prio: p[4]}
		r.num = binary.LittleEndian.Uint32(p[0:])
		r.next = binary.LittleEndian.Uint32(p[8:])
		r.count = binary.LittleEndian.Uint32(p[12:])
		r.bytes = int64(binary.LittleEndian.Uint64(p[16:]))
		r.minSeg = binary.LittleEndian.Uint32(p[24:])
		r.maxSeg = binary.LittleEndian.Uint32(p[28:])
		r.minID = binary.LittleEndian.Uint64(p[32:])
		r.maxID = binary.LittleEndian.Uint64(p[40:])
		if r.prio > MaxPriority || r.next > r.count || r.bytes < 0 || r.maxID >= nextID || seen[r.num] {
			return s, p, fmt.Errorf("%w: bad run %d", errBadRecord, r.num)
		}
		seen[r.num] = true
		s.runs = append(s.runs, r)
		p = p[snapRunSize:]
	}
	if nrel > 0 {
		s.released = make(map[Ref]struct{}, nrel)
	}
	for range nrel {
		s.released[getRef(p)] = struct{}{}
		p = p[12:]
	}
	if natt > 0 {
		s.attempts = make(map[uint64]runAttempt, natt)
	}
	for range natt {
		id := binary.LittleEndian.Uint64(p)
		s.attempts[id] = runAttempt{
			attempts: binary.LittleEndian.Uint32(p[8:]),
			due:      int64(binary.LittleEndian.Uint64(p[12:])),
			aref:     getRef(p[20:]),
		}
		p = p[snapAttemptSize:]
	}
	return s, p, nil
}
