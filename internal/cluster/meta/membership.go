package meta

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// Member is a node the fabric lists as alive: its id and its Raft
// address.
type Member struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

// Voters returns how many voters a group of n servers has: all of them
// up to 3, 3 below 5 servers, 5 from 5 servers on. The others are
// non-voters: they replicate the state but take no part in quorums.
func Voters(n int) int {
	if n >= 5 {
		return 5
	}
	return min(n, 3)
}

// Reconcile tells the group which nodes the fabric lists as alive, this
// one included (it is added if missing). The node wires it to the
// fabric's membership events and also calls it periodically.
//
// A node without Raft state whose BootstrapExpect is N bootstraps once
// members lists at least N nodes, every one of them answers that it has
// no Raft state and knows no leader, and this node is among the N first
// by id: every such node bootstraps the same configuration (those N as
// voters), as Consul's bootstrap_expect does. On the leader, members not
// in the group are added: as voters up to [Voters], else as non-voters;
// a non-voter is promoted when a voter is missing, and a voter demoted
// when there is one too many (after a removal).
func (m *Meta) Reconcile(ctx context.Context, members []Member) error {
	if !slices.ContainsFunc(members, func(x Member) bool { return x.ID == m.cfg.NodeID }) {
		members = append(slices.Clone(members), Member{ID: m.cfg.NodeID, Addr: m.cfg.Advertise})
	}
	slices.SortFunc(members, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	m.mmu.Lock()
	m.members = members
	m.mmu.Unlock()
	if !m.status().HasState {
		return m.maybeBootstrap(ctx, members)
	}
	if m.IsLeader() {
		m.reconcileLeader()
	}
	return nil
}

// maybeBootstrap bootstraps the group if this node should (see
// Reconcile).
func (m *Meta) maybeBootstrap(ctx context.Context, members []Member) error {
	n := m.cfg.BootstrapExpect
	if n <= 0 || len(members) < n {
		return nil
	}
	for _, x := range members {
		if x.ID == m.cfg.NodeID {
			continue
		}
		var resp response
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := m.pool.call(cctx, x.ID, x.Addr, typeStatus, &request{}, &resp)
		cancel()
		if err == nil {
			err = resp.Err.err()
		}
		if err != nil {
			return fmt.Errorf("meta: bootstrap: asking %s: %w", x.ID, err)
		}
		if resp.Status == nil {
			return fmt.Errorf("meta: bootstrap: %s sent no status", x.ID)
		}
		if resp.Status.HasState || resp.Status.Leader != "" {
			m.log.Info("meta: a cluster is formed; waiting to be added", "node", m.cfg.NodeID, "member", x.ID, "leader", resp.Status.Leader)
			return nil
		}
	}
	first := members[:n]
	if !slices.ContainsFunc(first, func(x Member) bool { return x.ID == m.cfg.NodeID }) {
		return nil
	}
	var servers []raft.Server
	for _, x := range first {
		servers = append(servers, raft.Server{ID: raft.ServerID(x.ID), Address: raft.ServerAddress(x.Addr), Suffrage: raft.Voter})
	}
	err := m.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	if errors.Is(err, raft.ErrCantBootstrap) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("meta: bootstrap: %w", err)
	}
	m.log.Info("meta: bootstrapped the metadata group", "node", m.cfg.NodeID, "voters", len(servers))
	return nil
}

