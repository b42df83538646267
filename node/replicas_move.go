package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/cluster/meta"
	"github.com/courier-mq/courier/wire"
)

// The operator's side of moving replicas: each call changes the
// metadata record and waits, reading the record, until the queue's
// leader made the change (replicas_ops.go).

// movePoll is how often an operator's call reads the record again.
const movePoll = 50 * time.Millisecond

// memberTime bounds one membership change of a grow or a shrink.
const memberTime = 2 * time.Minute

// ChangeMember implements admin.ReplicaSource: it starts the change in
// the record, then waits until the record says it is done.
func (s replicaSource) ChangeMember(ctx context.Context, queue, node string, remove bool) error {
	m, _ := s.ready()
	if m == nil {
		return wire.Errorf(wire.CodeUnavailable, "this node has not joined its cluster yet")
	}
	if info, ok := s.ReplicatedQueue(ctx, queue); ok && !remove {
		for _, mb := range info.Members {
			if mb.Node == node && mb.Known && mb.Voter {
				return wire.Errorf(wire.CodeClash, "queue %q already has a voting replica on %q", queue, node)
			}
		}
	}
	if ex, ok := m.Exchange(queue); ok && remove && ex.Change == "" {
		if err := keepsMajority(ex, node, s.liveNodes()); err != nil {
			return err
		}
	}
	ex, err := m.ChangeQueueMember(ctx, queue, 0, node, remove)
	if err != nil {
		return err
	}
	change := ex.Change
	for {
		cur, ok := m.Exchange(queue)
		switch {
		case !ok || cur.Group != ex.Group:
			return wire.Errorf(wire.CodeExchangeDeleted, "queue %q was deleted", queue)
		case cur.Change == "" && slices.Contains(cur.ReplicaNodes(), node) != remove:
			return nil
		case cur.Change != change:
			return wire.Errorf(wire.CodeClash, "queue %q: the change %s was replaced by %q", queue, change, cur.Change)
		}
		select {
		case <-ctx.Done():
			return wire.Errorf(wire.CodeTimeout, "queue %q: the change %s is still under way (%v); its leader goes on with it, see courier queues show %s",
				queue, change, ctx.Err(), queue)
		case <-time.After(movePoll):
		}
	}
}

// Grow implements admin.ReplicaSource.
func (s replicaSource) Grow(ctx context.Context, node string, even bool) []admin.MemberResult {
	return s.eachQueue(ctx, node, false, func(ex meta.Exchange) bool {
		n := len(ex.ReplicaNodes())
		return !slices.Contains(ex.ReplicaNodes(), node) && (!even || n%2 == 0)
	})
}

// Shrink implements admin.ReplicaSource.
func (s replicaSource) Shrink(ctx context.Context, node string) []admin.MemberResult {
	return s.eachQueue(ctx, node, true, func(ex meta.Exchange) bool {
		return slices.Contains(ex.ReplicaNodes(), node)
	})
}

// eachQueue adds (removes) node to (from) every replicated queue that
// pick selects, by name, one at a time.
func (s replicaSource) eachQueue(ctx context.Context, node string, remove bool, pick func(meta.Exchange) bool) []admin.MemberResult {
	m, _ := s.ready()
	if m == nil {
		return nil
	}
	var exs []meta.Exchange
	for _, ex := range m.Exchanges() {
		if ex.Replicated() && pick(ex) {
			exs = append(exs, ex)
		}
	}
	slices.SortFunc(exs, func(a, b meta.Exchange) int { return cmp.Compare(a.Name, b.Name) })
	out := make([]admin.MemberResult, 0, len(exs))
	for _, ex := range exs {
		res := admin.MemberResult{Queue: ex.Name, Node: node}
		if ctx.Err() != nil {
			res.Error = fmt.Sprintf("not tried: %v", ctx.Err())
		} else {
			cctx, cancel := context.WithTimeout(ctx, memberTime)
			if err := s.ChangeMember(cctx, ex.Name, node, remove); err != nil {
				res.Error = errText(err)
			}
			cancel()
		}
		out = append(out, res)
	}
	return out
}

// errText is an error's message, a wire error's without its code.
func errText(err error) string {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Msg
	}
	return err.Error()
}

// Rebalance implements admin.ReplicaSource: it plans moves of leaders
// from the live nodes leading the most replicated queues to the live
// voters of those queues leading the fewest, until no move brings two
// nodes' counts closer, then makes them at most parallel at a time.
func (s replicaSource) Rebalance(ctx context.Context, parallel int) (admin.Rebalance, error) {
	m, _ := s.ready()
	if m == nil {
		return admin.Rebalance{}, wire.Errorf(wire.CodeUnavailable, "this node has not joined its cluster yet")
	}
	live := s.liveNodes()
	exs := m.Exchanges()
	before := leaderCounts(exs, live)
	moves := planRebalance(exs, live)
	terms := map[string]meta.Exchange{}
	for _, ex := range exs {
		terms[ex.Name] = ex
	}
	for i := 0; i < len(moves); i += parallel {
		batch := moves[i:min(i+parallel, len(moves))]
		for k := range batch {
			ex := terms[batch[k].Queue]
			if err := m.MoveQueueLeader(ctx, ex.Name, ex.Group, ex.LeaderTerm, batch[k].To); err != nil {
				batch[k].Error = errText(err)
			}
		}
		s.awaitMoves(ctx, m, batch, terms)
	}
	return admin.Rebalance{Before: before, After: leaderCounts(m.Exchanges(), live), Moves: moves}, nil
}

