package replica

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/courier-mq/courier/internal/store"
)

// Entry is a committed entry as a [StateMachine] sees it.
type Entry struct {
	Index, Term uint64
	Data        []byte // valid only during Apply
}

// StateMachine is a group's replicated state, one instance per replica.
// Its methods are called from the group's apply goroutine only, one at a
// time (a group has an apply goroutine while it has work, so calls may
// come from different goroutines over time, never at once): Apply with
// every committed entry in log order, Snapshot when due (see
// [Config.SnapshotEntries]), Restore when the replica gets a
// snapshot instead of entries (or restarts from one). Apply must be
// deterministic: every replica applies the same entries in the same
// order. An error from Apply or Restore stops the group on this replica.
type StateMachine interface {
	Apply(e Entry) error
	// Snapshot returns the state as of the last applied entry.
	Snapshot() ([]byte, error)
	// Restore replaces the state with a snapshot's.
	Restore(data []byte) error
}

// LeaderObserver is an optional interface of a [StateMachine] told of
// leadership changes, in order with the entries: LeaderChanged(l, t) is
// called after every entry this replica applied before it learned that
// l leads term t (0 if no leader is known).
type LeaderObserver interface {
	LeaderChanged(leader, term uint64)
}

// Group is one Raft group's replica on a [Host].
type Group struct {
	h  *Host
	id GroupID
	sm StateMachine

	// The driver's.
	rn          *raft.RawNode
	ms          *raft.MemoryStorage
	damaged     string
	wasLeader   bool
	confPending bool
	quiet       bool // not ticked (quiesce.go)
	cs          *pb.ConfState
	openDamage  string          // why the replica was damaged when opened
	damageTicks int             // ticks while damaged (announceDamage)
	rejoin      map[uint64]bool // leader: damaged replicas being removed, to come back as learners
	leaderLast  uint64          // leader: the last index when it was elected

	leader, term atomic.Uint64

	mu       sync.Mutex
	waiters  map[uint64]func(result)
	leaderCh chan struct{} // closed and replaced at each leadership change
	queue    []applyItem
	err      error // why the group stopped
	running  bool  // an apply goroutine runs
	again    bool  // it must look at the queue once more
	ap       applyState
	stopped  chan struct{}
	once     sync.Once
	applied  atomic.Uint64
	snapWant atomic.Bool // a follower needs a snapshot newer than the stored one
}

// storage is the group's raft.Storage: the in-memory log, with a
// snapshot that always names the current configuration. A replica added
// since the last snapshot would refuse a snapshot whose configuration
// does not list it, so when the stored one is stale, Snapshot asks the
// apply goroutine for a new one and reports it temporarily unavailable
// (Raft asks again).
type storage struct {
	*raft.MemoryStorage
	g *Group
}

// Snapshot implements raft.Storage; it runs on the driver.
func (s storage) Snapshot() (*pb.Snapshot, error) {
	snap, err := s.MemoryStorage.Snapshot()
	if err != nil {
		return snap, err
	}
	if !proto.Equal(normConf(snap.GetMetadata().GetConfState()), normConf(s.g.cs)) {
		s.g.snapWant.Store(true)
		s.g.poke()
		return nil, raft.ErrSnapshotTemporarilyUnavailable
	}
	return snap, nil
}

// normConf returns cs with sorted ids, for comparison.
func normConf(cs *pb.ConfState) *pb.ConfState {
	if cs == nil {
		return &pb.ConfState{}
	}
	n := proto.Clone(cs).(*pb.ConfState)
	slices.Sort(n.Voters)
	slices.Sort(n.Learners)
	slices.Sort(n.VotersOutgoing)
	slices.Sort(n.LearnersNext)
	return n
}

type result struct {
	index uint64
	err   error
}

// applyItem is work for the apply goroutine, in order.
type applyItem struct {
	restore *pb.Snapshot
	entries []*pb.Entry
	cs      *pb.ConfState // the configuration after entries, if changed
	leader  *[2]uint64    // a leadership change after entries: leader, term
	lost    bool          // this replica stopped leading after entries
}

func newGroup(h *Host, id GroupID, sm StateMachine) *Group {
	return &Group{
		h: h, id: id, sm: sm,
		waiters:  map[uint64]func(result){},
		leaderCh: make(chan struct{}),
		stopped:  make(chan struct{}),
	}
}

