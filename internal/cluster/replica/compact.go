package replica

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/internal/store"
)

// Log compaction: a group's snapshot is its checkpoint.
//
// The host tracks, per group, every record of its log that is still
// needed to rebuild the group (its "live" records, in log order). Once a
// snapshot record (KindCompact, or a KindSnap received from the leader)
// is durable, the records it makes useless are released from the store
// ([store.Log.Release]): older snapshots, entries at or before the
// snapshot's index, and hard states that a later record replaced. The
// store deletes a segment once every record in it is released and a
// checkpoint ([store.Log.Checkpoint]) lies past it. The host's
// checkpoint state is the list of every group's live records; a restart
// reads those records back, one read each, then replays what the log
// holds after the checkpoint: snapshot plus tail, not the whole history.
//
// Records are released as a prefix of the group's list only: a record
// is kept while an earlier one is, so that the records left, replayed in
// log order, rebuild exactly the log the group had (a kept stale entry
// is always followed by the record that overwrote it).

// liveRec is one record of a group's log that the host still tracks.
type liveRec struct {
	ref  store.Ref
	kind store.Kind
	last uint64 // KindReady: its last entry's index, 0 without entries; a snapshot: its index
	hard bool   // KindReady: it holds a hard state
}

func (r liveRec) snapshot() bool { return r.kind == KindSnap || r.kind == KindCompact }

// recSet is a group's live records, in log order. Guarded by
// Host.recMu, except durable.
type recSet struct {
	recs []liveRec
	// durable is the position key (seg<<32 | off) of the last record of
	// the group known durable: every record at or before it is.
	durable atomic.Uint64
}

func posKey(p store.Pos) uint64 { return uint64(p.Seg)<<32 | uint64(p.Off) }

// markDurable notes that every record of the set up to p is durable.
func (s *recSet) markDurable(p store.Pos) {
	k := posKey(p)
	for {
		old := s.durable.Load()
		if old >= k || s.durable.CompareAndSwap(old, k) {
			return
		}
	}
}

// dead returns the records of s that are dead, in order: made useless
// by the latest durable snapshot record and the latest durable hard
// state. They are
//
//   - a prefix of the set, up to the latest durable snapshot (excluded):
//     older snapshots, entries at or before the snapshot's index (any
//     entries, if the snapshot replaced the log), hard states replaced
//     by a later one; the prefix stops at the first record still needed;
//   - after that prefix, records that never matter to entries: records
//     of a hard state alone that a later one replaced, and compaction
//     snapshots older than the latest durable snapshot. (A KindSnap
//     record stays: replay forgets the entries before it.)
func (s *recSet) dead() []bool {
	durable := s.durable.Load()
	p, lastHard := -1, -1
	for i := len(s.recs) - 1; i >= 0 && (p < 0 || lastHard < 0); i-- {
		r := s.recs[i]
		if posKey(r.ref.Pos) > durable {
			continue
		}
		if p < 0 && r.snapshot() {
			p = i
		}
		if lastHard < 0 && r.hard {
			lastHard = i
		}
	}
	var dead []bool
	mark := func(i int) {
		if dead == nil {
			dead = make([]bool, len(s.recs))
		}
		dead[i] = true
	}
	n := 0
	if p > 0 {
		snapIdx, replaced := s.recs[p].last, s.recs[p].kind == KindSnap
		for ; n < p; n++ {
			r := s.recs[n]
			if r.kind == KindSnapPart && r.last == snapIdx {
				continue // the latest snapshot's data
			}
			if r.hard && n >= lastHard {
				break // the latest durable hard state stays
			}
			if r.kind == KindReady && !replaced && r.last > snapIdx {
				break // entries after the snapshot
			}
			mark(n)
		}
	}
	for i := n; i < len(s.recs); i++ {
		r := s.recs[i]
		switch {
		case r.kind == KindReady && r.last == 0 && i < lastHard:
			mark(i)
		case r.kind == KindCompact && i < p:
			mark(i)
		case r.kind == KindSnapPart && i < p && r.last != s.recs[p].last:
			mark(i) // the data of an older snapshot, or of one never completed
		}
	}
	return dead
}

// track adds a record appended for group id to its set. h.recMu is held.
func (h *Host) trackLocked(id GroupID, r liveRec) *recSet {
	s := h.tracked[id]
	if s == nil {
		s = &recSet{}
		h.tracked[id] = s
	}
	s.recs = append(s.recs, r)
	return s
}

