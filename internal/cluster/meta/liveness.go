package meta

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"
)

// LeaseValid reports whether this node holds a valid liveness lease:
// its last renewal was applied by the group and was sent less than
// LeaseDuration-LeaseMargin ago, on this node's monotonic clock. The
// leader expires a node no earlier than LeaseDuration after it applied
// the node's last renewal, which came after the node sent it, so a node
// that cannot renew stops trusting its lease at least LeaseMargin before
// anyone else may act on its expiry (given clock rates within that
// margin). Whatever the node does with the lease's authority carries
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

// renewLoop renews this node's liveness record every RenewInterval.
func (m *Meta) renewLoop() {
	defer m.wg.Done()
	for {
		sent := time.Now()
		m.renew(sent)
		next := time.Until(sent.Add(m.cfg.RenewInterval))
		select {
		case <-m.done:
			return
		case <-time.After(next):
		}
	}
}

// renew sends one renewal; the lease is extended from sent if the
// group applied it.
func (m *Meta) renew(sent time.Time) {
	m.lmu.Lock()
	epoch := m.epoch
	m.lmu.Unlock()
	ctx, cancel := context.WithDeadline(m.ctx, sent.Add(m.cfg.RenewInterval))
	defer cancel()
	res, err := m.apply(ctx, &command{Op: opRenew, Name: m.cfg.NodeID, Epoch: epoch})
	if errors.Is(err, ErrRemoved) || err != nil && m.leaderless() >= m.cfg.NoLeaderTimeout && m.askRemoved() {
		m.log.Error("meta: this node was removed from the cluster (courier cluster forget); its member of the metadata group stops", "node", m.cfg.NodeID)
		m.raft.Shutdown()
		return
	}
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			m.log.Debug("meta: liveness renewal failed", "node", m.cfg.NodeID, "error", err)
		}
		return
	}
	m.lmu.Lock()
	defer m.lmu.Unlock()
	until := sent.Add(m.cfg.LeaseDuration - m.cfg.LeaseMargin)
	if res.Epoch != m.epoch {
		if m.epoch != 0 {
			m.log.Warn("meta: this node's liveness epoch was bumped: its lease had expired", "node", m.cfg.NodeID, "from", m.epoch, "to", res.Epoch)
		}
		// A lease in a new epoch starts from this renewal alone.
		m.epoch, m.validUntil = res.Epoch, until
		return
	}
	if until.After(m.validUntil) {
		m.validUntil = until
	}
}

// sawRenewal notes when this node applied a renewal of node: the leader
// expires node LeaseDuration after that.
func (m *Meta) sawRenewal(node string) {
	m.smu.Lock()
	m.seen[node] = time.Now()
	m.smu.Unlock()
}

// leaderLoop runs the leader's duties while this node leads: expire
// nodes whose renewals stopped, re-home their exchanges, and add the
// members of the fabric to the group.
func (m *Meta) leaderLoop() {
	defer m.wg.Done()
	tick := time.NewTicker(m.cfg.RenewInterval / 6)
	defer tick.Stop()
	var lastMembers time.Time
	for {
		select {
		case <-m.done:
			return
		case <-tick.C:
		}
		if m.raft.State() != raft.Leader {
			continue
		}
		m.expireNodes()
		if time.Since(lastMembers) >= time.Second {
			lastMembers = time.Now()
			m.reconcileLeader()
		}
	}
}

// expireNodes bumps the epoch of every node whose last renewal this
// leader saw more than LeaseDuration ago, then re-homes the exchanges of
// expired nodes while a live node can take them.
func (m *Meta) expireNodes() {
	type bump struct {
		node             string
		epoch, renewed   uint64
		expired, homesAt bool
	}
	var nodes []bump
	now := time.Now()
	m.fsm.read(func(st *State) {
		homes := map[string]bool{}
		for _, ex := range st.Exchanges {
			homes[ex.Home] = true
		}
		for name, n := range st.Nodes {
			nodes = append(nodes, bump{name, n.Epoch, n.Renewed, n.Expired, homes[name]})
		}
	})
	for _, n := range nodes {
		if !n.expired {
			m.smu.Lock()
			seen, ok := m.seen[n.node]
			if !ok {
				// Not seen since this node started: count from now.
				m.seen[n.node], seen = now, now
			}
			m.smu.Unlock()
			if now.Sub(seen) < m.cfg.LeaseDuration {
				continue
			}
			ctx, cancel := context.WithTimeout(m.ctx, m.cfg.RenewInterval)
			_, res, err := m.applyLeader(ctx, &command{Op: opBump, Name: n.node, Epoch: n.epoch, Renewed: n.renewed})
			cancel()
			if err != nil || res.Err != nil {
				continue
			}
			m.log.Warn("meta: node lease expired", "node", n.node, "epoch", res.Epoch, "last_renewal_seen", now.Sub(seen).Round(time.Millisecond))
			n.expired = true
		}
		if n.expired && n.homesAt {
			ctx, cancel := context.WithTimeout(m.ctx, m.cfg.RenewInterval)
			_, res, err := m.applyLeader(ctx, &command{Op: opRehome, Name: n.node})
			cancel()
			if err == nil && res.Err == nil && res.Moved > 0 {
				m.log.Warn("meta: exchanges re-homed", "from", n.node, "moved", res.Moved)
			}
		}
	}
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
