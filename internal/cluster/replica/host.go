package replica

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/courier-mq/courier/internal/store"
)

// Config configures a [Host].
type Config struct {
	// ID is this host's replica id in every group, nonzero and unique in
	// the cluster.
	ID uint64
	// Transport carries messages to the other hosts.
	Transport Transport
	// TickInterval is the Raft tick. Default: 100ms.
	TickInterval time.Duration
	// ElectionTicks is the election timeout in ticks (randomized by Raft
	// between it and twice it). Default: 10.
	ElectionTicks int
	// HeartbeatTicks is the leader's heartbeat interval in ticks.
	// Default: 1.
	HeartbeatTicks int
	// SnapshotEntries is how many entries a group applies between
	// snapshots of its state machine; a snapshot lets the group forget
	// the entries before it in memory, and a replica too far behind gets
	// the snapshot instead of those entries. Default: 10,000.
	SnapshotEntries uint64
	// SnapshotBytes makes a group snapshot once its applied entries
	// since the last snapshot add up to this many bytes, even before
	// SnapshotEntries. Either way a group snapshots only once the bytes
	// applied since its last snapshot are at least that snapshot's size:
	// rewriting the state costs at most one write per byte appended.
	// Default: 64 MiB.
	SnapshotBytes int64
	// CheckpointBytes makes the host checkpoint its log once this many
	// bytes were appended since the last checkpoint; CheckpointInterval
	// makes it checkpoint that often if anything was appended. A restart
	// replays what was appended since the last checkpoint, and the store
	// deletes a dead segment only once a checkpoint lies past it.
	// Defaults: 64 MiB, 10 s.
	CheckpointBytes    int64
	CheckpointInterval time.Duration
	// MaxEntrySize is the largest proposal accepted. Default: 1 MiB.
	MaxEntrySize int
	// Store configures the host's log (see [store.Options]).
	Store store.Options
	// Logger receives rare events. Default: discard.
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.TickInterval <= 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks <= 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks <= 0 {
		c.HeartbeatTicks = 1
	}
	if c.SnapshotEntries == 0 {
		c.SnapshotEntries = 10_000
	}
	if c.SnapshotBytes <= 0 {
		c.SnapshotBytes = 64 << 20
	}
	if c.CheckpointBytes <= 0 {
		c.CheckpointBytes = 64 << 20
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = 10 * time.Second
	}
	if c.MaxEntrySize <= 0 {
		c.MaxEntrySize = 1 << 20
	}
	if c.Store.MaxRecordSize == 0 {
		// As the store does, made explicit: a Ready is split to fit.
		seg := c.Store.SegmentSize
		if seg == 0 {
			seg = store.DefaultOptions().SegmentSize
		}
		c.Store.MaxRecordSize = int(min(int64(store.DefaultOptions().MaxRecordSize), seg-32))
	}
	// One entry must fit in a record with every header.
	c.MaxEntrySize = min(c.MaxEntrySize, c.Store.MaxRecordSize-readyHeader-hardSize-entryHeader-propHeader)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// maxInbox bounds the messages waiting for the driver; beyond it,
// arriving messages are dropped (Raft resends).
const maxInbox = 65536

// Host runs the Raft groups of one node (see the package doc).
type Host struct {
	cfg  Config
	log  *store.Log
	rlog raft.Logger

	mu        sync.Mutex
	inbox     []Envelope
	reqs      []func()
	recovered map[GroupID]*recovered
	opened    map[GroupID]*Group
	closed    bool
	err       error

	live map[GroupID]*Group // the driver's
	// Quiescence (quiesce.go), the driver's.
	awake       map[GroupID]*Group    // groups that tick
	dirty       map[GroupID]*Group    // groups that may have a Ready
	extra       map[uint64][]Envelope // messages to send besides Readies': quiesce and host heartbeats
	heard       map[uint64]time.Time  // when each peer host was last heard
	down        map[uint64]bool       // peer hosts not heard for an election timeout
	incarn      map[uint64]uint64     // each peer host's incarnation, from its heartbeats
	incarnation uint64                // this host's, random at each start
	restarts    uint64                // peer restarts seen
	peerSet     map[uint64]bool       // the hosts of every replica, cached
	peersStale  bool                  // peerSet must be recomputed
	hbTicks     int                   // ticks since the last host heartbeat
	quiesced    uint64                // times a group fell quiet
	wakeups     uint64                // times a quiet group woke
	wake        chan struct{}
	stop        chan struct{}
	done        chan struct{}
	propID      atomic.Uint64

	rounds atomic.Uint64 // persist rounds, for tests and stats

	// Log compaction (compact.go).
	recMu       sync.Mutex // guards tracked and every recSet's recs; held across an Append or Release and its tracking
	tracked     map[GroupID]*recSet
	released    atomic.Uint64 // records released, for tests and stats
	checkpoints atomic.Uint64 // checkpoints written, for tests and stats
	sinceCkpt   atomic.Uint64 // bytes appended since the last checkpoint
	ckptKick    chan struct{}
	ckptDone    chan struct{}
}

// recovered is a group's state rebuilt from the log by [NewHost].
type recovered struct {
	ms      *raft.MemoryStorage
	damaged string // why, if damaged
}

// NewHost opens (creating if needed) the host's log in dir on fs,
// rebuilds every group's Raft log from it, and starts the driver.
// Groups come back when [Host.Group] is called with their id.
func NewHost(fs store.FS, dir string, cfg Config) (*Host, error) {
	cfg.defaults()
	if cfg.ID == 0 || cfg.Transport == nil {
		return nil, fmt.Errorf("replica: config needs an ID and a Transport")
	}
	l, rec, err := store.Open(fs, dir, cfg.Store)
	if err != nil {
		return nil, fmt.Errorf("replica: open store: %w", err)
	}
	h := &Host{
		cfg:       cfg,
		log:       l,
		rlog:      quietLogger{},
		recovered: map[GroupID]*recovered{},
		opened:    map[GroupID]*Group{},
		live:      map[GroupID]*Group{},
		awake:     map[GroupID]*Group{},
		dirty:     map[GroupID]*Group{},
		extra:     map[uint64][]Envelope{},
		heard:     map[uint64]time.Time{},
		down:      map[uint64]bool{},
		incarn:    map[uint64]uint64{},
		tracked:   map[GroupID]*recSet{},
		ckptKick:  make(chan struct{}, 1),
		ckptDone:  make(chan struct{}),
		wake:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	h.propID.Store(rand.Uint64())
	h.incarnation = rand.Uint64() | 1
	if err := h.recover(rec); err != nil {
		_ = l.Close()
		return nil, err
	}
	cfg.Transport.Listen(h.receive)
	go h.run()
	go h.checkpointLoop()
	return h, nil
}

// ID returns the host's replica id.
func (h *Host) ID() uint64 { return h.cfg.ID }

// Close stops every group, checkpoints the log (so that the next start
// replays little) and closes it.
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	groups := h.opened
	h.mu.Unlock()
	close(h.stop)
	<-h.done
	<-h.ckptDone
	for _, g := range groups {
		g.close(ErrClosed)
	}
	if h.Err() == nil {
		if err := h.checkpoint(); err != nil {
			h.cfg.Logger.Warn("replica: checkpoint at close failed", "err", err)
		}
	}
	return h.log.Close()
}

// Err returns the error that stopped the host, if any.
func (h *Host) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Group opens group id on this host with state machine sm. If the log
// holds the group, it comes back from it and peers is ignored; else, if
// peers is not empty, the group is created with them as its voters
// (every initial replica must be created with the same peers); else this
// replica joins an existing group and waits for its leader to send it
// the log (after the leader's [Group.AddVoter] or [Group.AddLearner]).
//
// Group id 0 is reserved (the host's own heartbeats use it).
func (h *Host) Group(id GroupID, peers []uint64, sm StateMachine) (*Group, error) {
	if id == hostGroup {
		return nil, fmt.Errorf("replica: group id 0 is reserved")
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	if h.opened[id] != nil {
		h.mu.Unlock()
		return nil, fmt.Errorf("%w: %d", ErrGroupExists, id)
	}
	rec := h.recovered[id]
	delete(h.recovered, id)
	h.mu.Unlock()

	g := newGroup(h, id, sm)
	switch {
	case rec != nil:
		g.ms = rec.ms
		g.damaged = rec.damaged
		g.openDamage = rec.damaged
	case len(peers) > 0:
		if err := h.bootstrap(g, peers); err != nil {
			return nil, err
		}
	default:
		g.ms = raft.NewMemoryStorage()
	}
	if err := g.start(); err != nil {
		return nil, err
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		g.close(ErrClosed)
		return nil, ErrClosed
	}
	h.opened[id] = g
	h.mu.Unlock()
	// Not waited for: every later call of the group reaches the driver
	// after this one, and a host opening thousands of groups at restart
	// does not wait for a driver round (and its fsync) per group.
	if err := h.submit(func() {
		h.live[id] = g
		h.peersStale = true
		g.wakeUp()
	}); err != nil {
		g.close(err)
		return nil, err
	}
	if g.damaged != "" {
		h.cfg.Logger.Warn("replica: group recovered damaged; it will not vote", "group", id, "why", g.damaged)
	}
	return g, nil
}

// bootstrap creates group g's initial state, durably: a snapshot at
// index 1, term 1, whose configuration has peers as voters.
func (h *Host) bootstrap(g *Group, peers []uint64) error {
	snap := &pb.Snapshot{Metadata: &pb.SnapshotMetadata{
		Index:     u64(1),
		Term:      u64(1),
		ConfState: &pb.ConfState{Voters: append([]uint64(nil), peers...)},
	}}
	hs := &pb.HardState{Term: u64(1), Commit: u64(1)}
	g.ms = raft.NewMemoryStorage()
	if err := g.ms.ApplySnapshot(snap); err != nil {
		return fmt.Errorf("replica: bootstrap: %w", err)
	}
	if err := g.ms.SetHardState(hs); err != nil {
		return fmt.Errorf("replica: bootstrap: %w", err)
	}
	payload, err := encodeSnap(g.id, snap)
	if err != nil {
		return fmt.Errorf("replica: bootstrap: %w", err)
	}
	// One sync for both records: they are appended together, and the
	// store confirms in log order.
	errc := make(chan error, 2)
	h.recMu.Lock()
	for _, r := range []struct {
		kind    store.Kind
		payload []byte
		rec     liveRec
	}{
		{KindSnap, payload, liveRec{kind: KindSnap, last: 1}},
		{KindReady, encodeReady(nil, g.id, hs, nil), liveRec{kind: KindReady, hard: true}},
	} {
		ref, err := h.log.Append(uint32(g.id), r.kind, r.payload, func(err error) { errc <- err })
		if err != nil {
			h.recMu.Unlock()
			return fmt.Errorf("replica: bootstrap: %w", err)
		}
		r.rec.ref = ref
		h.trackLocked(g.id, r.rec).markDurable(ref.Pos) // nothing uses the group before both are durable
	}
	h.recMu.Unlock()
	for range 2 {
		if err := <-errc; err != nil {
			return fmt.Errorf("replica: bootstrap: %w", err)
		}
	}
	return nil
}

// receive queues a batch that arrived for the driver.
func (h *Host) receive(batch []Envelope) {
	h.mu.Lock()
	if h.closed || len(h.inbox)+len(batch) > maxInbox {
		h.mu.Unlock()
		return
	}
	h.inbox = append(h.inbox, batch...)
	h.mu.Unlock()
	h.poke()
}

func (h *Host) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// submit queues fn to run on the driver goroutine.
func (h *Host) submit(fn func()) error {
	h.mu.Lock()
	if h.closed || h.err != nil {
		err := h.err
		h.mu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		return err
	}
	h.reqs = append(h.reqs, fn)
	h.mu.Unlock()
	h.poke()
	return nil
}

// call runs fn on the driver goroutine and waits for it.
func (h *Host) call(fn func()) error {
	ran := make(chan struct{})
	if err := h.submit(func() { fn(); close(ran) }); err != nil {
		return err
	}
	select {
	case <-ran:
		return nil
	case <-h.done:
		select {
		case <-ran:
			return nil
		default:
		}
		if err := h.Err(); err != nil {
			return err
		}
		return ErrClosed
	}
}

// run is the driver: it ticks, steps, and handles Readies of every group.
func (h *Host) run() {
	defer close(h.done)
	ticker := time.NewTicker(h.cfg.TickInterval)
	defer ticker.Stop()
	for {
		tick := false
		select {
		case <-h.stop:
			return
		case <-ticker.C:
			tick = true
		case <-h.wake:
		}
		h.mu.Lock()
		inbox, reqs := h.inbox, h.reqs
		h.inbox, h.reqs = nil, nil
		h.mu.Unlock()
		for _, fn := range reqs {
			fn()
		}
		now := time.Now()
		for _, e := range inbox {
			h.hearFrom(e.Msg.GetFrom(), now)
			if e.Group == hostGroup {
				h.hearHost(e.Msg.GetFrom(), e.Msg.GetCommit())
			} else if g := h.live[e.Group]; g != nil {
				g.step(e.Msg)
			}
		}
		if tick {
			h.tickGroups()
			h.tickHosts(now)
		}
		if err := h.handleReady(); err != nil {
			h.fail(err)
			return
		}
		for to, batch := range h.extra {
			h.cfg.Transport.Send(to, batch)
			delete(h.extra, to)
		}
	}
}

// tickGroups ticks the awake groups, and makes the idle ones quiet.
func (h *Host) tickGroups() {
	for _, g := range h.awake {
		if g.damaged != "" {
			g.announceDamage()
			continue
		}
		if g.quiesce() {
			continue
		}
		g.rn.Tick()
		g.touch()
	}
}

// fail stops the host after its store failed.
func (h *Host) fail(err error) {
	err = fmt.Errorf("%w: %w", ErrFailed, err)
	h.cfg.Logger.Error("replica: host stopped", "err", err)
	h.mu.Lock()
	h.err = err
	groups := h.opened
	h.mu.Unlock()
	for _, g := range groups {
		g.close(err)
	}
}

type groupReady struct {
	g  *Group
	rd raft.Ready
}

// handleReady takes the Ready of every group that has one, persists them
// all in one round (one group commit), then applies, sends and advances.
func (h *Host) handleReady() error {
	var rds []groupReady
	for id, g := range h.dirty {
		delete(h.dirty, id)
		if g.rn.HasReady() {
			rds = append(rds, groupReady{g, g.rn.Ready()})
		}
	}
	if len(rds) == 0 {
		return nil
	}
	// A group may have another Ready after this one (Advance,
	// ReportSnapshot, a rejoin step): look again next round.
	defer func() {
		for _, r := range rds {
			r.g.touch()
		}
		h.poke()
	}()
	if err := h.persist(rds); err != nil {
		return err
	}
	out := map[uint64][]Envelope{}
	var snaps []groupTo
	for _, r := range rds {
		if err := r.g.afterPersist(r.rd); err != nil {
			return err
		}
		for _, m := range r.rd.Messages {
			if !r.g.outgoing(m) {
				continue
			}
			out[m.GetTo()] = append(out[m.GetTo()], Envelope{Group: r.g.id, Msg: m})
			if m.GetType() == pb.MsgSnap {
				snaps = append(snaps, groupTo{r.g, m.GetTo()})
			}
		}
		r.g.rn.Advance(r.rd)
		r.g.afterAdvance()
	}
	for to, batch := range out {
		h.cfg.Transport.Send(to, batch)
	}
	for _, r := range rds {
		h.releaseDead(r.g.id)
	}
	for _, s := range snaps {
		// The transport is fire and forget: if the snapshot was lost, the
		// follower rejects the next append and the leader sends it again.
		s.g.rn.ReportSnapshot(s.to, raft.SnapshotFinish)
	}
	return nil
}

type groupTo struct {
	g  *Group
	to uint64
}

func isVoteGrant(m *pb.Message) bool {
	t := m.GetType()
	return (t == pb.MsgVoteResp || t == pb.MsgPreVoteResp) && !m.GetReject()
}

// persist appends the snapshots, hard states and entries of rds to the
// log and waits until all are durable: the store syncs them together.
func (h *Host) persist(rds []groupReady) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	done := func(err error) {
		if err != nil {
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
		}
		wg.Done()
	}
	last := make(map[*recSet]store.Pos, len(rds))
	bytes := 0
	appendRec := func(g *Group, kind store.Kind, payload []byte, rec liveRec) error {
		wg.Add(1)
		h.recMu.Lock()
		ref, err := h.log.Append(uint32(g.id), kind, payload, done)
		if err == nil {
			rec.ref, rec.kind = ref, kind
			last[h.trackLocked(g.id, rec)] = ref.Pos
		}
		h.recMu.Unlock()
		if err != nil {
			wg.Done()
			return err
		}
		bytes += len(payload)
		return nil
	}
	var buf []byte
	for _, r := range rds {
		if !raft.IsEmptySnap(r.rd.Snapshot) {
			idx := r.rd.Snapshot.GetMetadata().GetIndex()
			parts, payload, err := encodeSnapRecords(r.g.id, r.rd.Snapshot, h.cfg.Store.MaxRecordSize)
			if err != nil {
				wg.Wait()
				return err
			}
			for _, p := range parts {
				if err := appendRec(r.g, KindSnapPart, p, liveRec{last: idx}); err != nil {
					wg.Wait()
					return err
				}
			}
			if err := appendRec(r.g, KindSnap, payload, liveRec{last: idx}); err != nil {
				wg.Wait()
				return err
			}
		}
		hs := r.rd.HardState
		if raft.IsEmptyHardState(hs) {
			hs = nil
		}
		// Entries are split into records of at most MaxRecordSize; the
		// hard state goes with the last.
		ents := r.rd.Entries
		for len(ents) > 0 || hs != nil {
			n, size := 0, readyHeader+hardSize
			for n < len(ents) && (n == 0 || size+entryHeader+len(ents[n].GetData()) <= h.cfg.Store.MaxRecordSize) {
				size += entryHeader + len(ents[n].GetData())
				n++
			}
			var part *pb.HardState
			if n == len(ents) {
				part, hs = hs, nil
			}
			buf = encodeReady(buf[:0], r.g.id, part, ents[:n])
			rec := liveRec{hard: part != nil}
			if n > 0 {
				rec.last = ents[n-1].GetIndex()
			}
			ents = ents[n:]
			if err := appendRec(r.g, KindReady, buf, rec); err != nil {
				wg.Wait()
				return err
			}
		}
	}
	wg.Wait()
	h.rounds.Add(1)
	if first != nil {
		return first
	}
	for s, p := range last {
		s.markDurable(p)
	}
	h.noteAppended(bytes)
	return nil
}

// recover rebuilds the groups' Raft logs from the store.
func (h *Host) recover(rec *store.Recovery) error {
	hostDamage := ""
	if len(rec.Corrupt) > 0 || len(rec.Missing) > 0 || rec.CheckpointErr != nil {
		hostDamage = fmt.Sprintf("store damaged: %d corrupt, %d missing segments", len(rec.Corrupt), len(rec.Missing))
	}
	type state struct {
		parts   [][]byte // pieces of a snapshot's data, before its record
		partsAt uint64   // the index of that snapshot
		snap    *pb.Snapshot
		hard    *pb.HardState
		batches [][]*pb.Entry
	}
	states := map[GroupID]*state{}
	get := func(id GroupID) *state {
		s := states[id]
		if s == nil {
			s = &state{}
			states[id] = s
		}
		return s
	}
	// The records released after the checkpoint's cut: the checkpoint
	// may still list them, and their segments may be gone.
	released := map[store.Ref]bool{}
	if err := h.log.Replay(func(r store.Record) error {
		if r.Kind == store.KindRelease {
			refs, err := r.Released(nil)
			if err != nil {
				hostDamage = fmt.Sprintf("record %v: %v", r.Ref, err)
			}
			for _, ref := range refs {
				released[ref] = true
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("replica: replay: %w", err)
	}
	apply := func(r store.Record) error {
		if r.Kind >= store.KindReserved || released[r.Ref] {
			return nil // the store's own (releases), or dead
		}
		switch r.Kind {
		case KindReady:
			rr, err := decodeReady(r.Payload)
			if err != nil {
				hostDamage = fmt.Sprintf("record %v: %v", r.Ref, err)
				return nil
			}
			s := get(rr.group)
			if rr.hard != nil {
				s.hard = rr.hard
			}
			rec := liveRec{ref: r.Ref, kind: KindReady, hard: rr.hard != nil}
			if len(rr.entries) > 0 {
				s.batches = append(s.batches, rr.entries)
				rec.last = rr.entries[len(rr.entries)-1].GetIndex()
			}
			h.trackLocked(rr.group, rec)
		case KindSnapPart:
			id, idx, data, err := decodeSnapPart(r.Payload)
			if err != nil {
				hostDamage = fmt.Sprintf("record %v: %v", r.Ref, err)
				return nil
			}
			s := get(id)
			if s.partsAt != idx {
				s.parts, s.partsAt = nil, idx
			}
			s.parts = append(s.parts, slices.Clone(data))
			h.trackLocked(id, liveRec{ref: r.Ref, kind: KindSnapPart, last: idx})
		case KindSnap, KindCompact:
			id, snap, err := decodeSnap(r.Payload)
			if err != nil {
				hostDamage = fmt.Sprintf("record %v: %v", r.Ref, err)
				return nil
			}
			s := get(id)
			if idx := snap.GetMetadata().GetIndex(); len(snap.GetData()) == 0 && s.partsAt == idx && len(s.parts) > 0 {
				snap.Data = slices.Concat(s.parts...)
			}
			s.parts, s.partsAt = nil, 0
			if r.Kind == KindSnap {
				// The snapshot replaced the log: what came before is gone.
				s.snap, s.batches = snap, nil
			} else if s.snap == nil || snap.GetMetadata().GetIndex() > s.snap.GetMetadata().GetIndex() {
				s.snap = snap
			}
			h.trackLocked(id, liveRec{ref: r.Ref, kind: r.Kind, last: snap.GetMetadata().GetIndex()})
		default:
			hostDamage = fmt.Sprintf("record %v: unknown kind %d", r.Ref, r.Kind)
		}
		return nil
	}
	h.recMu.Lock()
	defer h.recMu.Unlock()
	if err := h.readCheckpointed(rec, released, apply, &hostDamage); err != nil {
		return err
	}
	if err := h.log.Replay(apply); err != nil {
		return fmt.Errorf("replica: replay: %w", err)
	}
	for _, s := range h.tracked {
		if n := len(s.recs); n > 0 {
			s.markDurable(s.recs[n-1].ref.Pos) // what recovery read is what the log kept
		}
	}
	for id, s := range states {
		ms := raft.NewMemoryStorage()
		bad := ""
		if s.snap != nil {
			if err := ms.ApplySnapshot(s.snap); err != nil {
				return fmt.Errorf("replica: group %d: %w", id, err)
			}
		}
		for _, b := range s.batches {
			last, _ := ms.LastIndex()
			if b[0].GetIndex() > last+1 {
				bad = fmt.Sprintf("log gap: entry %d after %d", b[0].GetIndex(), last)
				break
			}
			if err := ms.Append(b); err != nil {
				return fmt.Errorf("replica: group %d: %w", id, err)
			}
		}
		if s.hard != nil {
			last, _ := ms.LastIndex()
			hs := &pb.HardState{Term: u64(s.hard.GetTerm()), Vote: u64(s.hard.GetVote()), Commit: u64(s.hard.GetCommit())}
			if hs.GetCommit() > last {
				if bad == "" {
					bad = fmt.Sprintf("log ends at %d before its commit index %d", last, hs.GetCommit())
				}
				hs.Commit = u64(last)
			}
			first, _ := ms.FirstIndex()
			if hs.GetCommit() < first-1 {
				hs.Commit = u64(first - 1)
			}
			if err := ms.SetHardState(hs); err != nil {
				return fmt.Errorf("replica: group %d: %w", id, err)
			}
		}
		if bad == "" {
			bad = hostDamage
		}
		h.recovered[id] = &recovered{ms: ms, damaged: bad}
	}
	return nil
}

// readCheckpointed reads back, in log order, the records that the last
// checkpoint lists as live and that lie before it (those after it come
// with the replay), but those released after its cut.
func (h *Host) readCheckpointed(rec *store.Recovery, released map[store.Ref]bool, apply func(store.Record) error, damage *string) error {
	if rec.State == nil {
		return nil
	}
	refs, err := decodeCheckpointState(rec.State)
	if err != nil {
		*damage = fmt.Sprintf("checkpoint: %v", err)
		return nil
	}
	buf := make([]byte, 64<<10)
	for _, ref := range refs {
		if !ref.Less(rec.From) || released[ref] {
			continue
		}
		r, err := h.log.Read(ref, buf) // the decoders copy what they keep
		if err != nil {
			*damage = fmt.Sprintf("record %v: %v", ref, err)
			continue
		}
		if err := apply(r); err != nil {
			return err
		}
	}
	return nil
}

// raftConfig returns the RawNode configuration of group g.
func (h *Host) raftConfig(g *Group, st raft.Storage, applied uint64) *raft.Config {
	return &raft.Config{
		ID:                        h.cfg.ID,
		ElectionTick:              h.cfg.ElectionTicks,
		HeartbeatTick:             h.cfg.HeartbeatTicks,
		Storage:                   st,
		Applied:                   applied,
		MaxSizePerMsg:             1 << 20,
		MaxCommittedSizePerReady:  16 << 20,
		MaxUncommittedEntriesSize: 64 << 20,
		MaxInflightMsgs:           256,
		CheckQuorum:               true,
		PreVote:                   true,
		DisableProposalForwarding: true,
		StepDownOnRemoval:         true,
		Logger:                    h.rlog,
	}
}

// waitCtx waits for ch, ctx or the host's end.
func (h *Host) waitCtx(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-h.done:
		if err := h.Err(); err != nil {
			return err
		}
		return ErrClosed
	}
}

// quietLogger is etcd raft's logger: it drops everything but panics
// (formatting the messages raft logs at every election, only to discard
// them, was a tenth of a restart's CPU with 10,000 groups).
type quietLogger struct{}

func (quietLogger) Debug(...any)                   {}
func (quietLogger) Debugf(string, ...any)          {}
func (quietLogger) Info(...any)                    {}
func (quietLogger) Infof(string, ...any)           {}
func (quietLogger) Warning(...any)                 {}
func (quietLogger) Warningf(string, ...any)        {}
func (quietLogger) Error(...any)                   {}
func (quietLogger) Errorf(string, ...any)          {}
func (quietLogger) Fatal(v ...any)                 { panic(fmt.Sprint(v...)) }
func (quietLogger) Fatalf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
func (quietLogger) Panic(v ...any)                 { panic(fmt.Sprint(v...)) }
func (quietLogger) Panicf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