// releaseDead releases the dead records of group id from the store.
func (h *Host) releaseDead(id GroupID) {
	h.recMu.Lock()
	defer h.recMu.Unlock()
	s := h.tracked[id]
	if s == nil {
		return
	}
	dead := s.dead()
	if dead == nil {
		return
	}
	var refs []store.Ref
	for i, r := range s.recs {
		if dead[i] {
			refs = append(refs, r.ref)
		}
	}
	if err := h.log.Release(uint32(id), refs, nil); err != nil {
		return // the log failed or closed; the host stops on its next append
	}
	keep := s.recs[:0]
	for i, r := range s.recs {
		if !dead[i] {
			keep = append(keep, r)
		}
	}
	clear(s.recs[len(keep):])
	s.recs = keep
	n := len(refs)
	h.released.Add(uint64(n))
}

// Checkpoint state, little-endian: every tracked record's ref, sorted.
//
//	version u8 (1) | n u32 | (seg u32 | off u32 | len u32) * n
const (
	ckptVersion = 1
	ckptRefSize = 12
)

func encodeCheckpointState(refs []store.Ref) []byte {
	b := make([]byte, 0, 5+ckptRefSize*len(refs))
	b = append(b, ckptVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(refs)))
	for _, r := range refs {
		b = binary.LittleEndian.AppendUint32(b, r.Seg)
		b = binary.LittleEndian.AppendUint32(b, r.Off)
		b = binary.LittleEndian.AppendUint32(b, r.Len)
	}
	return b
}

// decodeCheckpointState decodes a host's checkpoint state. Its work and
// memory are bounded by len(b).
func decodeCheckpointState(b []byte) ([]store.Ref, error) {
	if len(b) < 5 {
		return nil, fmt.Errorf("%w: checkpoint state of %d bytes", ErrCorrupt, len(b))
	}
	if b[0] != ckptVersion {
		return nil, fmt.Errorf("%w: checkpoint state version %d", ErrCorrupt, b[0])
	}
	n := binary.LittleEndian.Uint32(b[1:])
	b = b[5:]
	if uint64(len(b)) != uint64(n)*ckptRefSize {
		return nil, fmt.Errorf("%w: %d refs in %d bytes", ErrCorrupt, n, len(b))
	}
	refs := make([]store.Ref, n)
	for i := range refs {
		refs[i] = store.Ref{
			Pos: store.Pos{Seg: binary.LittleEndian.Uint32(b), Off: binary.LittleEndian.Uint32(b[4:])},
			Len: binary.LittleEndian.Uint32(b[8:]),
		}
		b = b[ckptRefSize:]
	}
	return refs, nil
}

// liveRefs returns every tracked record's ref, in log order.
func (h *Host) liveRefs() []store.Ref {
	h.recMu.Lock()
	var refs []store.Ref
	for _, s := range h.tracked {
		for _, r := range s.recs {
			refs = append(refs, r.ref)
		}
	}
	h.recMu.Unlock()
	slices.SortFunc(refs, func(a, b store.Ref) int { return cmp.Compare(posKey(a.Pos), posKey(b.Pos)) })
	return refs
}

// checkpoint writes a store checkpoint whose state is the live records.
// Records appended after the cut may be listed too: restart skips those
// and replays them with the tail.
func (h *Host) checkpoint() error {
	_, err := h.log.Checkpoint(func(store.Pos) ([]byte, error) {
		return encodeCheckpointState(h.liveRefs()), nil
	})
	if err == nil {
		h.checkpoints.Add(1)
	}
	return err
}

// checkpointLoop checkpoints the log whenever CheckpointBytes were
// appended since the last checkpoint, or every CheckpointInterval if
// anything was; Close writes a last one.
func (h *Host) checkpointLoop() {
	defer close(h.ckptDone)
	t := time.NewTicker(h.cfg.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-h.ckptKick:
			if h.sinceCkpt.Load() < uint64(h.cfg.CheckpointBytes) {
				continue
			}
		case <-t.C:
			if h.sinceCkpt.Load() == 0 {
				continue
			}
		}
		h.sinceCkpt.Store(0)
		if err := h.checkpoint(); err != nil {
			h.cfg.Logger.Warn("replica: checkpoint failed", "err", err)
		}
	}
}

// noteAppended counts bytes appended towards the next checkpoint.
func (h *Host) noteAppended(n int) {
	if h.sinceCkpt.Add(uint64(n)) >= uint64(h.cfg.CheckpointBytes) {
		select {
		case h.ckptKick <- struct{}{}:
		default:
		}
	}
}
