package meta

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// Voter receipts and fencing rounds: how a new leader learns when the
// nodes' last heartbeats were received, so that it expires a node a
// lease after that node's last heartbeat rather than a lease after its
// own term started. docs/cluster.md, "Node liveness", states the
// argument; in short:
//
//   - A node sends each heartbeat to the leader and marks it on every
//     voter (typeMark). A voter records the receipt, on its monotonic
//     clock, with the configuration index the node sent, and answers
//     with its fence: the highest term whose fencing round it answered.
//     The record and the fence are read and written under one mutex.
//   - The node extends its lease from the heartbeat's send time only if
//     the leader (term L, configuration index C, voters V) answered
//     that its record is live, the node had sent C, and a majority of V
//     (the leader among them) answered the mark with a fence <= L.
//   - A leader of term T > L, once its barrier is applied, runs one
//     fencing round (typeFence): each voter raises its fence to T and
//     answers the age of its last receipt of each node. The leader takes
//     the latest receipt per node over a majority of its voters, and
//     counts the node as seen then if that receipt carries the leader's
//     own configuration index, else at its term start.
//
// A majority that backed a lease and the majority that answered the
// fencing round share a voter (same configuration; a configuration one
// change apart, the most Raft leaves uncommitted, also shares one). That
// voter received the heartbeat before it answered the round (its fence
// was <= L < T when it recorded the receipt), so the new leader's latest
// receipt is no earlier than the heartbeat's send time.

// receipt is a voter's record of a node's last heartbeat.
type receipt struct {
	at     time.Time
	config uint64
}

// markReply answers a mark: the voter's fence when it recorded it.
type markReply struct {
	Fence uint64 `json:"fence"`
}

// fenceReply answers a fencing round: per node, the age of the voter's
// last receipt of its heartbeat and the configuration index it carried.
type fenceReply struct {
	Receipts map[string]fenceAge `json:"receipts"`
}

type fenceAge struct {
	AgeNS  int64  `json:"age_ns"`
	Config uint64 `json:"config"`
}

// mark records a heartbeat of node on this node as a voter, and returns
// the fence it was recorded under.
func (m *Meta) mark(node string, config uint64) markReply {
	now := time.Now()
	m.rmu.Lock()
	defer m.rmu.Unlock()
	m.receipts[node] = receipt{at: now, config: config}
	return markReply{Fence: m.fence}
}

// answerFence answers the fencing round of term, asked by peer ("" if
// unknown): only for the term this node is in, and from the leader it
// follows, so that a node that is not a leader cannot fence the
// heartbeats of the leader that is.
func (m *Meta) answerFence(term uint64, peer string) (fenceReply, error) {
	if cur := m.raft.CurrentTerm(); term == 0 || term != cur {
		return fenceReply{}, fmt.Errorf("%w: fencing round of term %d, this node is in term %d", ErrStale, term, cur)
	}
	if _, id := m.raft.LeaderWithID(); peer != "" && string(id) != peer {
		return fenceReply{}, fmt.Errorf("%w: fencing round from %q, this node follows %q", ErrNotLeader, peer, id)
	}
	return m.fenceLocal(term), nil
}

// fenceLocal raises this node's fence to term and returns the ages of
// its receipts.
func (m *Meta) fenceLocal(term uint64) fenceReply {
	now := time.Now()
	m.rmu.Lock()
	defer m.rmu.Unlock()
	m.fence = max(m.fence, term)
	out := fenceReply{Receipts: make(map[string]fenceAge, len(m.receipts))}
	for node, r := range m.receipts {
		out.Receipts[node] = fenceAge{AgeNS: int64(now.Sub(r.at)), Config: r.config}
	}
	return out
}

// fenceRound runs the fencing round of term on this leader: it asks
// every voter of its configuration and returns, once a majority
// answered, the latest receipt of each node whose receipt carries this
// configuration's index, on this node's clock. A receipt's time is the
// answer's arrival less the age the voter gave: no earlier than the
// receipt, clock rates apart. ok is false without a majority.
func (m *Meta) fenceRound(ctx context.Context, term uint64) (seen map[string]time.Time, ok bool) {
	f := m.raft.GetConfiguration()
	if f.Error() != nil {
		return nil, false
	}
	voters := voterServers(f.Configuration())
	_, config := voterSet(f.Configuration())
	if len(voters) == 0 {
		return nil, false
	}
	type answer struct {
		arrived time.Time
		reply   fenceReply
		err     error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan answer, len(voters))
	for _, v := range voters {
		go func() {
			if string(v.ID) == m.cfg.NodeID {
				ch <- answer{arrived: time.Now(), reply: m.fenceLocal(term)}
				return
			}
			var resp response
			err := m.pool.call(ctx, string(v.ID), string(v.Address), typeFence, &request{Term: term}, &resp)
			if err == nil {
				err = resp.Err.err()
			}
			if err == nil && resp.Fence == nil {
				err = fmt.Errorf("%w: fencing answered without a reply", ErrBadFrame)
			}
			a := answer{arrived: time.Now(), err: err}
			if err == nil {
				a.reply = *resp.Fence
			}
			ch <- a
		}()
	}
	best := map[string]receipt{}
	answered := 0
	for range voters {
		a := <-ch
		if a.err != nil {
			m.log.Debug("meta: fencing round", "node", m.cfg.NodeID, "term", term, "error", a.err)
			continue
		}
		answered++
		for node, r := range a.reply.Receipts {
			at := a.arrived.Add(-time.Duration(max(r.AgeNS, 0)))
			if at.After(best[node].at) {
				best[node] = receipt{at: at, config: r.Config}
			}
		}
		if answered > len(voters)/2 {
			break
		}
	}
	if answered <= len(voters)/2 {
		return nil, false
	}
	seen = map[string]time.Time{}
	for node, r := range best {
		if r.config == config {
			seen[node] = r.at
		}
	}
	return seen, true
}

