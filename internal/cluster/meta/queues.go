package meta

import (
	"cmp"
	"context"
	"fmt"
	"slices"

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
