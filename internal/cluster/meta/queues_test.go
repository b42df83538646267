package meta

import (
	"errors"
	"slices"
	"testing"

	"github.com/courier-mq/courier/wire"
)

// TestPlaceReplicas: a durable task exchange is placed on distinct live
// nodes, those with the fewest replicas first, its preferred leader
// (listed first) the node leading the fewest; the default is 3 with
// three or more live nodes, every live node with fewer; a count above
// the live nodes is refused; a re-homing leaves replicated queues
// alone; the queue's leader records itself, fenced by the group's term.
func TestPlaceReplicas(t *testing.T) {
	f := newFSM(nil, 1<<20)
	i := uint64(0)
	next := func() uint64 { i++; return i }
	declare := func(name string, replicas int) (Exchange, error) {
		t.Helper()
		cfg := wire.ExchangeConfig{Pattern: wire.PatternTasks, Replicas: replicas}
		r, _ := f.apply(next(), &command{Op: opDeclare, Name: name, Config: &cfg, Home: "a"})
		if r.Err != nil {
			return Exchange{}, r.Err
		}
		return *r.Exchange, nil
	}
	// No liveness yet: the declaring node alone.
	q0, err := declare("q0", 0)
	if err != nil || q0.Replicas != "a" || q0.Config.Replicas != 1 || q0.Group != q0.Index || q0.Home != "a" {
		t.Fatalf("q0 placed as %+v, %v", q0, err)
	}
	for _, n := range []string{"a", "b", "c", "d"} {
		f.apply(next(), &command{Op: opRenew, Name: n})
	}
	q1, err := declare("q1", 0)
	if err != nil || q1.Config.Replicas != 3 || q1.Replicas != "b,c,d" || q1.Home != "b" {
		t.Fatalf("q1 placed as %+v, %v", q1, err)
	}
	// Every node holds one replica: a, b, c by name; c leads none.
	q2, err := declare("q2", 3)
	if err != nil || q2.Replicas != "c,b,a" {
		t.Fatalf("q2 placed on %q, %v", q2.Replicas, err)
	}
	q3, err := declare("q3", 1)
	if err != nil || q3.Replicas != "d" {
		t.Fatalf("q3 placed on %q, %v", q3.Replicas, err)
	}
	if _, err := declare("q5", 5); !isCode(err, wire.CodeUnavailable) {
		t.Fatalf("5 replicas on 4 nodes: %v", err)
	}
	// A later declaration with 0 matches the number recorded; another
	// number clashes.
	if _, err := declare("q1", 0); err != nil {
		t.Fatalf("q1 again: %v", err)
	}
	if _, err := declare("q1", 2); !isCode(err, wire.CodeClash) {
		t.Fatalf("q1 with 2: %v", err)
	}
	// Fewer live nodes than the default: one replica on each.
	f.apply(next(), &command{Op: opBump, Name: "c", Epoch: 1, Renewed: f.st.Nodes["c"].Renewed})
	f.apply(next(), &command{Op: opBump, Name: "d", Epoch: 1, Renewed: f.st.Nodes["d"].Renewed})
	q4, err := declare("q4", 0)
	if err != nil || q4.Config.Replicas != 2 {
		t.Fatalf("q4 with 2 live nodes: %+v, %v", q4, err)
	}
	// A transient task exchange is not replicated.
	cfg := wire.ExchangeConfig{Pattern: wire.PatternTasks, Transient: true}
	if r, _ := f.apply(next(), &command{Op: opDeclare, Name: "t", Config: &cfg, Home: "a"}); r.Err != nil || r.Exchange.Replicated() {
		t.Fatalf("transient: %+v", r)
	}
	// Re-homing d's exchanges leaves q3 (replicated) where it is.
	if r, _ := f.apply(next(), &command{Op: opRehome, Name: "d"}); r.Err != nil || f.st.Exchanges["q3"].Home != "d" {
		t.Fatalf("rehome moved a replicated queue: %+v %+v", r, f.st.Exchanges["q3"])
	}

	// The leader records itself; an older or equal term, another group
	// or a node that is not a replica is stale.
	lead := func(name, node string, group, term uint64) error {
		r, _ := f.apply(next(), &command{Op: opQueueLeader, Name: name, Home: node, Group: group, Epoch: term})
		return r.Err
	}
	if err := lead("q1", "c", q1.Group, 2); err != nil || f.st.Exchanges["q1"].Home != "c" || f.st.Exchanges["q1"].LeaderTerm != 2 {
		t.Fatalf("leader c: %v %+v", err, f.st.Exchanges["q1"])
	}
	for _, tc := range []struct {
		node        string
		group, term uint64
	}{{"d", q1.Group, 2}, {"b", q1.Group + 1, 3}, {"a", q1.Group, 3}} {
		if err := lead("q1", tc.node, tc.group, tc.term); !errors.Is(err, ErrStale) {
			t.Errorf("leader %+v: %v, want stale", tc, err)
		}
	}
	if ex := f.st.Exchanges["q1"]; ex.Home != "c" {
		t.Fatalf("q1 homed on %s after stale leaders", ex.Home)
	}
	if err := lead("q1", "d", q1.Group, 3); err != nil || f.st.Exchanges["q1"].Home != "d" {
		t.Fatalf("leader d in term 3: %v", err)
	}
}

