package replica

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/courier-mq/courier/internal/queue"
)

// A replicated queue journal: a [queue.Journal] whose records are the
// entries of one Raft group. The queue runs on the group's leader, with
// today's queue code unchanged; every replica applies the records to a
// [JournalState]; a new leader rebuilds the queue from its state with
// [queue.Recover] (see docs/replication.md, "Queue journal").
//
// Entry layout, little-endian:
//
//	append:  op u8 (1) | seq u64 | kind u8 | payload
//	release: op u8 (2) | n u32 | seq u64 * n
//
// A record's [queue.Ref] is its sequence number, assigned by the leader
// in append order, the same on every replica: Seg is its high 32 bits,
// Off its low 32 bits, Len the payload's length.
const (
	opAppend  = 1
	opRelease = 2
)

// JournalState is a queue journal's replicated state, one per replica:
// the live records. It is the group's [StateMachine].
type JournalState struct {
	mu     sync.Mutex
	live   map[uint64]journalRec
	maxSeq uint64
}

type journalRec struct {
	Kind    queue.Kind `json:"k"`
	Payload []byte     `json:"p"`
}

// NewJournalState returns an empty state.
func NewJournalState() *JournalState { return &JournalState{live: map[uint64]journalRec{}} }

// Apply implements [StateMachine].
func (s *JournalState) Apply(e Entry) error {
	b := e.Data
	if len(b) < 1 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch b[0] {
	case opAppend:
		if len(b) < 10 {
			return fmt.Errorf("%w: journal append of %d bytes", ErrCorrupt, len(b))
		}
		seq := binary.LittleEndian.Uint64(b[1:])
		s.live[seq] = journalRec{Kind: queue.Kind(b[9]), Payload: slices.Clone(b[10:])}
		s.maxSeq = max(s.maxSeq, seq)
	case opRelease:
		if len(b) < 5 {
			return fmt.Errorf("%w: journal release of %d bytes", ErrCorrupt, len(b))
		}
		n := binary.LittleEndian.Uint32(b[1:])
		b = b[5:]
		if uint64(len(b)) != 8*uint64(n) {
			return fmt.Errorf("%w: journal release of %d refs in %d bytes", ErrCorrupt, n, len(b))
		}
		for ; len(b) > 0; b = b[8:] {
			delete(s.live, binary.LittleEndian.Uint64(b))
		}
	default:
		return fmt.Errorf("%w: journal op %d", ErrCorrupt, b[0])
	}
	return nil
}

// journalSnap is the JSON snapshot of the first version, still read.
type journalSnap struct {
	MaxSeq uint64                `json:"max"`
	Live   map[uint64]journalRec `json:"live"`
}

// The snapshot of a journal, little-endian: the live records, by
// sequence number, with their bodies.
//
//	version u8 (2) | max seq u64 | n u32 | (seq u64 | kind u8 | len u32 | payload) * n
//
// Version 1 was JSON ({"max":..,"live":{..}}), read by Restore still.
const (
	journalSnapVersion = 2
	journalSnapHeader  = 1 + 8 + 4
	journalSnapRec     = 8 + 1 + 4
)

// Snapshot implements [StateMachine]: the live records, bodies
// included (see docs/replication.md, "Compaction", for the trade-off).
func (s *JournalState) Snapshot() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	size := journalSnapHeader
	for _, r := range s.live {
		size += journalSnapRec + len(r.Payload)
	}
	b := make([]byte, 0, size)
	b = append(b, journalSnapVersion)
	b = binary.LittleEndian.AppendUint64(b, s.maxSeq)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.live)))
	for _, seq := range slices.Sorted(maps.Keys(s.live)) {
		r := s.live[seq]
		b = binary.LittleEndian.AppendUint64(b, seq)
		b = append(b, byte(r.Kind))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Payload)))
		b = append(b, r.Payload...)
	}
	return b, nil
}

// Restore implements [StateMachine].
func (s *JournalState) Restore(data []byte) error {
	var js journalSnap
	var err error
	if len(data) > 0 && data[0] == '{' {
		if err = json.Unmarshal(data, &js); err != nil {
			err = fmt.Errorf("%w: journal snapshot: %w", ErrCorrupt, err)
		}
	} else {
		js, err = decodeJournalSnap(data)
	}
	if err != nil {
		return err
	}
	if js.Live == nil {
		js.Live = map[uint64]journalRec{}
	}
	for seq := range js.Live {
		js.MaxSeq = max(js.MaxSeq, seq) // new sequence numbers come after every live one
	}
	s.mu.Lock()
	s.live, s.maxSeq = js.Live, js.MaxSeq
	s.mu.Unlock()
	return nil
}

