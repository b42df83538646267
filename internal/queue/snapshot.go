package queue

import (
	"encoding/binary"
	"fmt"
)

// A snapshot is a queue's index for a checkpoint (store.Log.Checkpoint
// keeps the caller's state): every message's metadata and the refs of
// its records, not bodies or headers, which stay in the journal. A
// restart loads it with [Rebuilder.LoadSnapshot], then applies only the
// records written after the checkpoint, so that its work follows what
// was written since, not the depth of the queue. Little-endian:
//
//	+--------+------+-------+------------+-----------+
//	| "CQSN" | v u8 | 0 0 0 | nextID u64 | count u64 |   24 bytes
//	+--------+------+-------+------------+-----------+
//	count x:
//	+--------+--------------+---------+-------------+--------------+----------+
//	| id u64 | enqueued i64 | due i64 | expires i64 | attempts u32 | size u32 |
//	+--------+--------------+---------+-------------+--------------+----------+
//	| ref: seg u32, off u32, len u32 | aref: seg, off, len | prio u8 | 0 u8 |
//	+--------------------------------+---------------------+---------+------+
//	| keyLen u16 | key |                                       68 bytes + key
//	+------------+-----+

var snapMagic = [4]byte{'C', 'Q', 'S', 'N'}

const (
	snapHeaderSize = 24
	snapEntrySize  = 68
)

// AppendSnapshot appends the queue's snapshot to dst. Call it from the
// snapshot function of store.Log.Checkpoint: it takes the queue's lock,
// under which every record is appended with its change, so the snapshot
// reflects every record before the checkpoint's position (and perhaps
// some after, which replay applies idempotently). Messages in flight are
// included: after a restart they are ready again.
func (q *Queue) AppendSnapshot(dst []byte) []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	dst = append(dst, snapMagic[:]...)
	dst = append(dst, recordVersion, 0, 0, 0)
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
		binary.LittleEndian.PutUint16(e[66:], uint16(len(m.key)))
		dst = append(dst, e[:]...)
		dst = append(dst, m.key...)
	}
	return dst
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
	if len(b) < snapHeaderSize || [4]byte(b[:4]) != snapMagic || b[4] != recordVersion {
		return fmt.Errorf("load snapshot: %w: bad header", errBadRecord)
	}
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
		p = p[snapEntrySize:]
		if n > len(p) || m.prio > MaxPriority || m.id == 0 || m.id >= nextID || msgs[m.id] != nil {
			return fmt.Errorf("load snapshot: %w: bad entry for message %d", errBadRecord, m.id)
		}
		m.key, p = string(p[:n]), p[n:]
		join := m.enqueued
		if m.attempts == 0 {
			join = max(m.enqueued, m.due)
		}
		msgs[m.id] = &recovered{m: m, join: join}
	}
	if len(p) != 0 {
		return fmt.Errorf("load snapshot: %w: %d bytes after the entries", errBadRecord, len(p))
	}
	for id, x := range msgs {
		r.msgs[id] = x
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
