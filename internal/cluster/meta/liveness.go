package meta

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// LeaseValid reports whether this node holds a valid liveness lease:
// its last heartbeat that the leader answered live in its epoch, and a
// majority of the leader's voters marked under a fence no later than the
// leader's term (see fence.go), or its last renewal the group applied,
// was sent less than LeaseDuration-LeaseMargin ago, on this node's
// monotonic clock. The leader that answered expires the node no earlier
// than LeaseDuration after it received that heartbeat, which came after
// the node sent it; a later leader counts the node as seen no earlier
// than the latest receipt among a majority of voters, which includes
// one of the voters that marked it. So a node that cannot reach the
// leader stops trusting its lease at least LeaseMargin before anyone
// else may act on its expiry (given clock rates within that margin).
// Whatever the node does with the lease's authority carries
// [Meta.Lease]'s epoch.
func (m *Meta) LeaseValid() bool {
	_, ok := m.Lease()
	return ok
}

// Lease returns this node's epoch and whether its lease is valid now.
// The epoch is 0 before the first renewal.
func (m *Meta) Lease() (epoch uint64, valid bool) {
	m.lmu.Lock()
	defer m.lmu.Unlock()
	return m.epoch, m.epoch != 0 && time.Now().Before(m.validUntil)
}

// Epoch returns node's epoch in this node's state (0 if unknown).
func (m *Meta) Epoch(node string) uint64 {
	var e uint64
	m.fsm.read(func(st *State) { e = st.Nodes[node].Epoch })
	return e
}

// renewLoop keeps this node's lease: a heartbeat to the leader every
// RenewInterval, and a renewal through the log when the record must
// change (the first one, or after an expiry).
func (m *Meta) renewLoop() {
	defer m.wg.Done()
	for {
		sent := time.Now()
		m.heartbeat(sent)
		next := time.Until(sent.Add(m.cfg.RenewInterval))
		select {
		case <-m.done:
			return
		case <-time.After(next):
		}
	}
}

// heartbeat sends one heartbeat to the leader and marks it on every
// voter (see fence.go); the lease is extended from sent if the leader,
// confirmed by a quorum, found the record live in this node's epoch, and
// a majority of its voters recorded the heartbeat before any later
// leader fenced them. A record that is not live (none yet, or expired),
// or a leader of an older version, is renewed through the log instead.
func (m *Meta) heartbeat(sent time.Time) {
	m.lmu.Lock()
	epoch := m.epoch
	m.lmu.Unlock()
	if epoch == 0 {
		m.renew(sent)
		return
	}
	ctx, cancel := context.WithDeadline(m.ctx, sent.Add(2*m.cfg.RenewInterval))
	defer cancel()
	m.rmu.Lock()
	config := m.beatConfig
	m.rmu.Unlock()
	if config == 0 {
		// No leader answered yet: this node's own voter set, which
		// the leader's answer confirms or corrects.
		if f := m.raft.GetConfiguration(); f.Error() == nil {
			_, config = voterSet(f.Configuration())
		}
	}
	addr, id := m.raft.LeaderWithID()
	marks := m.markVoters(sent.Add(2*m.cfg.RenewInterval), string(id), config)
	if id == "" {
		// No leader (an election): the marks alone keep this node's
		// receipts fresh on the voters, so that the next leader's
		// fencing round counts it as seen now, not before the
		// election. They extend nothing.
		m.failed(ErrNotLeader, "heartbeat")
		return
	}
	b, err := m.beat(ctx, string(id), string(addr), config)
	if errors.Is(err, ErrBadFrame) {
		// A leader of a version without heartbeats: renew through the
		// log, as it expects.
		m.renew(sent)
		return
	}
	if err != nil {
		m.failed(err, "heartbeat")
		return
	}
	if b.Term == 0 {
		// A leader of a version without fencing rounds: its answer
		// alone does not bind the leaders after it.
		m.renew(sent)
		return
	}
	m.rmu.Lock()
	m.beatConfig = b.Config
	m.rmu.Unlock()
	if !b.Live || b.Epoch != epoch {
		m.renew(sent)
		return
	}
	if b.Config != config {
		return // the voter set changed: the next heartbeat carries it
	}
	if ok, old := backed(ctx, string(id), b, marks, cap(marks)); !ok {
		if old {
			// Voters of the version before marks, during a rolling
			// upgrade: a renewal through the log binds every leader.
			m.renew(sent)
			return
		}
		m.log.Debug("meta: heartbeat not marked by a majority of voters", "node", m.cfg.NodeID)
		return
	}
	m.extend(sent, epoch)
}