// start creates the RawNode from g.ms and starts the apply goroutine.
func (g *Group) start() error {
	snap, err := g.ms.Snapshot()
	if err != nil {
		return fmt.Errorf("replica: group %d: %w", g.id, err)
	}
	_, cs, err := g.ms.InitialState()
	if err != nil {
		return fmt.Errorf("replica: group %d: %w", g.id, err)
	}
	g.cs = cs
	applied := snap.GetMetadata().GetIndex()
	rn, err := raft.NewRawNode(g.h.raftConfig(g, storage{g.ms, g}, applied))
	if err != nil {
		return fmt.Errorf("replica: group %d: %w", g.id, err)
	}
	g.rn = rn
	g.applied.Store(applied)
	// The apply state before the first item: enqueue may start the
	// apply goroutine, which owns it from then on.
	g.ap = applyState{applied: applied, lastSnap: applied, cs: cs}
	if len(snap.GetData()) > 0 {
		g.enqueue(applyItem{restore: snap})
	}
	g.poke()
	return nil
}

// ID returns the group's id.
func (g *Group) ID() GroupID { return g.id }

// Leader returns the leader this replica knows of (0 if none) and the
// term it knows.
func (g *Group) Leader() (leader, term uint64) { return g.leader.Load(), g.term.Load() }

// WaitLeaderReady waits until this replica leads and its state machine
// has applied every entry of its log as of its election: from then on
// its state holds everything ever committed, and it alone appends. A
// layer that serves from the leader (a queue) starts serving then.
func (g *Group) WaitLeaderReady(ctx context.Context) error {
	for {
		var ready bool
		if err := g.h.call(func() {
			ready = g.leading() == nil && g.applied.Load() >= g.leaderLast
		}); err != nil {
			return err
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond): // polling the driver, not waiting for correctness
		}
	}
}

// Applied returns the index of the last entry applied on this replica.
func (g *Group) Applied() uint64 { return g.applied.Load() }

// OpenDamage returns why the replica was found damaged when it was
// opened from the host's log, or "" if it was not.
func (g *Group) OpenDamage() string { return g.openDamage }

// Damaged returns why this replica does not vote, or "" if it does.
func (g *Group) Damaged() string {
	var d string
	_ = g.h.call(func() { d = g.damaged })
	return d
}

// Propose replicates data as a new entry. It returns the entry's index
// once the entry is committed (durable on a majority of the voters) and
// applied on this replica. On a replica that is not the leader it fails
// with a [*NotLeaderError] naming the leader. On [ErrLeadershipLost] or
// ctx's error the outcome is unknown: the entry may still be committed.
func (g *Group) Propose(ctx context.Context, data []byte) (uint64, error) {
	if len(data) > g.h.cfg.MaxEntrySize {
		return 0, fmt.Errorf("%w: %d bytes", ErrTooLarge, len(data))
	}
	id, ch, err := g.wait()
	if err != nil {
		return 0, err
	}
	if err := g.h.submit(func() { g.propose(id, data) }); err != nil {
		g.resolve(id, result{err: err})
	}
	return g.await(ctx, id, ch)
}

// ProposeAsync is [Group.Propose] without waiting: done is called once,
// with the entry's index or the error, on the group's apply goroutine or
// the host's driver; it must not block nor call the group. Proposals
// made one after the other by one goroutine are appended to the log in
// that order.
func (g *Group) ProposeAsync(data []byte, done func(index uint64, err error)) {
	if len(data) > g.h.cfg.MaxEntrySize {
		done(0, fmt.Errorf("%w: %d bytes", ErrTooLarge, len(data)))
		return
	}
	id, err := g.register(func(r result) { done(r.index, r.err) })
	if err != nil {
		done(0, err)
		return
	}
	if err := g.h.submit(func() { g.propose(id, data) }); err != nil {
		g.resolve(id, result{err: err})
	}
}

// register adds a waiter and returns its proposal id.
func (g *Group) register(fn func(result)) (uint64, error) {
	id := g.h.propID.Add(1)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return 0, g.err
	}
	g.waiters[id] = fn
	return id, nil
}

