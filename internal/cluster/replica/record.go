package replica

import (
	"encoding/binary"
	"fmt"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/courier-mq/courier/internal/store"
)

// GroupID names a Raft group, the same on every host that holds a replica.
type GroupID uint64

// Record kinds of a host's store.Log.
const (
	// KindReady holds one group's new hard state and entries from one
	// Ready, little-endian:
	//
	//	group u64 | flags u8 | [term u64 | vote u64 | commit u64] | n u32 | entry * n
	//	entry:    term u64 | index u64 | type u8 | len u32 | data
	//
	// flags bit 0 says the hard state is present.
	KindReady store.Kind = 1
	// KindSnap holds a snapshot that replaced the group's log (received
	// from the leader, or the group's bootstrap): group u64 |
	// raftpb.Snapshot (protobuf). Replay forgets the group's entries
	// before it.
	KindSnap store.Kind = 2
	// KindCompact holds a snapshot the group took of its own state
	// machine, as KindSnap; the entries after its index, wherever they
	// are in the log, stay valid.
	KindCompact store.Kind = 3
	// KindSnapPart holds a piece of the data of a snapshot too large for
	// one record, little-endian: group u64 | index u64 | data. The
	// pieces of a snapshot come in order just before its KindSnap or
	// KindCompact record, whose snapshot then has no data of its own.
	KindSnapPart store.Kind = 4
)

const snapPartHeader = 8 + 8

const (
	readyHeader  = 8 + 1 + 4
	hardSize     = 24
	entryHeader  = 8 + 8 + 1 + 4
	flagHard     = 1
	maxEntryType = pb.EntryConfChangeV2
)

// readyRec is a decoded [KindReady] record.
type readyRec struct {
	group   GroupID
	hard    *pb.HardState // nil if absent
	entries []*pb.Entry
}

// encodeReady appends rec's encoding to b.
func encodeReady(b []byte, group GroupID, hs *pb.HardState, ents []*pb.Entry) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(group))
	if hs != nil {
		b = append(b, flagHard)
		b = binary.LittleEndian.AppendUint64(b, hs.GetTerm())
		b = binary.LittleEndian.AppendUint64(b, hs.GetVote())
		b = binary.LittleEndian.AppendUint64(b, hs.GetCommit())
	} else {
		b = append(b, 0)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ents)))
	for _, e := range ents {
		b = binary.LittleEndian.AppendUint64(b, e.GetTerm())
		b = binary.LittleEndian.AppendUint64(b, e.GetIndex())
		b = append(b, byte(e.GetType()))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e.GetData())))
		b = append(b, e.GetData()...)
	}
	return b
}

// decodeReady decodes a [KindReady] payload. The entries' data are
// copies: b may be reused. Its work and memory are bounded by len(b).
func decodeReady(b []byte) (readyRec, error) {
	var r readyRec
	if len(b) < 9 {
		return r, fmt.Errorf("%w: ready record of %d bytes", ErrCorrupt, len(b))
	}
	r.group = GroupID(binary.LittleEndian.Uint64(b))
	flags := b[8]
	b = b[9:]
	if flags&^flagHard != 0 {
		return r, fmt.Errorf("%w: ready flags %#x", ErrCorrupt, flags)
	}
	if flags&flagHard != 0 {
		if len(b) < hardSize {
			return r, fmt.Errorf("%w: short hard state", ErrCorrupt)
		}
		r.hard = &pb.HardState{
			Term:   u64(binary.LittleEndian.Uint64(b)),
			Vote:   u64(binary.LittleEndian.Uint64(b[8:])),
			Commit: u64(binary.LittleEndian.Uint64(b[16:])),
		}
		b = b[hardSize:]
	}
	if len(b) < 4 {
		return r, fmt.Errorf("%w: no entry count", ErrCorrupt)
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(len(b))/entryHeader {
		return r, fmt.Errorf("%w: %d entries in %d bytes", ErrCorrupt, n, len(b))
	}
	r.entries = make([]*pb.Entry, 0, n)
	var prev uint64
	for i := uint32(0); i < n; i++ {
		if len(b) < entryHeader {
			return r, fmt.Errorf("%w: short entry %d", ErrCorrupt, i)
		}
		term := binary.LittleEndian.Uint64(b)
		index := binary.LittleEndian.Uint64(b[8:])
		typ := pb.EntryType(b[16])
		size := binary.LittleEndian.Uint32(b[17:])
		b = b[entryHeader:]
		if typ > maxEntryType {
			return r, fmt.Errorf("%w: entry type %d", ErrCorrupt, typ)
		}
		if uint64(size) > uint64(len(b)) {
			return r, fmt.Errorf("%w: entry of %d bytes, %d left", ErrCorrupt, size, len(b))
		}
		if i > 0 && index != prev+1 {
			return r, fmt.Errorf("%w: entry index %d after %d", ErrCorrupt, index, prev)
		}
		prev = index
		e := &pb.Entry{Term: u64(term), Index: u64(index), Type: &typ}
		if size > 0 {
			e.Data = append([]byte(nil), b[:size]...)
		}
		b = b[size:]
		r.entries = append(r.entries, e)
	}
	if len(b) != 0 {
		return r, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(b))
	}
	return r, nil
}