// beat sends a heartbeat to the leader id at addr, or takes it here if
// this node leads.
func (m *Meta) beat(ctx context.Context, id, addr string, config uint64) (beatReply, error) {
	if id == m.cfg.NodeID {
		return m.beatLeader(ctx, m.cfg.NodeID, config)
	}
	var resp response
	if err := m.pool.call(ctx, id, addr, typeBeat, &request{Node: m.cfg.NodeID, Config: config, Marks: true}, &resp); err != nil {
		return beatReply{}, err
	}
	if err := resp.Err.err(); err != nil {
		return beatReply{}, err
	}
	if resp.Beat == nil {
		return beatReply{}, fmt.Errorf("%w: heartbeat answered without a reply", ErrBadFrame)
	}
	return *resp.Beat, nil
}

// failed handles a heartbeat or renewal that failed: a node removed from
// the group stops its member; anything else waits for the next attempt.
func (m *Meta) failed(err error, what string) {
	if errors.Is(err, ErrRemoved) || m.leaderless() >= m.cfg.NoLeaderTimeout && m.askRemoved() {
		m.log.Error("meta: this node was removed from the cluster (courier cluster forget); its member of the metadata group stops", "node", m.cfg.NodeID)
		m.raft.Shutdown()
		return
	}
	if !errors.Is(err, ErrClosed) {
		m.log.Debug("meta: liveness "+what+" failed", "node", m.cfg.NodeID, "error", err)
	}
}

// renew renews this node's record through the log; the lease is
// extended from sent if the group applied it.
func (m *Meta) renew(sent time.Time) {
	m.lmu.Lock()
	epoch := m.epoch
	m.lmu.Unlock()
	ctx, cancel := context.WithDeadline(m.ctx, sent.Add(2*m.cfg.RenewInterval))
	defer cancel()
	res, err := m.apply(ctx, &command{Op: opRenew, Name: m.cfg.NodeID, Epoch: epoch})
	if err != nil {
		m.failed(err, "renewal")
		return
	}
	m.extend(sent, res.Epoch)
}

// extend extends the lease in epoch to LeaseDuration-LeaseMargin after
// sent.
func (m *Meta) extend(sent time.Time, epoch uint64) {
	m.lmu.Lock()
	defer m.lmu.Unlock()
	until := sent.Add(m.cfg.LeaseDuration - m.cfg.LeaseMargin)
	if epoch != m.epoch {
		if m.epoch != 0 {
			m.log.Warn("meta: this node's liveness epoch was bumped: its lease had expired", "node", m.cfg.NodeID, "from", m.epoch, "to", epoch)
		}
		// A lease in a new epoch starts from this renewal alone.
		m.epoch, m.validUntil = epoch, until
		return
	}
	if until.After(m.validUntil) {
		m.validUntil = until
	}
}

// beatReply is the leader's answer to a heartbeat: the node's record as
// the leader has it, the leader's term, its voters and their
// fingerprint (voterSet), and its fence when it recorded the heartbeat
// as a voter.
type beatReply struct {
	Epoch  uint64   `json:"epoch"`
	Live   bool     `json:"live"`
	Term   uint64   `json:"term,omitempty"`
	Config uint64   `json:"config,omitempty"`
	Voters []string `json:"voters,omitempty"`
	Fence  uint64   `json:"fence,omitempty"`
}