func (g *Group) wait() (uint64, chan result, error) {
	ch := make(chan result, 1)
	id, err := g.register(func(r result) { ch <- r })
	return id, ch, err
}

func (g *Group) await(ctx context.Context, id uint64, ch chan result) (uint64, error) {
	select {
	case r := <-ch:
		return r.index, r.err
	case <-ctx.Done():
		g.mu.Lock()
		delete(g.waiters, id)
		g.mu.Unlock()
		return 0, ctx.Err()
	}
}

// resolve completes waiter id, if it still waits.
func (g *Group) resolve(id uint64, r result) {
	g.mu.Lock()
	fn := g.waiters[id]
	delete(g.waiters, id)
	g.mu.Unlock()
	if fn != nil {
		fn(r)
	}
}

// failWaiters completes every waiter with err.
func (g *Group) failWaiters(err error) {
	g.mu.Lock()
	ws := g.waiters
	g.waiters = map[uint64]func(result){}
	g.mu.Unlock()
	for _, fn := range ws {
		fn(result{err: err})
	}
}

// propose runs on the driver.
func (g *Group) propose(id uint64, data []byte) {
	g.wakeUp()
	if err := g.leading(); err != nil {
		g.resolve(id, result{err: err})
		return
	}
	if err := g.rn.Propose(encodeProposal(id, data)); err != nil {
		g.resolve(id, result{err: fmt.Errorf("%w: %w", ErrDropped, err)})
	}
}

// leading runs on the driver: nil if this replica leads.
func (g *Group) leading() error {
	st := g.rn.BasicStatus()
	if st.RaftState != raft.StateLeader {
		return &NotLeaderError{Leader: st.Lead}
	}
	return nil
}

// damagedCtx marks the heartbeat responses of a damaged replica, so
// that the leader makes it rejoin as a learner.
const damagedCtx = "courier:damaged"

// step runs on the driver with a message from a peer.
func (g *Group) step(m *pb.Message) {
	commit := m.GetCommit()
	quiesce := false
	g.touch()
	switch m.GetType() {
	case pb.MsgTimeoutNow:
		if g.damaged != "" {
			return // a damaged replica never campaigns, even when asked to
		}
	case pb.MsgHeartbeat:
		// A leader's heartbeat says how far this replica may commit, from
		// what the replica acknowledged. A replica that lost acknowledged
		// entries would make Raft panic: it commits what it has.
		if last, _ := g.ms.LastIndex(); m.GetCommit() > last {
			m.Commit = u64(last)
		}
		if string(m.GetContext()) == quiesceCtx {
			quiesce = true
			m.Context = nil
		}
	case pb.MsgHeartbeatResp:
		if string(m.GetContext()) == damagedCtx {
			g.noteDamaged(m.GetFrom())
			m.Context = nil
		}
	case pb.MsgAppResp:
		if m.GetReject() && g.lostAcked(m) {
			g.noteDamaged(m.GetFrom())
		}
	}
	if raft.IsLocalMsg(m.GetType()) {
		return // a peer cannot send local messages
	}
	_ = g.rn.Step(m)
	g.stepQuiet(m, quiesce, commit)
}

// outgoing runs on the driver: it filters and marks what this replica
// sends. A damaged replica grants no vote and says it is damaged.
func (g *Group) outgoing(m *pb.Message) bool {
	if g.damaged == "" {
		return true
	}
	if isVoteGrant(m) {
		return false
	}
	if m.GetType() == pb.MsgHeartbeatResp {
		m.Context = []byte(damagedCtx)
	}
	return true
}

// lostAcked runs on the driver with a rejected append: it reports
// whether the follower's log now ends before what it acknowledged to
// this leader (its match index), so it lost entries it had fsynced. A
// rejection of an append sent before the match index is stale, not loss.
func (g *Group) lostAcked(m *pb.Message) bool {
	st := g.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || m.GetTerm() != st.GetTerm() {
		return false
	}
	var match uint64
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == m.GetFrom() {
			match = pr.Match
		}
	})
	return m.GetIndex() >= match && m.GetRejectHint() < match
}