// awaitMoves waits until each move of batch not failed yet is recorded
// (its target leads in a later term), or 30 s pass.
func (s replicaSource) awaitMoves(ctx context.Context, m *meta.Meta, batch []admin.Move, was map[string]meta.Exchange) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		pending := 0
		for k := range batch {
			mv := &batch[k]
			if mv.Error != "" {
				continue
			}
			cur, ok := m.Exchange(mv.Queue)
			switch {
			case !ok || cur.Group != was[mv.Queue].Group:
				mv.Error = "the queue was deleted"
			case cur.LeaderTerm > was[mv.Queue].LeaderTerm && cur.Home == mv.To:
			case cur.LeaderTerm > was[mv.Queue].LeaderTerm:
				mv.Error = fmt.Sprintf("%s leads it now", cur.Home)
			default:
				pending++
			}
		}
		if pending == 0 {
			return
		}
		select {
		case <-ctx.Done():
			for k := range batch {
				if cur, _ := m.Exchange(batch[k].Queue); batch[k].Error == "" && cur.LeaderTerm == was[batch[k].Queue].LeaderTerm {
					batch[k].Error = "the leader did not hand over within 30 s"
				}
			}
			return
		case <-time.After(movePoll):
		}
	}
}

// leaderCounts counts the replicated queues each live node leads.
func leaderCounts(exs []meta.Exchange, live map[string]bool) map[string]int {
	out := map[string]int{}
	for n := range live {
		out[n] = 0
	}
	for _, ex := range exs {
		if l := leaderOf(ex); ex.Replicated() && live[l] {
			out[l]++
		}
	}
	return out
}

// planRebalance plans the leadership moves of a rebalance: repeatedly,
// from the live node leading the most queues (ties by name), the first
// of its queues (by name) not moved yet that has a live voter leading
// at least two fewer moves to the one of them leading the fewest. Each
// move narrows the spread, so it ends; a queue moves at most once.
func planRebalance(exs []meta.Exchange, live map[string]bool) []admin.Move {
	counts := leaderCounts(exs, live)
	exs = slices.Clone(exs)
	slices.SortFunc(exs, func(a, b meta.Exchange) int { return cmp.Compare(a.Name, b.Name) })
	moved := map[string]bool{}
	var moves []admin.Move
	for {
		nodes := make([]string, 0, len(counts))
		for n := range counts {
			nodes = append(nodes, n)
		}
		slices.SortFunc(nodes, func(a, b string) int { return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b)) })
		mv, ok := nextMove(exs, nodes, counts, moved, live)
		if !ok {
			return moves
		}
		counts[mv.From]--
		counts[mv.To]++
		moved[mv.Queue] = true
		moves = append(moves, mv)
	}
}

// nextMove finds the next move of planRebalance, trying the most loaded
// nodes first.
func nextMove(exs []meta.Exchange, nodes []string, counts map[string]int, moved, live map[string]bool) (admin.Move, bool) {
	for _, from := range nodes {
		for _, ex := range exs {
			if !ex.Replicated() || leaderOf(ex) != from || moved[ex.Name] || ex.Change != "" {
				continue
			}
			to := ""
			for _, v := range ex.Voters() {
				if v != from && live[v] && counts[v] < counts[from]-1 && (to == "" || counts[v] < counts[to] || counts[v] == counts[to] && v < to) {
					to = v
				}
			}
			if to != "" {
				return admin.Move{Queue: ex.Name, From: from, To: to}, true
			}
		}
	}
	return admin.Move{}, false
}

// keepsMajority checks a removal of node's replica from ex against the
// nodes this node sees alive, as the metadata group checks it against
// its liveness table (which notices a death only once a lease expired):
// the group must commit the change and keep a majority of live voters.
func keepsMajority(ex meta.Exchange, node string, live map[string]bool) error {
	voters := ex.Voters()
	if !slices.Contains(voters, node) {
		return nil // the metadata group answers
	}
	count := func(nodes []string) int {
		n := 0
		for _, v := range nodes {
			if live[v] {
				n++
			}
		}
		return n
	}
	rest := slices.DeleteFunc(slices.Clone(voters), func(v string) bool { return v == node })
	switch {
	case len(rest) == 0:
		return nil // the metadata group refuses it
	case count(voters) < len(voters)/2+1:
		return wire.Errorf(wire.CodeNotAllowed, "queue %q: only %d of its %d voters are alive, fewer than the %d its group needs to commit the change",
			ex.Name, count(voters), len(voters), len(voters)/2+1)
	case count(rest) < len(rest)/2+1:
		return wire.Errorf(wire.CodeNotAllowed, "queue %q: without %q it would have %d live voters of %d, fewer than a majority (%d)",
			ex.Name, node, count(rest), len(rest), len(rest)/2+1)
	}
	return nil
}