// beatLeader takes a heartbeat of node, sent with the configuration
// index config, on this node, which must lead in a term whose start it
// has applied (see startTerm). It marks the heartbeat as a voter, notes
// the receipt on this node's monotonic clock, then confirms with a
// quorum that it still leads (Raft's heartbeats, no write), so that what
// it answers is the state of the current leader. A node whose expiry is
// under way gets no answer.
func (m *Meta) beatLeader(ctx context.Context, node string, config uint64) (beatReply, error) {
	mark := m.mark(node, config)
	if m.raft.State() != raft.Leader {
		return beatReply{}, ErrNotLeader
	}
	m.smu.Lock()
	term := m.readyTerm
	switch {
	case term == 0 || m.raft.CurrentTerm() != term:
		m.smu.Unlock()
		return beatReply{}, fmt.Errorf("%w: the leader is starting its term", ErrNotLeader)
	case m.expiring[node]:
		m.smu.Unlock()
		return beatReply{}, fmt.Errorf("%w: node %q is being expired", ErrStale, node)
	}
	if now := time.Now(); now.After(m.seen[node]) {
		m.seen[node] = now
	}
	m.smu.Unlock()
	if err := wait(ctx, m.raft.VerifyLeader()); err != nil {
		return beatReply{}, err
	}
	if m.raft.CurrentTerm() != term {
		return beatReply{}, ErrNotLeader
	}
	var n Liveness
	var ok, removed bool
	m.fsm.read(func(st *State) {
		n, ok = st.Nodes[node]
		_, removed = st.Removed[node]
	})
	if removed {
		return beatReply{}, fmt.Errorf("%w: %q", ErrRemoved, node)
	}
	f := m.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return beatReply{}, mapRaftErr(err)
	}
	b := beatReply{Epoch: n.Epoch, Live: ok && !n.Expired, Term: term, Fence: mark.Fence}
	b.Voters, b.Config = voterSet(f.Configuration())
	return b, nil
}

// leaderLoop runs the leader's liveness duties while this node leads:
// start each term, expire nodes whose heartbeats stopped and re-home
// their exchanges. It runs apart from memberLoop, whose changes of the
// configuration may wait seconds for a node that is gone.
func (m *Meta) leaderLoop() {
	defer m.wg.Done()
	tick := time.NewTicker(m.cfg.RenewInterval / 5)
	defer tick.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-tick.C:
		}
		m.dmu.Lock()
		if m.raft.State() == raft.Leader && m.startTerm() {
			m.expireNodes()
		}
		m.dmu.Unlock()
	}
}

// memberLoop adds the members of the fabric to the group, every second
// while this node leads.
func (m *Meta) memberLoop() {
	defer m.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-tick.C:
		}
		if m.raft.State() == raft.Leader {
			m.reconcileLeader()
		}
	}
}

// startTerm readies a term this node leads, once. The state is brought
// up to the log with a barrier, so that what it answers heartbeats with
// includes every expiry committed before, and any expiry a former leader
// left in the log is decided. Then one fencing round (fence.go) tells
// when each node's last heartbeat was received by the voters: a node
// counts as seen then, or when this node last applied its renewal if
// that is later, but no later than the term's start. A node without a
// receipt of this configuration, or every node if no majority answered,
// counts as seen at the term's start: any heartbeat a former leader
// answered was received before this term's election. It reports whether
// the term is ready.
func (m *Meta) startTerm() bool {
	term := m.raft.CurrentTerm()
	m.smu.Lock()
	ready := m.readyTerm == term
	if !ready && m.startingTerm != term {
		m.readyTerm, m.startingTerm = 0, term
		m.termStart = time.Now()
		m.seen = map[string]time.Time{}
		m.expiring = map[string]bool{}
	}
	start := m.termStart
	m.smu.Unlock()
	if ready {
		return true
	}
	if err := m.barrier(m.cfg.LeaseDuration); err != nil || m.raft.CurrentTerm() != term {
		return false
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.LeaseDuration)
	fenced, ok := m.fenceRound(ctx, term)
	cancel()
	if m.raft.CurrentTerm() != term {
		return false
	}
	var nodes []string
	m.fsm.read(func(st *State) {
		for name := range st.Nodes {
			nodes = append(nodes, name)
		}
	})
	m.smu.Lock()
	for _, name := range nodes {
		if seen := termSeen(start, fenced, name, m.lastRenewal(name)); seen.After(m.seen[name]) {
			// (A renewal this leader applied since its term started
			// is noted in seen already, and may be later.)
			m.seen[name] = seen
		}
	}
	m.readyTerm = term
	m.smu.Unlock()
	m.log.Debug("meta: leading", "node", m.cfg.NodeID, "term", term, "fenced", ok)
	return true
}