// reconcileLeader adds the members the fabric lists to the group,
// promotes non-voters while voters are missing, and lets forgotten
// nodes that the fabric no longer lists join again later.
func (m *Meta) reconcileLeader() {
	m.mmu.Lock()
	members := m.members
	m.mmu.Unlock()
	if len(members) == 0 {
		return
	}
	f := m.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	conf := f.Configuration()
	// The tombstones are read after the configuration: removeLeader
	// writes the tombstone before it changes the configuration, so a
	// configuration without a removed node comes with its tombstone.
	var removed map[string]uint64
	m.fsm.read(func(st *State) { removed = maps.Clone(st.Removed) })
	in := map[string]raft.Server{}
	voters := 0
	for _, s := range conf.Servers {
		in[string(s.ID)] = s
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	total := len(conf.Servers)
	listed := map[string]bool{}
	for _, x := range members {
		listed[x.ID] = true
		if _, ok := in[x.ID]; !ok {
			if _, gone := removed[x.ID]; !gone {
				total++
			}
		}
	}
	want := Voters(total)
	ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
	defer cancel()
	for _, x := range members {
		s, ok := in[x.ID]
		if _, gone := removed[x.ID]; gone && !ok {
			continue
		}
		var fut raft.IndexFuture
		switch {
		case !ok && voters < want:
			fut = m.raft.AddVoter(raft.ServerID(x.ID), raft.ServerAddress(x.Addr), 0, 5*time.Second)
			voters++
		case !ok:
			fut = m.raft.AddNonvoter(raft.ServerID(x.ID), raft.ServerAddress(x.Addr), 0, 5*time.Second)
		case s.Suffrage != raft.Voter && voters < want:
			fut = m.raft.AddVoter(s.ID, s.Address, 0, 5*time.Second)
			voters++
		default:
			continue
		}
		if err := wait(ctx, fut); err != nil {
			m.log.Warn("meta: adding a member failed", "member", x.ID, "error", err)
			return
		}
		m.log.Info("meta: member added to the metadata group", "member", x.ID, "addr", x.Addr, "voters", voters)
	}
	// Demote the extra voters (after a removal): an even number of
	// voters tolerates no more failures than one fewer.
	for _, s := range slices.Backward(conf.Servers) {
		if voters <= want {
			break
		}
		if s.Suffrage != raft.Voter || string(s.ID) == m.cfg.NodeID {
			continue
		}
		if err := wait(ctx, m.raft.DemoteVoter(s.ID, 0, 5*time.Second)); err != nil {
			m.log.Warn("meta: demoting a voter failed", "member", s.ID, "error", err)
			return
		}
		voters--
		m.log.Info("meta: voter demoted to keep an odd number", "member", s.ID, "voters", voters)
	}
	for node := range removed {
		if !listed[node] {
			if _, _, err := m.applyLeaderNudged(ctx, &command{Op: opUnforget, Name: node}); err != nil {
				return
			}
		}
	}
}

// Remove forgets node for good (courier cluster forget): it leaves the
// Raft configuration, its liveness record is dropped and its exchanges
// are re-homed; the leader does not add it back while the fabric still
// lists it. The node itself, if it runs, stops its member of the group.
// Remove works from any node while the group has a quorum.
func (m *Meta) Remove(ctx context.Context, node string) error {
	ctx, cancel := m.opContext(ctx)
	defer cancel()
	var last error
	for {
		addr, id := m.raft.LeaderWithID()
		var idx uint64
		var err error
		switch {
		case id == "":
			err = ErrNotLeader
		case string(id) == m.cfg.NodeID:
			idx, err = m.removeLeader(ctx, node)
		default:
			var resp response
			if err = m.pool.call(ctx, string(id), string(addr), typeRemove, &request{Node: node}, &resp); err == nil {
				idx, err = resp.Index, resp.Err.err()
			}
		}
		if err == nil {
			if node == m.cfg.NodeID {
				return nil
			}
			return m.waitApplied(ctx, idx)
		}
		if !retryable(err) {
			return err
		}
		last = err
		if !m.pause(ctx) {
			return m.noQuorum(ctx, "remove", last)
		}
	}
}

// removeLeader removes node, on the leader: the tombstone first (its
// renewals are refused from then on, and reconcileLeader, which reads
// the configuration before the tombstones, cannot add it back), then
// the configuration. When the leader removes itself it steps down once
// the configuration without it commits.
func (m *Meta) removeLeader(ctx context.Context, node string) (uint64, error) {
	if node == "" {
		return 0, fmt.Errorf("%w: remove without a node", ErrBadCommand)
	}
	if m.raft.State() != raft.Leader {
		return 0, ErrNotLeader
	}
	known := false
	m.fsm.read(func(st *State) { _, known = st.Nodes[node] })
	if f := m.raft.GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			known = known || string(s.ID) == node
		}
	}
	if !known {
		return 0, fmt.Errorf("%w: %q is not in the metadata group", ErrUnknownNode, node)
	}
	idx, res, err := m.applyLeaderNudged(ctx, &command{Op: opForget, Name: node})
	if err != nil {
		return 0, err
	}
	if res.Err != nil {
		return 0, res.Err
	}
	return idx, wait(ctx, m.raft.RemoveServer(raft.ServerID(node), 0, timeLeft(ctx)))
}
