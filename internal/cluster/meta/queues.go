package meta

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/courier-mq/courier/wire"
)

// Replicated queues (issue 15, docs/replication.md "In the broker"). A
// durable task exchange declared in a cluster is one Raft group of the
// replica host of each of its replica nodes. The metadata group places
// it when it applies the declaration: it records the replica nodes and
// the group's id in the exchange's record, so that every node computes
// the same placement and learns it in log order. The group elects its
// own leader; the node whose replica leads records itself as the
// exchange's home ([Meta.QueueLeader]), fenced by the group's term.

// DefaultReplicas is a task exchange's replica count when the declaration
// names none, in a cluster of at least that many live nodes; a smaller
// cluster places a replica on every live node.
const DefaultReplicas = 3

// opQueueLeader records the node whose replica leads a queue's group.
const opQueueLeader = "queue-leader"

// Replicated reports whether the exchange is a replicated queue: one
// Raft group over its Replicas.
func (e Exchange) Replicated() bool { return e.Group != 0 }

// place chooses the replica nodes of a new task exchange declared on
// home, and fills cfg.Replicas with their number: want of them (0: the
// default), among the live nodes, those holding the fewest replicas
// first (ties by name). The first node listed is the preferred leader:
// of the nodes chosen, the one that is the preferred leader of the
// fewest groups. The order is deterministic, as every replica of the
// metadata group computes it.
func place(st *State, home string, cfg *wire.ExchangeConfig) ([]string, error) {
	live := liveNodes(st)
	if len(live) == 0 && home != "" {
		live = []string{home} // no liveness yet: the declaring node
	}
	n := cfg.Replicas
	if n == 0 {
		n = min(DefaultReplicas, len(live))
	}
	if n > len(live) {
		return nil, wire.Errorf(wire.CodeUnavailable, "replicas %d: the cluster has %d live nodes", n, len(live))
	}
	groups, leads := map[string]int{}, map[string]int{}
	for _, ex := range st.Exchanges {
		for i, r := range ex.ReplicaNodes() {
			groups[r]++
			if i == 0 {
				leads[r]++
			}
		}
	}
	slices.SortFunc(live, func(a, b string) int {
		return cmp.Or(cmp.Compare(groups[a], groups[b]), cmp.Compare(a, b))
	})
	chosen := slices.Clone(live[:n])
	first := 0
	for i, r := range chosen {
		if leads[r] < leads[chosen[first]] {
			first = i
		}
	}
	chosen[0], chosen[first] = chosen[first], chosen[0]
	cfg.Replicas = n
	return chosen, nil
}

