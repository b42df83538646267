package meta

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// LeaseValid reports whether this node holds a valid liveness lease:
// its last heartbeat answered by a leader (or renewal applied by the
// group) was sent less than LeaseDuration-LeaseMargin ago, on this node's
// monotonic clock. The leader that answered expires the node no earlier
// than LeaseDuration after it received that heartbeat, which came after
// the node sent it; it answered only after a quorum confirmed it still
// led, so any later leader was elected after the receipt, and it
// expires no one before LeaseDuration has passed in its own term. So a
// node that cannot reach the leader stops trusting its lease at least
// LeaseMargin before anyone else may act on its expiry (given clock
// rates within that margin). Whatever the node does with the lease's
// authority carries [Meta.Lease]'s epoch.
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

// heartbeat sends one heartbeat; the lease is extended from sent if the
// leader, confirmed by a quorum, found the record live in this node's
// epoch. A record that is not (none yet, or expired) is renewed through
// the log instead.
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
	b, err := m.beat(ctx)
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
	if !b.Live || b.Epoch != epoch {
		m.renew(sent)
		return
	}
	m.extend(sent, epoch)
}

// beat sends a heartbeat to the leader, or takes it here if this node
// leads.
func (m *Meta) beat(ctx context.Context) (beatReply, error) {
	addr, id := m.raft.LeaderWithID()
	switch {
	case id == "":
		return beatReply{}, ErrNotLeader
	case string(id) == m.cfg.NodeID:
		return m.beatLeader(ctx, m.cfg.NodeID)
	}
	var resp response
	if err := m.pool.call(ctx, string(id), string(addr), typeBeat, &request{Node: m.cfg.NodeID}, &resp); err != nil {
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
// the leader has it.
type beatReply struct {
	Epoch uint64 `json:"epoch"`
	Live  bool   `json:"live"`
}

// beatLeader takes a heartbeat of node on this node, which must lead in
// a term whose start it has applied (see startTerm). It notes the
// receipt on this node's monotonic clock, then confirms with a quorum
// that it still leads (Raft's heartbeats, no write): a leader elected
// later was elected after this receipt, and it expires no one before a
// whole lease has passed in its term. A node whose expiry is under way
// gets no answer.
func (m *Meta) beatLeader(ctx context.Context, node string) (beatReply, error) {
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
	return beatReply{Epoch: n.Epoch, Live: ok && !n.Expired}, nil
}

// sawRenewal notes when this node applied a renewal of node: the leader
// expires node LeaseDuration after that at the earliest.
func (m *Meta) sawRenewal(node string) {
	m.smu.Lock()
	if now := time.Now(); now.After(m.seen[node]) {
		m.seen[node] = now
	}
	m.smu.Unlock()
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

// startTerm readies a term this node leads, once: every node counts as
// seen now (the receipts of the leaders before it are not known here),
// and the state is brought up to the log with a barrier, so that what it
// answers heartbeats with includes every expiry committed before, and
// any expiry a former leader left in the log is decided. It reports
// whether the term is ready.
func (m *Meta) startTerm() bool {
	term := m.raft.CurrentTerm()
	m.smu.Lock()
	ready := m.readyTerm == term
	if !ready && m.startingTerm != term {
		m.readyTerm, m.startingTerm = 0, term
		now := time.Now()
		m.seen = map[string]time.Time{}
		m.fsm.read(func(st *State) {
			for name := range st.Nodes {
				m.seen[name] = now
			}
		})
		m.expiring = map[string]bool{}
	}
	m.smu.Unlock()
	if ready {
		return true
	}
	if err := m.raft.Barrier(m.cfg.LeaseDuration).Error(); err != nil || m.raft.CurrentTerm() != term {
		return false
	}
	m.smu.Lock()
	m.readyTerm = term
	m.smu.Unlock()
	m.log.Debug("meta: leading", "node", m.cfg.NodeID, "term", term)
	return true
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
		_, res, err := m.applyLeader(ctx, &command{Op: opRehome, Name: node})
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
	_, res, err := m.applyLeader(ctx, &command{Op: opBump, Name: node, Epoch: epoch, Renewed: renewed})
	if err != nil && m.raft.Barrier(m.cfg.LeaseDuration).Error() != nil {
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