// decodeJournalSnap decodes a binary journal snapshot; the records do
// not alias b. Its work and memory are bounded by len(b).
func decodeJournalSnap(b []byte) (journalSnap, error) {
	js := journalSnap{Live: map[uint64]journalRec{}}
	if len(b) < journalSnapHeader || b[0] != journalSnapVersion {
		return js, fmt.Errorf("%w: journal snapshot of %d bytes", ErrCorrupt, len(b))
	}
	js.MaxSeq = binary.LittleEndian.Uint64(b[1:])
	n := binary.LittleEndian.Uint32(b[9:])
	b = b[journalSnapHeader:]
	if uint64(n) > uint64(len(b))/journalSnapRec {
		return js, fmt.Errorf("%w: journal snapshot of %d records in %d bytes", ErrCorrupt, n, len(b))
	}
	for i := uint32(0); i < n; i++ {
		if len(b) < journalSnapRec {
			return js, fmt.Errorf("%w: short journal record %d", ErrCorrupt, i)
		}
		seq := binary.LittleEndian.Uint64(b)
		kind := queue.Kind(b[8])
		size := binary.LittleEndian.Uint32(b[9:])
		b = b[journalSnapRec:]
		if uint64(size) > uint64(len(b)) {
			return js, fmt.Errorf("%w: journal record of %d bytes, %d left", ErrCorrupt, size, len(b))
		}
		if _, dup := js.Live[seq]; dup {
			return js, fmt.Errorf("%w: journal record %d repeated", ErrCorrupt, seq)
		}
		js.Live[seq] = journalRec{Kind: kind, Payload: slices.Clone(b[:size])}
		b = b[size:]
	}
	if len(b) != 0 {
		return js, fmt.Errorf("%w: %d trailing bytes in journal snapshot", ErrCorrupt, len(b))
	}
	return js, nil
}

// Live returns the number of live records.
func (s *JournalState) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live)
}

// Replay hands the live records to fn in log order, as [queue.Recover]
// wants them.
func (s *JournalState) Replay(fn func(queue.Entry) error) error {
	s.mu.Lock()
	seqs := slices.Sorted(maps.Keys(s.live))
	recs := make([]journalRec, len(seqs))
	for i, seq := range seqs {
		recs[i] = s.live[seq]
	}
	s.mu.Unlock()
	for i, seq := range seqs {
		if err := fn(queue.Entry{Ref: seqRef(seq, len(recs[i].Payload)), Kind: recs[i].Kind, Payload: recs[i].Payload}); err != nil {
			return err
		}
	}
	return nil
}

// Read implements [queue.Reader].
func (s *JournalState) Read(ref queue.Ref) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.live[refSeq(ref)]
	if !ok {
		return nil, fmt.Errorf("replica: journal record %v is not live", ref)
	}
	return r.Payload, nil
}

func seqRef(seq uint64, n int) queue.Ref {
	return queue.Ref{Seg: uint32(seq >> 32), Off: uint32(seq), Len: uint32(n)}
}

func refSeq(r queue.Ref) uint64 { return uint64(r.Seg)<<32 | uint64(r.Off) }

// Journal is the [queue.Journal] of a queue on its group's leader.
// Append's done is called once the record is committed: durable on a
// majority of the replicas. Release is a replicated release record.
type Journal struct {
	g  *Group
	st *JournalState

	mu   sync.Mutex
	next uint64
}

// Journal is not a [queue.Reader] nor a [queue.Spiller]: the queue
// keeps its bodies in memory (no paging of replicated queues yet).
var _ queue.Journal = (*Journal)(nil)

// NewJournal returns the journal of group g, whose state machine is st,
// on the leader. Call it after [Group.WaitLeaderReady], then
// queue.Recover(name, cfg, st.Replay) with it as cfg.Journal.
func NewJournal(g *Group, st *JournalState) *Journal {
	st.mu.Lock()
	next := st.maxSeq + 1
	st.mu.Unlock()
	return &Journal{g: g, st: st, next: next}
}

// Append implements [queue.Journal].
func (j *Journal) Append(kind queue.Kind, payload []byte, done func(error)) (queue.Ref, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	seq := j.next
	j.next++
	b := make([]byte, 10, 10+len(payload))
	b[0] = opAppend
	binary.LittleEndian.PutUint64(b[1:], seq)
	b[9] = byte(kind)
	b = append(b, payload...)
	j.g.ProposeAsync(b, func(_ uint64, err error) {
		if done != nil {
			done(err)
		}
	})
	return seqRef(seq, len(payload)), nil
}

// Release implements [queue.Journal].
func (j *Journal) Release(refs []queue.Ref, done func(error)) error {
	b := make([]byte, 5, 5+8*len(refs))
	b[0] = opRelease
	binary.LittleEndian.PutUint32(b[1:], uint32(len(refs)))
	for _, r := range refs {
		b = binary.LittleEndian.AppendUint64(b, refSeq(r))
	}
	j.mu.Lock()
	defer j.mu.Unlock() // in order with the appends
	j.g.ProposeAsync(b, func(_ uint64, err error) {
		if done != nil {
			done(err)
		}
	})
	return nil
}