// encodeSnap returns a [KindSnap] payload.
func encodeSnap(group GroupID, s *pb.Snapshot) ([]byte, error) {
	b := binary.LittleEndian.AppendUint64(nil, uint64(group))
	return proto.MarshalOptions{}.MarshalAppend(b, s)
}

// encodeSnapRecords returns the records of snapshot s of group: the
// [KindSnap] or [KindCompact] payload, and before it, if that would be
// larger than max bytes, the [KindSnapPart] payloads that carry its
// data (the returned payload then holds the snapshot without its data).
func encodeSnapRecords(group GroupID, s *pb.Snapshot, max int) (parts [][]byte, payload []byte, err error) {
	payload, err = encodeSnap(group, s)
	if err != nil || len(payload) <= max {
		return nil, payload, err
	}
	head := proto.Clone(s).(*pb.Snapshot)
	head.Data = nil
	if payload, err = encodeSnap(group, head); err != nil {
		return nil, nil, err
	}
	if len(payload) > max {
		return nil, nil, fmt.Errorf("replica: snapshot metadata of %d bytes: %w", len(payload), ErrTooLarge)
	}
	chunk := max - snapPartHeader
	for data := s.GetData(); len(data) > 0; {
		n := min(chunk, len(data))
		b := make([]byte, 0, snapPartHeader+n)
		b = binary.LittleEndian.AppendUint64(b, uint64(group))
		b = binary.LittleEndian.AppendUint64(b, s.GetMetadata().GetIndex())
		parts = append(parts, append(b, data[:n]...))
		data = data[n:]
	}
	return parts, payload, nil
}

// decodeSnapPart decodes a [KindSnapPart] payload; data aliases b.
func decodeSnapPart(b []byte) (group GroupID, index uint64, data []byte, err error) {
	if len(b) < snapPartHeader {
		return 0, 0, nil, fmt.Errorf("%w: snapshot part of %d bytes", ErrCorrupt, len(b))
	}
	return GroupID(binary.LittleEndian.Uint64(b)), binary.LittleEndian.Uint64(b[8:]), b[snapPartHeader:], nil
}

// decodeSnap decodes a [KindSnap] payload; the snapshot does not alias b.
func decodeSnap(b []byte) (GroupID, *pb.Snapshot, error) {
	if len(b) < 8 {
		return 0, nil, fmt.Errorf("%w: snapshot record of %d bytes", ErrCorrupt, len(b))
	}
	s := &pb.Snapshot{}
	if err := proto.Unmarshal(b[8:], s); err != nil {
		return 0, nil, fmt.Errorf("%w: snapshot: %w", ErrCorrupt, err)
	}
	if s.GetMetadata().GetIndex() == 0 {
		return 0, nil, fmt.Errorf("%w: snapshot without index", ErrCorrupt)
	}
	return GroupID(binary.LittleEndian.Uint64(b)), s, nil
}

// Proposal data: every normal entry proposed through a [Group] starts
// with the proposal's id, by which the proposing host finds its waiter.
const propHeader = 8

func encodeProposal(id uint64, data []byte) []byte {
	b := make([]byte, propHeader, propHeader+len(data))
	binary.LittleEndian.PutUint64(b, id)
	return append(b, data...)
}

func decodeProposal(b []byte) (id uint64, data []byte, ok bool) {
	if len(b) < propHeader {
		return 0, nil, false
	}
	return binary.LittleEndian.Uint64(b), b[propHeader:], true
}

func u64(v uint64) *uint64 { return &v }
