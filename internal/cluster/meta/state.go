package meta

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
)

// Exchange is an exchange as the metadata group holds it.
type Exchange struct {
	// Name is the exchange's name.
	Name string `json:"name"`
	// Config is its configuration as declared, the strategy filled in
	// with the default of its pattern.
	Config wire.ExchangeConfig `json:"config"`
	// DeclaredBy is the user who created it ("" for a trusted or
	// anonymous declarer).
	DeclaredBy string `json:"declared_by,omitempty"`
	// Home is the node that owns its member list: where it was declared,
	// or where the leader moved it when that node's lease expired.
	Home string `json:"home"`
	// Index is the Raft index of the command that created it.
	Index uint64 `json:"index"`
	// Homed is the Raft index of the command that gave it its Home (its
	// creation, or its last re-homing): it only grows, and fences what
	// a former home does with the exchange's members.
	Homed uint64 `json:"homed,omitempty"`
	// Replicas are the nodes that hold a replicated task exchange's
	// queue, comma-separated (node names have no comma), the preferred
	// leader first: see [Exchange.ReplicaNodes]. Group is the id of
	// their Raft group (the Index of the declaration), 0 for any other
	// exchange. LeaderTerm is the group's term in which Home, the node
	// whose replica leads, was recorded. Records from before replicated
	// queues have none of them. (A string keeps Exchange comparable.)
	Replicas   string `json:"replicas,omitempty"`
	Group      uint64 `json:"group,omitempty"`
	LeaderTerm uint64 `json:"leader_term,omitempty"`
	// Change is the membership change of a replicated queue under way,
	// one at a time: "+node" while node is added (listed in Replicas,
	// a learner until it caught up), "-node" while node is removed
	// (still listed until its group dropped it); "" when none. The
	// queue's leader carries it out (docs/queues.md, "Replicated
	// queues").
	Change string `json:"change,omitempty"`
	// MoveTo asks the replica that leads the queue in term MoveTerm to
	// hand its leadership to that node's replica (a rebalance): a later
	// term's leader ignores it.
	MoveTo   string `json:"move_to,omitempty"`
	MoveTerm uint64 `json:"move_term,omitempty"`
}

// Voters returns the replica nodes that vote in the queue's group as
// the metadata knows it: its replicas but one being added.
func (e Exchange) Voters() []string {
	nodes := e.ReplicaNodes()
	if joining, ok := strings.CutPrefix(e.Change, "+"); ok {
		nodes = slices.DeleteFunc(nodes, func(n string) bool { return n == joining })
	}
	return nodes
}

// ReplicaNodes returns the nodes of a replicated queue, the preferred
// leader first; none for any other exchange.
func (e Exchange) ReplicaNodes() []string {
	if e.Replicas == "" {
		return nil
	}
	return strings.Split(e.Replicas, ",")
}

// HomeEpoch is the fencing epoch of the exchange's home: Homed, or Index
// for a record from before Homed was kept.
func (e Exchange) HomeEpoch() uint64 { return max(e.Homed, e.Index) }

// Liveness is a node's record in the liveness table (CockroachDB-style
// epoch leases). A node renews it every [Config.RenewInterval]; when a
// renewal is overdue by [Config.LeaseDuration] the leader bumps Epoch and
// marks the record Expired, and a later renewal makes it live again in
// the new epoch. Everything a node does with the authority of its lease
// (a leader it appoints, a home it keeps) is fenced by its epoch.
type Liveness struct {
	Node string `json:"node"`
	// Epoch only grows; it starts at 1.
	Epoch uint64 `json:"epoch"`
	// Renewed is the Raft index of the last renewal: a bump names it, so
	// that a renewal applied in between cancels the bump.
	Renewed uint64 `json:"renewed"`
	// Expired is set by a bump and cleared by the next renewal.
	Expired bool `json:"expired,omitempty"`
}

// State is the whole replicated state: what a snapshot holds and what
// [Observer.Restore] receives. Maps are keyed by name.
type State struct {
	// Index is the Raft index of the last command applied.
	Index     uint64               `json:"index"`
	Exchanges map[string]Exchange  `json:"exchanges"`
	Users     map[string]auth.User `json:"users"`
	Nodes     map[string]Liveness  `json:"nodes"`
	// Removed lists the nodes forgotten with [Meta.Remove] that the
	// fabric still lists: the leader does not add them back. A node
	// leaves this list once the fabric no longer lists it, so a node of
	// that name that joins later is added as a new one.
	Removed map[string]uint64 `json:"removed,omitempty"`
}

func newState() State {
	return State{Exchanges: map[string]Exchange{}, Users: map[string]auth.User{}, Nodes: map[string]Liveness{}, Removed: map[string]uint64{}}
}

// clone returns a deep copy: observers may keep what they receive.
func (s State) clone() State {
	out := State{Index: s.Index, Exchanges: maps.Clone(s.Exchanges), Users: make(map[string]auth.User, len(s.Users)), Nodes: maps.Clone(s.Nodes)}
	if out.Exchanges == nil {
		out.Exchanges = map[string]Exchange{}
	}
	if out.Nodes == nil {
		out.Nodes = map[string]Liveness{}
	}
	out.Removed = maps.Clone(s.Removed)
	if out.Removed == nil {
		out.Removed = map[string]uint64{}
	}
	for k, u := range s.Users {
		out.Users[k] = cloneUser(u)
	}
	return out
}