// markVoters marks the heartbeat on every voter of this node's
// configuration but leader (whose heartbeat marks it; "" marks every
// voter), on this node itself directly, and sends each answer's fence,
// by voter, on the returned channel. The marks run until deadline, or
// until every voter answered, whether or not the caller still reads the
// answers: a voter that records a mark late still keeps the node's
// receipts fresh for the next fencing round.
func (m *Meta) markVoters(deadline time.Time, leader string, config uint64) <-chan voterFence {
	f := m.raft.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	ctx, cancel := context.WithDeadline(m.ctx, deadline)
	var wg sync.WaitGroup
	defer func() {
		go func() {
			wg.Wait()
			cancel()
		}()
	}()
	voters := slices.DeleteFunc(voterServers(f.Configuration()), func(s raft.Server) bool { return string(s.ID) == leader })
	ch := make(chan voterFence, len(voters))
	for _, v := range voters {
		if string(v.ID) == m.cfg.NodeID {
			ch <- voterFence{v.ID, m.mark(m.cfg.NodeID, config).Fence, nil}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var resp response
			err := m.pool.call(ctx, string(v.ID), string(v.Address), typeMark, &request{Node: m.cfg.NodeID, Config: config}, &resp)
			if err == nil {
				err = resp.Err.err()
			}
			if err == nil && resp.Mark == nil {
				err = fmt.Errorf("%w: mark answered without a reply", ErrBadFrame)
			}
			vf := voterFence{voter: v.ID, err: err}
			if err == nil {
				vf.fence = resp.Mark.Fence
			}
			ch <- vf
		}()
	}
	return ch
}

// voterFence is one voter's answer to a mark.
type voterFence struct {
	voter raft.ServerID
	fence uint64
	err   error
}

// backed waits for the marks on ch (at most n of them) until the
// leader's answer b is backed by a majority of its voters that recorded
// the heartbeat with a fence no later than its term, and reports
// whether it is, and whether a voter refused the mark as a frame it
// does not know (a voter of the version before marks). The leader's own
// mark counts, with b.Fence.
func backed(ctx context.Context, leader string, b beatReply, ch <-chan voterFence, n int) (ok, old bool) {
	voters := make(map[string]bool, len(b.Voters))
	for _, v := range b.Voters {
		voters[v] = true
	}
	need := len(b.Voters)/2 + 1
	got := 0
	if voters[leader] && b.Fence <= b.Term {
		got++
	}
	for ; got < need && n > 0; n-- {
		select {
		case vf := <-ch:
			if vf.err == nil && voters[string(vf.voter)] && vf.fence <= b.Term {
				got++
			}
			if errors.Is(vf.err, ErrBadFrame) {
				old = true
			}
		case <-ctx.Done():
			return false, old
		}
	}
	return got >= need, old
}

// sawRenewal notes when this node applied a renewal of node: the
// renewal was sent before, and a leader that applied it counts the node
// as seen no earlier (see startTerm). While this node leads, the renewal
// is also a receipt of its term.
func (m *Meta) sawRenewal(node string) {
	now := time.Now()
	m.rmu.Lock()
	m.renewedAt[node] = now
	m.rmu.Unlock()
	m.smu.Lock()
	if now.After(m.seen[node]) {
		m.seen[node] = now
	}
	m.smu.Unlock()
}

// sawRestore notes that this node restored a snapshot, whose renewals
// it applied without sawRenewal.
func (m *Meta) sawRestore() {
	m.rmu.Lock()
	m.restoredAt = time.Now()
	m.rmu.Unlock()
}

// lastRenewal returns when this node last applied a renewal of node, or
// restored a snapshot, whichever is later.
func (m *Meta) lastRenewal(node string) time.Time {
	m.rmu.Lock()
	defer m.rmu.Unlock()
	at := m.renewedAt[node]
	if m.restoredAt.After(at) {
		at = m.restoredAt
	}
	return at
}

// voterServers returns the voters of c.
func voterServers(c raft.Configuration) []raft.Server {
	var out []raft.Server
	for _, s := range c.Servers {
		if s.Suffrage == raft.Voter {
			out = append(out, s)
		}
	}
	return out
}

// voterSet returns the ids of c's voters, sorted, and their fingerprint
// (FNV-1a of the sorted ids, never 0): the "configuration" heartbeats
// and receipts carry. Majorities are of voters, so two configurations
// with the same voters are the same here. (Raft's configuration index is
// not what GetConfiguration returns: it leaves it 0.)
func voterSet(c raft.Configuration) (ids []string, fingerprint uint64) {
	for _, s := range voterServers(c) {
		ids = append(ids, string(s.ID))
	}
	slices.Sort(ids)
	h := fnv.New64a()
	for _, id := range ids {
		h.Write([]byte(id))
		h.Write([]byte{0})
	}
	return ids, max(h.Sum64(), 1)
}