// liveNodes lists the nodes whose liveness record is not expired, by
// name.
func liveNodes(st *State) []string {
	var out []string
	for name, n := range st.Nodes {
		if _, gone := st.Removed[name]; !n.Expired && !gone {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// applyQueueLeader records c.Home as the home of the replicated queue
// c.Name, led there in term c.Epoch of group c.Group: ignored (ErrStale)
// for another group (the exchange was deleted and declared again), a
// node that is not a replica, or a term not above the one recorded.
func applyQueueLeader(st *State, index uint64, c *command) (result, []Change) {
	ex, ok := st.Exchanges[c.Name]
	switch {
	case !ok:
		return result{Err: wire.Errorf(wire.CodeNotFound, "exchange %q not found", c.Name)}, nil
	case ex.Group != c.Group || !slices.Contains(ex.ReplicaNodes(), c.Home):
		return result{Err: fmt.Errorf("%w: %q is not a replica of group %d of %q", ErrStale, c.Home, c.Group, c.Name)}, nil
	case c.Epoch <= ex.LeaderTerm:
		return result{Exchange: &ex, Err: fmt.Errorf("%w: term %d of %q is not above %d", ErrStale, c.Epoch, c.Name, ex.LeaderTerm)}, nil
	}
	from := ex.Home
	ex.Home, ex.Homed, ex.LeaderTerm = c.Home, index, c.Epoch
	st.Exchanges[c.Name] = ex
	return result{Exchange: &ex}, []Change{{Index: index, Kind: ExchangeRehomed, Exchange: ex, From: from}}
}

// QueueLeader records this node as the home of the replicated queue
// exchange, whose group (id group) this node's replica leads in term:
// the home is where the queue is served. It fails with ErrStale when a
// later term was recorded, or the exchange is no longer that group's.
func (m *Meta) QueueLeader(ctx context.Context, exchange string, group, term uint64) error {
	_, err := m.apply(ctx, &command{Op: opQueueLeader, Name: exchange, Home: m.cfg.NodeID, Group: group, Epoch: term})
	return err
}

// Moving replicas (issue 15, item 4): the placement record is the
// truth. An operator's request changes the record; the replica that
// leads the queue's group carries the change out in the group and
// reports it done (node/replicas_ops.go). One membership change at a
// time per queue, in Exchange.Change.
const (
	// opQueueMove asks the leader of term Epoch to hand its leadership
	// to Member's replica.
	opQueueMove = "queue-move"
	// opQueueMember starts adding (or, with Remove, removing) Member.
	opQueueMember = "queue-member"
	// opQueueMemberDone ends the change of Member, sent by the queue's
	// leader (Home) once its group made it.
	opQueueMemberDone = "queue-member-done"
)

// replicated returns the replicated queue name of group (any group when
// 0), or the error to answer.
func replicated(st *State, name string, group uint64) (Exchange, error) {
	ex, ok := st.Exchanges[name]
	switch {
	case !ok:
		return ex, wire.Errorf(wire.CodeNotFound, "queue %q not found", name)
	case !ex.Replicated():
		return ex, wire.Errorf(wire.CodeNotAllowed, "queue %q is not replicated", name)
	case group != 0 && ex.Group != group:
		return ex, fmt.Errorf("%w: %q is no longer group %d", ErrStale, name, group)
	}
	return ex, nil
}

// applyQueueMove records a leadership move request.
func applyQueueMove(st *State, index uint64, c *command) (result, []Change) {
	ex, err := replicated(st, c.Name, c.Group)
	switch {
	case err != nil:
		return result{Err: err}, nil
	case ex.LeaderTerm == 0 || c.Epoch != ex.LeaderTerm:
		return result{Err: fmt.Errorf("%w: %q is led in term %d, not %d", ErrStale, c.Name, ex.LeaderTerm, c.Epoch)}, nil
	case !slices.Contains(ex.Voters(), c.Member):
		return result{Err: wire.Errorf(wire.CodeBadOptions, "node %q holds no voting replica of queue %q", c.Member, c.Name)}, nil
	}
	ex.MoveTo, ex.MoveTerm = c.Member, c.Epoch
	st.Exchanges[c.Name] = ex
	return result{Exchange: &ex}, []Change{{Index: index, Kind: ReplicasChanged, Exchange: ex}}
}

// majority is the number of votes a group of n voters needs.
func majority(n int) int { return n/2 + 1 }

// countLive counts the nodes of nodes in live.
func countLive(nodes, live []string) int {
	n := 0
	for _, x := range nodes {
		if slices.Contains(live, x) {
			n++
		}
	}
	return n
}

// applyQueueMember starts a membership change of a replicated queue.
func applyQueueMember(st *State, index uint64, c *command) (result, []Change) {
	ex, err := replicated(st, c.Name, c.Group)
	if err != nil {
		return result{Err: err}, nil
	}
	if c.Remove {
		err = canRemove(st, ex, c.Member)
	} else {
		err = canAdd(st, ex, c.Member)
	}
	if err != nil {
		return result{Err: err}, nil
	}
	switch {
	case c.Remove:
		ex.Change = "-" + c.Member
	case slices.Contains(ex.ReplicaNodes(), c.Member):
		ex.Change = "+" + c.Member // a learner promoted once caught up
	default:
		ex.Replicas += "," + c.Member
		ex.Change = "+" + c.Member
	}
	st.Exchanges[c.Name] = ex
	return result{Exchange: &ex}, []Change{{Index: index, Kind: ReplicasChanged, Exchange: ex}}
}

// canAdd says why node cannot be added to ex's replicas, nil if it can.
// A node already listed can: its replica, a voter already or a learner
// (one that lost data and rejoined), is made a voter once caught up.
func canAdd(st *State, ex Exchange, node string) error {
	nodes := ex.ReplicaNodes()
	switch {
	case ex.Change != "":
		return wire.Errorf(wire.CodeClash, "queue %q: a membership change is under way (%s); one at a time", ex.Name, ex.Change)
	case slices.Contains(nodes, node):
		return nil
	case !slices.Contains(liveNodes(st), node):
		return wire.Errorf(wire.CodeBadOptions, "node %q is not a live node of the cluster", node)
	case len(nodes) >= wire.MaxReplicas:
		return wire.Errorf(wire.CodeNotAllowed, "queue %q has %d replicas, the most a queue can have", ex.Name, len(nodes))
	}
	return nil
}

// canRemove says why node's replica cannot be removed from ex, nil if
// it can. A replica being added can always be: its change is cancelled.
// Otherwise the group must keep a voter, be able to commit the change
// (a majority of its voters live), and still have a majority of live
// voters without the one removed.
func canRemove(st *State, ex Exchange, node string) error {
	if ex.Change == "+"+node {
		return nil
	}
	if ex.Change != "" {
		return wire.Errorf(wire.CodeClash, "queue %q: a membership change is under way (%s); one at a time", ex.Name, ex.Change)
	}
	voters := ex.Voters()
	if !slices.Contains(voters, node) {
		return wire.Errorf(wire.CodeNotFound, "queue %q has no replica on %q", ex.Name, node)
	}
	rest := slices.DeleteFunc(slices.Clone(voters), func(n string) bool { return n == node })
	live := liveNodes(st)
	switch {
	case len(rest) == 0:
		return wire.Errorf(wire.CodeNotAllowed, "queue %q: %q holds its last replica, which cannot be removed (delete the queue instead)", ex.Name, node)
	case countLive(voters, live) < majority(len(voters)):
		return wire.Errorf(wire.CodeNotAllowed, "queue %q: only %d of its %d voters are live, fewer than the %d its group needs to commit the change",
			ex.Name, countLive(voters, live), len(voters), majority(len(voters)))
	case countLive(rest, live) < majority(len(rest)):
		return wire.Errorf(wire.CodeNotAllowed, "queue %q: without %q it would have %d live voters of %d, fewer than a majority (%d)",
			ex.Name, node, countLive(rest, live), len(rest), majority(len(rest)))
	}
	return nil
}

// applyQueueMemberDone ends the membership change of c.Member, reported
// by the queue's leader: an added replica is a voter; a removed one
// leaves the record.
func applyQueueMemberDone(st *State, index uint64, c *command) (result, []Change) {
	ex, err := replicated(st, c.Name, c.Group)
	if err != nil {
		return result{Err: err}, nil
	}
	want := "+" + c.Member
	if c.Remove {
		want = "-" + c.Member
	}
	switch {
	case ex.Change != want:
		return result{Err: fmt.Errorf("%w: queue %q's change is %q, not %q", ErrStale, c.Name, ex.Change, want)}, nil
	case c.Home != ex.Home:
		return result{Err: fmt.Errorf("%w: %q does not lead queue %q", ErrStale, c.Home, c.Name)}, nil
	}
	if c.Remove {
		nodes := slices.DeleteFunc(ex.ReplicaNodes(), func(n string) bool { return n == c.Member })
		ex.Replicas = strings.Join(nodes, ",")
		ex.Config.Replicas = len(nodes)
	} else {
		ex.Config.Replicas = len(ex.ReplicaNodes())
	}
	ex.Change = ""
	st.Exchanges[c.Name] = ex
	return result{Exchange: &ex}, []Change{{Index: index, Kind: ReplicasChanged, Exchange: ex}}
}

// MoveQueueLeader asks the replica that leads the replicated queue
// exchange in term (as the metadata records it) to hand its leadership
// to node's replica. ErrStale: the queue is led in another term now.
func (m *Meta) MoveQueueLeader(ctx context.Context, exchange string, group, term uint64, node string) error {
	_, err := m.apply(ctx, &command{Op: opQueueMove, Name: exchange, Group: group, Epoch: term, Member: node})
	return err
}

// ChangeQueueMember starts adding node as a replica of the replicated
// queue exchange (of group, any when 0), or removing it with remove. The
// queue's leader carries it out; the record's Change is "" once done.
// Refusals are *wire.Error values (see canAdd, canRemove).
func (m *Meta) ChangeQueueMember(ctx context.Context, exchange string, group uint64, node string, remove bool) (Exchange, error) {
	res, err := m.apply(ctx, &command{Op: opQueueMember, Name: exchange, Group: group, Member: node, Remove: remove})
	if err != nil {
		return Exchange{}, err
	}
	return *res.Exchange, nil
}

// QueueMemberDone reports, from the queue's leader, that its group made
// the membership change of node.
func (m *Meta) QueueMemberDone(ctx context.Context, exchange string, group uint64, node string, remove bool) error {
	_, err := m.apply(ctx, &command{Op: opQueueMemberDone, Name: exchange, Group: group, Member: node, Remove: remove, Home: m.cfg.NodeID})
	return err
}