func cloneUser(u auth.User) auth.User {
	u.Tags = slices.Clone(u.Tags)
	u.Permissions = auth.Permissions{
		Configure: slices.Clone(u.Permissions.Configure),
		Write:     slices.Clone(u.Permissions.Write),
		Read:      slices.Clone(u.Permissions.Read),
	}
	return u
}

// ChangeKind says what a [Change] changed.
type ChangeKind uint8

// Kinds of changes.
const (
	// ExchangeDeclared: Exchange was created.
	ExchangeDeclared ChangeKind = iota + 1
	// ExchangeDeleted: Exchange was deleted.
	ExchangeDeleted
	// ExchangeRehomed: Exchange moved from the node From to Exchange.Home.
	ExchangeRehomed
	// UserPut: User was created or its password hash or tags changed
	// (its permissions may have changed too).
	UserPut
	// UserDeleted: the user User.Name was deleted.
	UserDeleted
	// PermissionsChanged: only User's permissions changed.
	PermissionsChanged
	// NodeChanged: Node's epoch or expiry changed, or (Removed) it was
	// forgotten. Plain renewals are not reported.
	NodeChanged
	// ReplicasChanged: a replicated queue's replicas, membership change
	// under way or leadership move request changed (queues.go).
	ReplicasChanged
)

var kindNames = [...]string{"", "exchange-declared", "exchange-deleted", "exchange-rehomed", "user-put", "user-deleted", "permissions-changed", "node-changed", "replicas-changed"}

// String names the kind.
func (k ChangeKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Change is one change to the state, as [Observer.Apply] receives it.
type Change struct {
	// Index is the Raft index of the command that made it.
	Index uint64
	Kind  ChangeKind
	// Exchange is the exchange declared, deleted or re-homed.
	Exchange Exchange
	// From is the former home of a re-homed exchange.
	From string
	// User is the user put or whose permissions changed (only its Name
	// for UserDeleted).
	User auth.User
	// Node is the liveness record that changed; Removed is set when the
	// node was forgotten.
	Node    Liveness
	Removed bool
}

// Observer follows the state of the group on one node: the node wires it
// to its broker and its user store. Apply is called for every change, in
// log order, on every node; Restore with the whole state when the node
// loads a snapshot (at start, or when it fell too far behind the leader),
// after which Apply calls continue from State.Index. Both run on the
// group's apply goroutine: they must not call back into the Meta and
// should return quickly; a write returns to its caller only after the
// observer of the node it was made on has seen it.
type Observer interface {
	Apply(Change)
	Restore(State)
}

// Diff returns the changes that turn old into next, in a stable order
// (deletions first, then exchanges, users and nodes by name): an observer
// that keeps the last state it saw reconciles to a restored one by
// applying Diff(last, restored). Re-homing shows as ExchangeRehomed, a
// changed configuration as ExchangeDeleted then ExchangeDeclared.
func Diff(old, next State) []Change {
	var out []Change
	at := next.Index
	for _, name := range sortedKeys(old.Exchanges) {
		o := old.Exchanges[name]
		if n, ok := next.Exchanges[name]; !ok || n.Config != o.Config || n.Index != o.Index {
			out = append(out, Change{Index: at, Kind: ExchangeDeleted, Exchange: o})
		}
	}
	for _, name := range sortedKeys(old.Users) {
		if _, ok := next.Users[name]; !ok {
			out = append(out, Change{Index: at, Kind: UserDeleted, User: auth.User{Name: name}})
		}
	}
	for _, name := range sortedKeys(old.Nodes) {
		if _, ok := next.Nodes[name]; !ok {
			out = append(out, Change{Index: at, Kind: NodeChanged, Node: old.Nodes[name], Removed: true})
		}
	}
	for _, name := range sortedKeys(next.Exchanges) {
		n := next.Exchanges[name]
		o, ok := old.Exchanges[name]
		switch {
		case !ok || o.Config != n.Config || o.Index != n.Index:
			out = append(out, Change{Index: at, Kind: ExchangeDeclared, Exchange: n})
		case o.Home != n.Home:
			out = append(out, Change{Index: at, Kind: ExchangeRehomed, Exchange: n, From: o.Home})
		}
	}
	for _, name := range sortedKeys(next.Users) {
		n := next.Users[name]
		o, ok := old.Users[name]
		switch {
		case !ok || o.PasswordHash != n.PasswordHash || !slices.Equal(o.Tags, n.Tags):
			out = append(out, Change{Index: at, Kind: UserPut, User: cloneUser(n)})
		case !samePermissions(o.Permissions, n.Permissions):
			out = append(out, Change{Index: at, Kind: PermissionsChanged, User: cloneUser(n)})
		}
	}
	for _, name := range sortedKeys(next.Nodes) {
		n := next.Nodes[name]
		if o, ok := old.Nodes[name]; !ok || o.Epoch != n.Epoch || o.Expired != n.Expired {
			out = append(out, Change{Index: at, Kind: NodeChanged, Node: n})
		}
	}
	return out
}

func samePermissions(a, b auth.Permissions) bool {
	return slices.Equal(a.Configure, b.Configure) && slices.Equal(a.Write, b.Write) && slices.Equal(a.Read, b.Read)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, cmp.Compare[string])
	return keys
}
