package replica

import (
	"bytes"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/courier-mq/courier/internal/store"
)

// FuzzDecodeReady feeds arbitrary bytes, as read from a damaged disk, to
// the KindReady decoder: it must fail cleanly or decode something that
// encodes back to the same bytes.
func FuzzDecodeReady(f *testing.F) {
	typ := pb.EntryConfChangeV2
	f.Add(encodeReady(nil, 7, &pb.HardState{Term: u64(3), Vote: u64(2), Commit: u64(10)}, []*pb.Entry{
		{Term: u64(3), Index: u64(11), Data: []byte("hello")},
		{Term: u64(3), Index: u64(12), Type: &typ, Data: []byte{1, 2}},
	}))
	f.Add(encodeReady(nil, 1, nil, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeReady(b)
		if err != nil {
			return
		}
		if got := encodeReady(nil, r.group, r.hard, r.entries); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", got, b)
		}
	})
}

// FuzzDecodeSnap does the same for KindSnap and KindCompact records.
func FuzzDecodeSnap(f *testing.F) {
	snap := &pb.Snapshot{Data: []byte("state"), Metadata: &pb.SnapshotMetadata{
		Index: u64(9), Term: u64(2), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}},
	}}
	b, err := encodeSnap(7, snap)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, s, err := decodeSnap(b)
		if err != nil {
			return
		}
		again, err := encodeSnap(id, s)
		if err != nil {
			t.Fatal(err)
		}
		_, s2, err := decodeSnap(again)
		if err != nil || !proto.Equal(s, s2) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// FuzzJournalApply feeds arbitrary entry data, as a hostile leader could
// replicate it, to a queue journal's state machine: it must fail cleanly
// or apply, and its snapshot must restore to the same state.
func FuzzJournalApply(f *testing.F) {
	f.Add([]byte{opAppend, 1, 0, 0, 0, 0, 0, 0, 0, 1, 'h', 'i'})
	f.Add([]byte{opRelease, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{opRelease, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Fuzz(func(t *testing.T, b []byte) {
		s := NewJournalState()
		if err := s.Apply(Entry{Index: 1, Term: 1, Data: b}); err != nil {
			return
		}
		snap, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		r := NewJournalState()
		if err := r.Restore(snap); err != nil {
			t.Fatal(err)
		}
		if r.Live() != s.Live() || r.maxSeq != s.maxSeq {
			t.Fatalf("restored %d live (max %d), had %d (max %d)", r.Live(), r.maxSeq, s.Live(), s.maxSeq)
		}
	})
}

// FuzzDecodeCheckpointState feeds arbitrary bytes, as read from a
// damaged checkpoint file, to the host's checkpoint state decoder.
func FuzzDecodeCheckpointState(f *testing.F) {
	f.Add(encodeCheckpointState([]store.Ref{{Pos: store.Pos{Seg: 1, Off: 16}, Len: 40}, {Pos: store.Pos{Seg: 3, Off: 100}, Len: 7}}))
	f.Add(encodeCheckpointState(nil))
	f.Add([]byte{1, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Fuzz(func(t *testing.T, b []byte) {
		refs, err := decodeCheckpointState(b)
		if err != nil {
			return
		}
		if got := encodeCheckpointState(refs); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", got, b)
		}
	})
}

// FuzzJournalRestore feeds arbitrary snapshot data, as a hostile leader
// could send it, to a queue journal's state machine: it must fail
// cleanly or restore a state whose snapshot restores to the same.
func FuzzJournalRestore(f *testing.F) {
	s := NewJournalState()
	_ = s.Apply(Entry{Index: 1, Term: 1, Data: []byte{opAppend, 1, 0, 0, 0, 0, 0, 0, 0, 1, 'h', 'i'}})
	snap, _ := s.Snapshot()
	f.Add(snap)
	f.Add([]byte(`{"max":3,"live":{"3":{"k":1,"p":"aGk="}}}`))
	f.Add([]byte{journalSnapVersion, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Fuzz(func(t *testing.T, b []byte) {
		s := NewJournalState()
		if err := s.Restore(b); err != nil {
			return
		}
		snap, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		r := NewJournalState()
		if err := r.Restore(snap); err != nil {
			t.Fatal(err)
		}
		if r.Live() != s.Live() || r.maxSeq != s.maxSeq {
			t.Fatalf("restored %d live (max %d), had %d (max %d)", r.Live(), r.maxSeq, s.Live(), s.maxSeq)
		}
	})
}

// FuzzDecodeSnapPart feeds arbitrary bytes, as read from a damaged disk,
// to the KindSnapPart decoder, and checks the pieces of a snapshot
// rebuild it.
func FuzzDecodeSnapPart(f *testing.F) {
	snap := &pb.Snapshot{Data: bytes.Repeat([]byte("state"), 100), Metadata: &pb.SnapshotMetadata{Index: u64(9), Term: u64(2)}}
	parts, _, err := encodeSnapRecords(7, snap, 200)
	if err != nil || len(parts) < 2 {
		f.Fatalf("%d parts, %v", len(parts), err)
	}
	for _, p := range parts {
		f.Add(p)
	}
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		group, index, data, err := decodeSnapPart(b)
		if err != nil || index == 0 {
			return // a snapshot has an index
		}
		s := &pb.Snapshot{Data: data, Metadata: &pb.SnapshotMetadata{Index: u64(index), Term: u64(1)}}
		parts, head, err := encodeSnapRecords(group, s, 64)
		if err != nil {
			return // metadata alone too large for 64 bytes
		}
		var joined []byte
		for _, p := range parts {
			g, i, d, err := decodeSnapPart(p)
			if err != nil || g != group || i != index {
				t.Fatalf("part: %v %d %d", err, g, i)
			}
			joined = append(joined, d...)
		}
		if _, h, err := decodeSnap(head); err != nil || (len(parts) > 0 && len(h.GetData()) != 0) {
			t.Fatalf("head: %v", err)
		}
		if len(parts) > 0 && !bytes.Equal(joined, data) {
			t.Fatal("pieces do not rebuild the data")
		}
	})
}