// announceDamage runs on the driver at each tick of a damaged replica
// (which does not tick Raft): once an election timeout, from its first
// tick, it tells every voter it is damaged, as its answers to heartbeats
// do, so that a leader that sends none (quiet, or whose heartbeats were
// lost while this replica came back) makes it a learner.
func (g *Group) announceDamage() {
	g.damageTicks++
	if (g.damageTicks-1)%g.h.cfg.ElectionTicks != 0 {
		return
	}
	st := g.rn.BasicStatus()
	for _, id := range g.cs.GetVoters() {
		if id == g.h.cfg.ID {
			continue
		}
		g.h.extra[id] = append(g.h.extra[id], Envelope{Group: g.id, Msg: &pb.Message{
			Type: pb.MsgHeartbeatResp.Enum(), To: u64(id), From: u64(g.h.cfg.ID),
			Term: u64(st.GetTerm()), Context: []byte(damagedCtx),
		}})
	}
}

// noteDamaged runs on the leader's driver when replica id reports that
// it lost part of its log. The leader removes it, then adds it back as
// a learner: removal forgets what the leader believed the replica had
// (Raft never lowers a replica's match index), and a learner never
// votes. An operator promotes it again with [Group.AddVoter] once it
// has caught up.
func (g *Group) noteDamaged(id uint64) {
	if g.leading() != nil || !slices.Contains(g.cs.GetVoters(), id) {
		return
	}
	if g.rejoin == nil {
		g.rejoin = map[uint64]bool{}
	}
	g.rejoin[id] = true
	g.advanceRejoin()
}

// advanceRejoin proposes the next step of a damaged replica's rejoin.
func (g *Group) advanceRejoin() {
	for id := range g.rejoin {
		if !g.canChangeConf() {
			return
		}
		typ := pb.ConfChangeRemoveNode
		if !slices.Contains(g.cs.GetVoters(), id) {
			typ = pb.ConfChangeAddLearnerNode
			delete(g.rejoin, id)
		}
		cc := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: &typ, NodeId: u64(id)}}}
		if g.rn.ProposeConfChange(cc) == nil {
			g.confPending = true
			g.h.cfg.Logger.Warn("replica: damaged replica rejoins as a learner", "group", g.id, "replica", id, "step", typ.String())
		}
	}
}

// afterPersist runs on the driver once rd's state is durable: it updates
// the in-memory log, applies configuration changes and queues committed
// entries and events for the apply goroutine.
func (g *Group) afterPersist(rd raft.Ready) error {
	if !raft.IsEmptySnap(rd.Snapshot) {
		if err := g.ms.ApplySnapshot(rd.Snapshot); err != nil {
			return fmt.Errorf("group %d: apply snapshot: %w", g.id, err)
		}
		g.cs = rd.Snapshot.GetMetadata().GetConfState()
		g.h.peersStale = true
		g.enqueue(applyItem{restore: rd.Snapshot, cs: g.cs})
	}
	if err := g.ms.Append(rd.Entries); err != nil {
		return fmt.Errorf("group %d: append: %w", g.id, err)
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		if err := g.ms.SetHardState(rd.HardState); err != nil {
			return fmt.Errorf("group %d: hard state: %w", g.id, err)
		}
		g.term.Store(rd.HardState.GetTerm())
	}
	item := applyItem{entries: rd.CommittedEntries}
	for _, e := range rd.CommittedEntries {
		if cc := confChange(e); cc != nil {
			g.cs = g.rn.ApplyConfChange(cc)
			g.h.peersStale = true
			g.confPending = false
			item.cs = g.cs
			if g.damaged != "" && addsLearner(cc, g.h.cfg.ID) {
				g.h.cfg.Logger.Warn("replica: damaged replica is a learner again", "group", g.id)
				g.damaged = ""
			}
		}
	}

	if rd.SoftState != nil {
		lead := rd.SoftState.Lead
		if old := g.leader.Swap(lead); old != lead {
			item.leader = &[2]uint64{lead, g.term.Load()}
			g.mu.Lock()
			close(g.leaderCh)
			g.leaderCh = make(chan struct{})
			g.mu.Unlock()
		}
		isLeader := rd.SoftState.RaftState == raft.StateLeader
		if isLeader && !g.wasLeader {
			// Raft drops configuration changes until the new leader has
			// applied its log as of its election (its last index then).
			g.leaderLast, _ = g.ms.LastIndex()
		}
		if g.wasLeader && !isLeader {
			item.lost = true
			g.confPending = false
		}
		g.wasLeader = isLeader
	}
	if len(item.entries) > 0 || item.leader != nil || item.lost {
		g.enqueue(item)
	}
	return nil
}

