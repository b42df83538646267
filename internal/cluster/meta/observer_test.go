package meta

import (
	"fmt"
	"maps"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// mirror is an observer that keeps its own copy of the state, as a
// broker would keep its exchanges: changes applied one by one, and a
// restored state reconciled with Diff.
type mirror struct {
	mu       sync.Mutex
	st       State
	log      []string // kind and name of each change, in order
	restores int
}

func newMirror() *mirror { return &mirror{st: newState()} }

func (o *mirror) Apply(ch Change) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.apply(ch)
	if ch.Kind != NodeChanged {
		o.log = append(o.log, fmt.Sprintf("%d %s %s%s", ch.Index, ch.Kind, ch.Exchange.Name, ch.User.Name))
	}
}

func (o *mirror) apply(ch Change) {
	switch ch.Kind {
	case ExchangeDeclared, ExchangeRehomed:
		o.st.Exchanges[ch.Exchange.Name] = ch.Exchange
	case ExchangeDeleted:
		delete(o.st.Exchanges, ch.Exchange.Name)
	case UserPut, PermissionsChanged:
		o.st.Users[ch.User.Name] = ch.User
	case UserDeleted:
		delete(o.st.Users, ch.User.Name)
	case NodeChanged:
		if ch.Removed {
			delete(o.st.Nodes, ch.Node.Node)
		} else {
			o.st.Nodes[ch.Node.Node] = ch.Node
		}
	}
}

func (o *mirror) Restore(st State) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.restores++
	for _, ch := range Diff(o.st, st) {
		o.apply(ch)
	}
}

func (o *mirror) same(m *Meta) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := m.State()
	return maps.Equal(o.st.Exchanges, st.Exchanges) && reflect.DeepEqual(o.st.Users, st.Users)
}

// TestObserverSeesEveryChangeInOrder: every node's observer sees the
// same changes in the same order, and a node restarted from a snapshot
// reconciles its copy with Diff to the same state.
func TestObserverSeesEveryChangeInOrder(t *testing.T) {
	obs := map[string]*mirror{}
	c := newClusterWith(t, 3, func(id string) Observer {
		obs[id] = newMirror()
		return obs[id]
	})
	ctx := testutil.Context(t, 60*time.Second)
	m := c.follower()
	full := auth.FullAccess()
	hash, err := auth.HashPassword("a-password")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, _, err := m.Declare(ctx, fmt.Sprintf("ex.%d", i), wire.ExchangeConfig{Pattern: wire.PatternPubSub}, DeclareOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Delete(ctx, "ex.3"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.PutUser(ctx, "admin", auth.UserChange{PasswordHash: hash, Tags: []string{auth.TagAdministrator}, Permissions: &full}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetPermissions(ctx, "admin", auth.Permissions{Configure: auth.Patterns{"ex.#"}, Write: auth.Patterns{}, Read: auth.Patterns{}}); err != nil {
		t.Fatal(err)
	}
	// The observer of the node used has seen every change on return.
	if !obs[m.NodeID()].same(m) {
		t.Fatalf("observer of %s behind its Meta on return", m.NodeID())
	}
	for _, x := range c.running() {
		testutil.WaitForf(t, 10*time.Second, func() bool { return x.Applied() == m.Applied() }, "%s applies", x.NodeID())
	}
	var want []string
	for id, o := range obs {
		o.mu.Lock()
		got := append([]string(nil), o.log...)
		o.mu.Unlock()
		if want == nil {
			want = got
			if len(want) != 8 {
				t.Fatalf("%s saw %d changes: %v", id, len(want), want)
			}
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s saw %v, another node %v", id, got, want)
		}
	}

	// Restart a follower from a snapshot: its fresh observer gets the
	// state through Restore, then the entries after it through Apply.
	f := c.follower()
	if err := f.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Declare(ctx, "ex.after", wire.ExchangeConfig{Pattern: wire.PatternPubSub}, DeclareOptions{}); err != nil {
		t.Fatal(err)
	}
	id := f.NodeID()
	c.kill(id)
	obs[id] = newMirror()
	c.obs[id] = obs[id]
	g := c.start(id, 3)
	testutil.WaitForf(t, 20*time.Second, func() bool { _, ok := g.Exchange("ex.after"); return ok && obs[id].same(g) }, "restarted %s's observer reconciled", id)
	obs[id].mu.Lock()
	defer obs[id].mu.Unlock()
	if obs[id].restores != 1 {
		t.Fatalf("restored %d times, want 1", obs[id].restores)
	}
}

func TestDiff(t *testing.T) {
	old := newState()
	old.Exchanges["a"] = Exchange{Name: "a", Config: wire.ExchangeConfig{Pattern: "pubsub"}, Home: "n1", Index: 1}
	old.Exchanges["b"] = Exchange{Name: "b", Config: wire.ExchangeConfig{Pattern: "pubsub"}, Home: "n1", Index: 2}
	old.Exchanges["c"] = Exchange{Name: "c", Config: wire.ExchangeConfig{Pattern: "pubsub"}, Home: "n1", Index: 3}
	old.Users["u"] = auth.User{Name: "u", PasswordHash: "h"}
	next := old.clone()
	next.Index = 9
	delete(next.Exchanges, "a")
	next.Exchanges["b"] = Exchange{Name: "b", Config: wire.ExchangeConfig{Pattern: "pubsub"}, Home: "n2", Index: 2}
	next.Exchanges["c"] = Exchange{Name: "c", Config: wire.ExchangeConfig{Pattern: "reqresp", Strategy: "broadcast"}, Home: "n1", Index: 7}
	next.Exchanges["d"] = Exchange{Name: "d", Config: wire.ExchangeConfig{Pattern: "tasks"}, Home: "n1", Index: 8}
	next.Users["u"] = auth.User{Name: "u", PasswordHash: "h", Permissions: auth.FullAccess()}
	next.Users["v"] = auth.User{Name: "v", PasswordHash: "h2"}
	var got []string
	for _, ch := range Diff(old, next) {
		got = append(got, ch.Kind.String()+" "+ch.Exchange.Name+ch.User.Name)
	}
	want := []string{"exchange-deleted a", "exchange-deleted c", "exchange-rehomed b", "exchange-declared c", "exchange-declared d", "permissions-changed u", "user-put v"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Diff:\n got %v\nwant %v", got, want)
	}
	if len(Diff(next, next)) != 0 {
		t.Fatal("Diff of a state with itself is not empty")
	}
}