func isCode(err error, code wire.Code) bool {
	var we *wire.Error
	return errors.As(err, &we) && we.Code == code
}

// TestQueueMembership: adding and removing a replicated queue's
// replicas, one change at a time, through the record; the refusals
// (a change under way, a node not live, the last replica, a group left
// without a majority of live voters); the leader reports a change done;
// a leadership move request is fenced by the term.
func TestQueueMembership(t *testing.T) {
	f := newFSM(nil, 1<<20)
	i := uint64(0)
	next := func() uint64 { i++; return i }
	for _, n := range []string{"a", "b", "c", "d"} {
		f.apply(next(), &command{Op: opRenew, Name: n})
	}
	cfg := wire.ExchangeConfig{Pattern: wire.PatternTasks, Replicas: 3}
	r, _ := f.apply(next(), &command{Op: opDeclare, Name: "q", Config: &cfg, Home: "a"})
	if r.Err != nil || r.Exchange.Replicas != "a,b,c" {
		t.Fatalf("declare: %+v", r)
	}
	g := r.Exchange.Group
	if r, _ := f.apply(next(), &command{Op: opQueueLeader, Name: "q", Home: "a", Group: g, Epoch: 2}); r.Err != nil {
		t.Fatal(r.Err)
	}
	member := func(node string, remove bool) error {
		r, changes := f.apply(next(), &command{Op: opQueueMember, Name: "q", Group: g, Member: node, Remove: remove})
		if r.Err == nil && (len(changes) != 1 || changes[0].Kind != ReplicasChanged) {
			t.Fatalf("changes %+v", changes)
		}
		return r.Err
	}
	done := func(by, node string, remove bool) error {
		r, _ := f.apply(next(), &command{Op: opQueueMemberDone, Name: "q", Group: g, Member: node, Remove: remove, Home: by})
		return r.Err
	}
	q := func() Exchange { return f.st.Exchanges["q"] }

	// A replica already there: made a voter if it is not (the leader
	// finds it is, and reports done); the list is unchanged.
	if err := member("a", false); err != nil || q().Change != "+a" || q().Replicas != "a,b,c" {
		t.Fatalf("add a replica already there: %v %+v", err, q())
	}
	if err := done("a", "a", false); err != nil || q().Change != "" || q().Config.Replicas != 3 {
		t.Fatalf("promote a done: %v %+v", err, q())
	}
	if err := member("e", false); !isCode(err, wire.CodeBadOptions) {
		t.Fatalf("add an unknown node: %v", err)
	}
	if err := member("d", false); err != nil || q().Replicas != "a,b,c,d" || q().Change != "+d" || !slices.Equal(q().Voters(), []string{"a", "b", "c"}) {
		t.Fatalf("add d: %v %+v", err, q())
	}
	if err := member("b", true); !isCode(err, wire.CodeClash) {
		t.Fatalf("remove during an add: %v", err)
	}
	if err := done("b", "d", false); !errors.Is(err, ErrStale) {
		t.Fatalf("done from a node that does not lead: %v", err)
	}
	if err := done("a", "d", false); err != nil || q().Change != "" || q().Config.Replicas != 4 || len(q().Voters()) != 4 {
		t.Fatalf("add d done: %v %+v", err, q())
	}
	if err := done("a", "d", false); !errors.Is(err, ErrStale) {
		t.Fatalf("done twice: %v", err)
	}

	// Remove d, then cancel an add of d by removing it.
	if err := member("d", true); err != nil || q().Change != "-d" || q().Replicas != "a,b,c,d" {
		t.Fatalf("remove d: %v %+v", err, q())
	}
	if err := done("a", "d", true); err != nil || q().Replicas != "a,b,c" || q().Config.Replicas != 3 {
		t.Fatalf("remove d done: %v %+v", err, q())
	}
	if err := member("d", false); err != nil {
		t.Fatal(err)
	}
	if err := member("d", true); err != nil || q().Change != "-d" {
		t.Fatalf("cancel the add of d: %v %+v", err, q())
	}
	if err := done("a", "d", true); err != nil || q().Replicas != "a,b,c" {
		t.Fatalf("cancel done: %v %+v", err, q())
	}

	// With c down: removing a leaves b alone of {b, c}: refused; c
	// itself can go (a and b stay, both live).
	f.apply(next(), &command{Op: opBump, Name: "c", Epoch: 1, Renewed: f.st.Nodes["c"].Renewed})
	if err := member("a", true); !isCode(err, wire.CodeNotAllowed) {
		t.Fatalf("remove a with c down: %v", err)
	}
	if err := member("c", true); err != nil {
		t.Fatalf("remove c (down): %v", err)
	}
	if err := done("a", "c", true); err != nil {
		t.Fatal(err)
	}
	// {a, b} with b down: a alone cannot commit the change.
	f.apply(next(), &command{Op: opBump, Name: "b", Epoch: 1, Renewed: f.st.Nodes["b"].Renewed})
	if err := member("b", true); !isCode(err, wire.CodeNotAllowed) {
		t.Fatalf("remove b of {a, b}, b down: %v", err)
	}
	f.apply(next(), &command{Op: opRenew, Name: "b"})
	if err := member("b", true); err != nil {
		t.Fatalf("remove b of {a, b}, both live: %v", err)
	}
	if err := done("a", "b", true); err != nil || q().Replicas != "a" {
		t.Fatal(err, q())
	}
	if err := member("a", true); !isCode(err, wire.CodeNotAllowed) {
		t.Fatalf("remove the last replica: %v", err)
	}

	// Move requests: fenced by the term recorded, to a voter only.
	if err := member("b", false); err != nil {
		t.Fatal(err)
	}
	move := func(node string, term uint64) error {
		r, _ := f.apply(next(), &command{Op: opQueueMove, Name: "q", Group: g, Member: node, Epoch: term})
		return r.Err
	}
	if err := move("b", 2); !isCode(err, wire.CodeBadOptions) {
		t.Fatalf("move to a learner: %v", err)
	}
	if err := done("a", "b", false); err != nil {
		t.Fatal(err)
	}
	if err := move("b", 1); !errors.Is(err, ErrStale) {
		t.Fatalf("move in an old term: %v", err)
	}
	if err := move("b", 2); err != nil || q().MoveTo != "b" || q().MoveTerm != 2 {
		t.Fatalf("move: %v %+v", err, q())
	}
	if r, _ := f.apply(next(), &command{Op: opQueueMember, Name: "nope", Member: "b"}); !isCode(r.Err, wire.CodeNotFound) {
		t.Fatalf("unknown queue: %v", r.Err)
	}
}