// canChangeConf runs on the driver: whether a configuration change
// proposed now would be accepted (Raft silently turns one proposed
// before the previous is applied into an empty entry).
func (g *Group) canChangeConf() bool {
	return g.leading() == nil && !g.confPending && g.rn.BasicStatus().Applied >= g.leaderLast
}

// afterAdvance runs on the driver after each Ready is done.
func (g *Group) afterAdvance() {
	if len(g.rejoin) > 0 {
		g.advanceRejoin()
	}
}

// addsLearner reports whether cc adds replica id as a learner.
func addsLearner(cc pb.ConfChangeI, id uint64) bool {
	for _, c := range cc.AsV2().GetChanges() {
		if c.GetType() == pb.ConfChangeAddLearnerNode && c.GetNodeId() == id {
			return true
		}
	}
	return false
}

// confChange decodes a configuration change entry; nil for others.
func confChange(e *pb.Entry) pb.ConfChangeI {
	switch e.GetType() {
	case pb.EntryConfChange:
		cc := &pb.ConfChange{}
		if proto.Unmarshal(e.GetData(), cc) != nil {
			return nil
		}
		return cc
	case pb.EntryConfChangeV2:
		cc := &pb.ConfChangeV2{}
		if proto.Unmarshal(e.GetData(), cc) != nil {
			return nil
		}
		return cc
	}
	return nil
}

func (g *Group) enqueue(it applyItem) {
	g.mu.Lock()
	if g.err != nil {
		g.mu.Unlock()
		return // stopped: nobody applies any more
	}
	g.queue = append(g.queue, it)
	g.mu.Unlock()
	g.poke()
}

// applyState is what applying remembers between runs; only the running
// apply goroutine touches it.
type applyState struct {
	applied    uint64
	cs         *pb.ConfState
	lastSnap   uint64 // index of the last snapshot
	bytesSince int64  // entry bytes applied since the last snapshot
	snapSize   int64  // its size
}

// poke makes sure an apply goroutine looks at the queue (and at
// snapWant). A group has one only while it has work: an idle group
// costs no goroutine.
func (g *Group) poke() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return
	}
	if g.running {
		g.again = true
		return
	}
	g.running = true
	go g.applyRun()
}