// termSeen returns when a leader whose term started at start counts
// node as seen: its latest receipt among the voters of a fencing round
// (fenced), or when the leader last applied its renewal (renewed) if
// that is later, but no later than start; start if the round gave no
// receipt of the node.
func termSeen(start time.Time, fenced map[string]time.Time, node string, renewed time.Time) time.Time {
	at, ok := fenced[node]
	if !ok {
		return start
	}
	if renewed.After(at) {
		at = renewed
	}
	if at.After(start) {
		return start
	}
	return at
}

// expireNodes bumps the epoch of every node whose last heartbeat this
// leader received more than LeaseDuration ago (or, if none came in this
// term, whose term started that long ago), then re-homes the exchanges
// of expired nodes while a live node can take them.
func (m *Meta) expireNodes() {
	type bump struct {
		node           string
		epoch, renewed uint64
		expired        bool
	}
	var nodes []bump
	m.fsm.read(func(st *State) {
		for name, n := range st.Nodes {
			nodes = append(nodes, bump{name, n.Epoch, n.Renewed, n.Expired})
		}
	})
	var expired []string
	for _, n := range nodes {
		if n.expired || m.expire(n.node, n.epoch, n.renewed) {
			expired = append(expired, n.node)
		}
	}
	if len(expired) == 0 {
		return
	}
	homes := map[string]bool{}
	m.fsm.read(func(st *State) {
		for _, ex := range st.Exchanges {
			homes[ex.Home] = true
		}
	})
	for _, node := range expired {
		if !homes[node] {
			continue
		}
		ctx, cancel := context.WithTimeout(m.ctx, m.cfg.LeaseDuration)
		_, res, err := m.applyLeaderNudged(ctx, &command{Op: opRehome, Name: node})
		cancel()
		if err == nil && res.Err == nil && res.Moved > 0 {
			m.log.Warn("meta: exchanges re-homed", "from", node, "moved", res.Moved)
		}
	}
}

// expire bumps node's epoch if its last heartbeat is overdue, and
// reports whether it did. While the bump is decided the node's
// heartbeats go unanswered; if its outcome is unknown (the leader lost
// its quorum), they stay so until a barrier shows the state that
// decides it, or the term ends.
func (m *Meta) expire(node string, epoch, renewed uint64) bool {
	now := time.Now()
	m.smu.Lock()
	seen, ok := m.seen[node]
	if !ok {
		// A node new in this term: count from now.
		m.seen[node], seen = now, now
	}
	overdue := now.Sub(seen) >= m.cfg.LeaseDuration
	if overdue {
		m.expiring[node] = true
	}
	m.smu.Unlock()
	if !overdue {
		return false
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.LeaseDuration)
	defer cancel()
	_, res, err := m.applyLeaderNudged(ctx, &command{Op: opBump, Name: node, Epoch: epoch, Renewed: renewed})
	if err != nil && m.barrier(m.cfg.LeaseDuration) != nil {
		return false // expiring stays set: the next term clears it
	}
	m.smu.Lock()
	delete(m.expiring, node)
	m.smu.Unlock()
	if err != nil || res.Err != nil {
		return false
	}
	m.log.Warn("meta: node lease expired", "node", node, "epoch", res.Epoch, "last_heartbeat", now.Sub(seen).Round(time.Millisecond))
	return true
}

// askRemoved asks the members whether this node was removed: a removed
// node may never hear of it through Raft (the leader stops replicating
// to it), so when it knows no leader it asks.
func (m *Meta) askRemoved() bool {
	m.mmu.Lock()
	members := m.members
	m.mmu.Unlock()
	for _, x := range members {
		if x.ID == m.cfg.NodeID {
			continue
		}
		var resp response
		ctx, cancel := context.WithTimeout(m.ctx, time.Second)
		err := m.pool.call(ctx, x.ID, x.Addr, typeStatus, &request{Node: m.cfg.NodeID}, &resp)
		cancel()
		if err == nil && resp.Status != nil && resp.Status.Removed {
			return true
		}
	}
	return false
}