// applyRun calls the state machine with committed entries, in order,
// until the queue is empty.
func (g *Group) applyRun() {
	for {
		g.mu.Lock()
		items := g.queue
		g.queue, g.again = nil, false
		g.mu.Unlock()
		if !g.applyItems(items) {
			return
		}
		g.mu.Lock()
		if len(g.queue) == 0 && !g.again {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
	}
}

// applyItems applies items and snapshots when due; false if the group
// stopped.
func (g *Group) applyItems(items []applyItem) bool {
	select {
	case <-g.stopped:
		return false
	default:
	}
	ap := &g.ap
	for _, it := range items {
		for _, e := range it.entries {
			if e.GetIndex() > ap.applied {
				ap.bytesSince += int64(len(e.GetData()))
			}
		}
		var err error
		ap.applied, err = g.applyItem(it, ap.applied)
		if err != nil {
			g.close(fmt.Errorf("replica: group %d: state machine: %w", g.id, err))
			return false
		}
		if it.restore != nil {
			ap.lastSnap, ap.bytesSince, ap.snapSize = ap.applied, 0, int64(len(it.restore.GetData()))
		}
		if it.cs != nil {
			ap.cs = it.cs
		}
	}
	due := (ap.applied-ap.lastSnap >= g.h.cfg.SnapshotEntries || ap.bytesSince >= g.h.cfg.SnapshotBytes) && ap.bytesSince >= ap.snapSize
	if due || (g.snapWant.Load() && ap.applied > ap.lastSnap) {
		g.snapWant.Store(false)
		if n, ok := g.snapshot(ap.applied, ap.cs); ok {
			ap.lastSnap, ap.bytesSince, ap.snapSize = ap.applied, 0, int64(n)
		}
	}
	return true
}

func (g *Group) applyItem(it applyItem, applied uint64) (uint64, error) {
	if it.restore != nil {
		idx := it.restore.GetMetadata().GetIndex()
		if idx > applied || applied == idx {
			if err := g.sm.Restore(it.restore.GetData()); err != nil {
				return applied, err
			}
			applied = idx
			g.applied.Store(applied)
		}
	}
	for _, e := range it.entries {
		if e.GetIndex() <= applied {
			continue
		}
		switch e.GetType() {
		case pb.EntryNormal:
			if id, data, ok := decodeProposal(e.GetData()); ok {
				if err := g.sm.Apply(Entry{Index: e.GetIndex(), Term: e.GetTerm(), Data: data}); err != nil {
					return applied, err
				}
				g.resolve(id, result{index: e.GetIndex()})
			}
		default:
			if id, ok := confID(e); ok {
				g.resolve(id, result{index: e.GetIndex()})
			}
		}
		applied = e.GetIndex()
		g.applied.Store(applied)
	}
	if it.leader != nil {
		if o, ok := g.sm.(LeaderObserver); ok {
			o.LeaderChanged(it.leader[0], it.leader[1])
		}
	}
	if it.lost {
		g.failWaiters(ErrLeadershipLost)
	}
	return applied, nil
}

// confID returns the proposal id carried in a conf change's context.
func confID(e *pb.Entry) (uint64, bool) {
	var ctx []byte
	switch cc := confChange(e).(type) {
	case *pb.ConfChange:
		ctx = cc.GetContext()
	case *pb.ConfChangeV2:
		ctx = cc.GetContext()
	}
	if len(ctx) != 8 {
		return 0, false
	}
	return binary.LittleEndian.Uint64(ctx), true
}

// snapshot takes a snapshot of the state machine at applied and hands it
// to the driver, which compacts the in-memory log and persists it. It
// returns the snapshot's size.
func (g *Group) snapshot(applied uint64, cs *pb.ConfState) (int, bool) {
	data, err := g.sm.Snapshot()
	if err != nil {
		g.h.cfg.Logger.Warn("replica: snapshot failed", "group", g.id, "err", err)
		return 0, false
	}
	cs = proto.Clone(cs).(*pb.ConfState)
	return len(data), g.h.submit(func() { g.compact(applied, cs, data) }) == nil
}

// compact runs on the driver.
func (g *Group) compact(index uint64, cs *pb.ConfState, data []byte) {
	snap, err := g.ms.CreateSnapshot(index, cs, data)
	if err != nil {
		return // an older snapshot than the storage's (one was received)
	}
	parts, payload, err := encodeSnapRecords(g.id, snap, g.h.cfg.Store.MaxRecordSize)
	if err != nil {
		g.h.cfg.Logger.Warn("replica: snapshot not stored; log not compacted", "group", g.id, "err", err)
		return
	}
	// Nothing waits for this record: until it is durable, restart
	// rebuilds the state from the entries, which are all still in the
	// log. Once it is, the records it covers are released.
	h := g.h
	var set *recSet
	var ref store.Ref
	h.recMu.Lock()
	size := len(payload)
	for _, p := range parts {
		pref, err := h.log.Append(uint32(g.id), KindSnapPart, p, nil)
		if err != nil {
			h.recMu.Unlock()
			return
		}
		h.trackLocked(g.id, liveRec{ref: pref, kind: KindSnapPart, last: index})
		size += len(p)
	}
	ref, err = h.log.Append(uint32(g.id), KindCompact, payload, func(err error) {
		if err == nil {
			// On the driver, after this call has set ref and set.
			_ = h.submit(func() {
				set.markDurable(ref.Pos)
				h.releaseDead(g.id)
			})
		}
	})
	if err == nil {
		set = h.trackLocked(g.id, liveRec{ref: ref, kind: KindCompact, last: index})
	}
	h.recMu.Unlock()
	if err != nil {
		return
	}
	h.noteAppended(size)
	_ = g.ms.Compact(index)
}

// close stops the group's apply goroutine and fails its waiters.
func (g *Group) close(err error) {
	g.once.Do(func() {
		g.mu.Lock()
		g.err = err
		g.mu.Unlock()
		close(g.stopped)
		g.failWaiters(err)
	})
}

// Status is a replica's view of its group.
type Status struct {
	ID       uint64 // this replica
	Leader   uint64 // 0 if none known
	Term     uint64
	Role     string // "leader", "follower", "candidate", "pre-candidate"
	Commit   uint64
	Applied  uint64
	Last     uint64 // last index of the local log
	Voters   []uint64
	Learners []uint64
	// Match is, on the leader only, how far each replica's log is known
	// to match the leader's.
	Match map[uint64]uint64
	// Damaged says why this replica does not vote, "" if it does.
	Damaged string
}

// Status returns the replica's view of the group.
func (g *Group) Status() (Status, error) {
	var s Status
	err := g.h.call(func() {
		st := g.rn.Status()
		last, _ := g.ms.LastIndex()
		s = Status{
			ID: st.ID, Leader: st.Lead, Term: st.GetTerm(), Role: roleName(st.RaftState),
			Commit: st.GetCommit(), Applied: g.applied.Load(), Last: last, Damaged: g.damaged,
		}
		s.Voters = slices.Sorted(maps.Keys(st.Config.Voters[0]))
		s.Learners = slices.Sorted(maps.Keys(st.Config.Learners))
		if st.RaftState == raft.StateLeader {
			s.Match = map[uint64]uint64{}
			for id, pr := range st.Progress {
				s.Match[id] = pr.Match
			}
		}
	})
	return s, err
}

func roleName(s raft.StateType) string {
	switch s {
	case raft.StateLeader:
		return "leader"
	case raft.StateFollower:
		return "follower"
	case raft.StateCandidate:
		return "candidate"
	case raft.StatePreCandidate:
		return "pre-candidate"
	}
	return s.String()
}

// TransferLeadership asks the leader (this replica) to hand leadership
// to replica to, and waits until this replica sees to lead, or ctx ends.
func (g *Group) TransferLeadership(ctx context.Context, to uint64) error {
	var err error
	if cerr := g.h.call(func() {
		g.wakeUp()
		if err = g.leading(); err == nil {
			g.rn.TransferLeader(to)
		}
	}); cerr != nil {
		return cerr
	}
	if err != nil {
		return err
	}
	for {
		g.mu.Lock()
		ch := g.leaderCh
		g.mu.Unlock()
		if g.leader.Load() == to {
			return nil
		}
		if err := g.h.waitCtx(ctx, ch); err != nil {
			return err
		}
	}
}

// AddVoter adds replica id as a voter (or promotes it from learner).
func (g *Group) AddVoter(ctx context.Context, id uint64) error {
	return g.changeConf(ctx, pb.ConfChangeAddNode, id)
}

// AddLearner adds replica id as a learner: it receives the log but does
// not vote and does not count towards commits.
func (g *Group) AddLearner(ctx context.Context, id uint64) error {
	return g.changeConf(ctx, pb.ConfChangeAddLearnerNode, id)
}

// RemoveReplica removes replica id from the group.
func (g *Group) RemoveReplica(ctx context.Context, id uint64) error {
	return g.changeConf(ctx, pb.ConfChangeRemoveNode, id)
}

// changeConf proposes a change of one replica and waits until it is
// applied here. One change at a time: a second one while the first is
// pending fails with [ErrConfChangePending].
func (g *Group) changeConf(ctx context.Context, typ pb.ConfChangeType, node uint64) error {
	pid, ch, err := g.wait()
	if err != nil {
		return err
	}
	cc := &pb.ConfChangeV2{
		Changes: []*pb.ConfChangeSingle{{Type: &typ, NodeId: u64(node)}},
		Context: binary.LittleEndian.AppendUint64(nil, pid),
	}
	if serr := g.h.submit(func() {
		g.wakeUp()
		if err := g.leading(); err != nil {
			g.resolve(pid, result{err: err})
			return
		}
		if !g.canChangeConf() {
			g.resolve(pid, result{err: ErrConfChangePending})
			return
		}
		if err := g.rn.ProposeConfChange(cc); err != nil {
			g.resolve(pid, result{err: fmt.Errorf("%w: %w", ErrDropped, err)})
			return
		}
		g.confPending = true
	}); serr != nil {
		g.resolve(pid, result{err: serr})
	}
	_, err = g.await(ctx, pid, ch)
	return err
}
