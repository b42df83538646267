package broker

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/courier-mq/courier/wire"
)

// memCatalog is a catalog in one process: one lock orders the records,
// each applied to every broker of the cluster at once, as a Raft group
// with no lag would.
type memCatalog struct {
	mu      sync.Mutex
	brokers []*Broker
	records map[string]wire.ExchangeConfig
	applied []string // "+name" and "-name", in order
}

func (c *memCatalog) Declare(_ context.Context, name string, cfg wire.ExchangeConfig, user string, trusted bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.records[name]; ok {
		return nil
	}
	c.records[name] = cfg
	c.applied = append(c.applied, "+"+name)
	for _, b := range c.brokers {
		if err := b.ApplyDeclare(name, cfg, user, trusted); err != nil {
			return err
		}
	}
	return nil
}

func (c *memCatalog) Delete(_ context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.records[name]; !ok {
		return wire.Errorf(wire.CodeNotFound, "exchange %q not found", name)
	}
	delete(c.records, name)
	c.applied = append(c.applied, "-"+name)
	for _, b := range c.brokers {
		if err := b.ApplyDelete(name); err != nil {
			return err
		}
	}
	return nil
}

func (c *memCatalog) Sync(context.Context) error { return nil }

func newCatalogCluster(t *testing.T, names ...string) (*mesh, *memCatalog) {
	m := newMesh(t, names...)
	c := &memCatalog{records: map[string]wire.ExchangeConfig{}}
	for _, n := range names {
		c.brokers = append(c.brokers, m.brokers[n])
		m.brokers[n].SetCatalog(c)
	}
	return m, c
}

func TestCatalogDeclareAnywhere(t *testing.T) {
	m, c := newCatalogCluster(t, "a", "b", "c")
	rr := Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: RoundRobin}}
	if _, err := m.brokers["a"].Declare("users", rr); err != nil {
		t.Fatal(err)
	}
	for name, b := range m.brokers {
		ex := b.Exchange("users")
		if ex == nil || ex.cfg.Strategy != RoundRobin {
			t.Fatalf("node %s: exchange users = %v after a declare on a", name, ex)
		}
	}
	// The same declaration from another node matches; another pattern
	// clashes, wherever it comes from, and changes nothing.
	if _, err := m.brokers["b"].Declare("users", rr); err != nil {
		t.Errorf("the same declaration on b: %v", err)
	}
	ps := Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub}}
	if _, err := m.brokers["c"].Declare("users", ps); err == nil {
		t.Error("a pubsub declaration of a reqresp exchange on c: no error")
	}
	if len(c.applied) != 1 {
		t.Errorf("catalog records %v, want one", c.applied)
	}
	if err := m.brokers["c"].Delete("users"); err != nil {
		t.Fatal(err)
	}
	for name, b := range m.brokers {
		if b.Exchange("users") != nil {
			t.Errorf("node %s still has users after a delete on c", name)
		}
	}
	var we *wire.Error
	if err := m.brokers["a"].Delete("users"); !errors.As(err, &we) || we.Code != wire.CodeNotFound {
		t.Errorf("deleting it again: %v, want not found", err)
	}
}

func TestCatalogRefusesGoFuncs(t *testing.T) {
	m, c := newCatalogCluster(t, "a", "b")
	spec := Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: StickyFun},
		KeyFunc: func(*RouteInput) string { return "" }}
	if _, err := m.brokers["a"].Declare("f", spec); !errors.Is(err, ErrFuncsInCluster) {
		t.Errorf("a Go key function in a cluster: %v, want ErrFuncsInCluster", err)
	}
	if len(c.applied) != 0 || m.brokers["b"].Exchange("f") != nil {
		t.Errorf("refused declaration recorded: %v", c.applied)
	}
}

// A declaration the catalog refuses, or cannot record, leaves no
// exchange anywhere and returns the catalog's reason.
func TestCatalogUnavailable(t *testing.T) {
	m := newMesh(t, "a")
	m.brokers["a"].SetCatalog(downCatalog{})
	_, err := m.brokers["a"].Declare("x", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub}})
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.CodeUnavailable {
		t.Fatalf("declare without a quorum: %v, want code %d", err, wire.CodeUnavailable)
	}
	if m.brokers["a"].Exchange("x") != nil {
		t.Error("exchange x exists after a refused declaration")
	}
}

type downCatalog struct{}

func (downCatalog) Declare(context.Context, string, wire.ExchangeConfig, string, bool) error {
	return errors.New("no quorum")
}
func (downCatalog) Delete(context.Context, string) error { return errors.New("no quorum") }
func (downCatalog) Sync(context.Context) error           { return nil }

func TestCatalogRefusesTasks(t *testing.T) {
	m, c := newCatalogCluster(t, "a", "b")
	_, err := m.brokers["a"].Declare("jobs", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternTasks}})
	if !errors.Is(err, ErrTasksInCluster) {
		t.Errorf("a task exchange in a cluster: %v, want ErrTasksInCluster", err)
	}
	if len(c.applied) != 0 {
		t.Errorf("refused declaration recorded: %v", c.applied)
	}
}

// lagCatalog is a memCatalog whose deletes reach one broker only when
// it syncs (or the catalog records something else), as a Raft follower
// that has not applied the latest entries yet.
type lagCatalog struct {
	*memCatalog
	lag     *Broker
	pending []string
}

func (c *lagCatalog) catchUp() {
	for _, name := range c.pending {
		c.lag.ApplyDelete(name)
	}
	c.pending = nil
}

func (c *lagCatalog) Declare(ctx context.Context, name string, cfg wire.ExchangeConfig, user string, trusted bool) error {
	c.catchUp()
	return c.memCatalog.Declare(ctx, name, cfg, user, trusted)
}

func (c *lagCatalog) Delete(_ context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.records[name]; !ok {
		return wire.Errorf(wire.CodeNotFound, "exchange %q not found", name)
	}
	delete(c.records, name)
	for _, b := range c.brokers {
		if b != c.lag {
			b.ApplyDelete(name)
		}
	}
	c.pending = append(c.pending, name)
	return nil
}

func (c *lagCatalog) Sync(context.Context) error {
	c.catchUp()
	return nil
}

// A declare on a node that lags behind a delete made elsewhere must not
// answer from the exchange it still holds: the exchange is gone from the
// cluster, and a declare that returns must leave it declared
// (linearizable, docs/cluster.md "What each operation promises"). The
// fault tests found it: a declare answered OK on a lagging node, then a
// delete on another node found nothing.
func TestCatalogDeclareOnLaggingNode(t *testing.T) {
	m, mc := newCatalogCluster(t, "a", "b")
	c := &lagCatalog{memCatalog: mc, lag: m.brokers["b"]}
	for _, b := range m.brokers {
		b.SetCatalog(c)
	}
	ps := Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub}}
	if _, err := m.brokers["a"].Declare("prices", ps); err != nil {
		t.Fatal(err)
	}
	if err := m.brokers["a"].Delete("prices"); err != nil {
		t.Fatal(err)
	}
	if m.brokers["b"].Exchange("prices") == nil {
		t.Fatal("the test needs b to lag behind the delete")
	}
	if _, err := m.brokers["b"].Declare("prices", ps); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.records["prices"]; !ok {
		t.Fatal("a declare on b returned, but the cluster has no exchange prices")
	}
	// A passive declare (a get) is a linearizable read too.
	if err := m.brokers["a"].Delete("prices"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.brokers["b"].Declare("prices", Spec{Passive: true}); err == nil {
		t.Error("a passive declare on b found prices after it was deleted on a")
	}
}

// syncCounter is a memCatalog that counts its syncs and judges a
// declaration as made (a MatchingCatalog), as the metadata group does.
type syncCounter struct {
	*memCatalog
	syncs int
	// lag, if set, is a broker the catalog's declares do not reach
	// (a node behind the log).
	lag *Broker
}

func (c *syncCounter) Sync(context.Context) error {
	c.syncs++
	return nil
}

func (c *syncCounter) DeclareMatching(ctx context.Context, name string, cfg, match wire.ExchangeConfig, user string, trusted bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rec, ok := c.records[name]; ok {
		if err := rec.Clash(name, match); err != nil {
			return err
		}
		for _, b := range c.brokers {
			if b.Exchange(name) == nil {
				b.ApplyDeclare(name, rec, user, trusted) // caught up as the call returns
			}
		}
		return nil
	}
	c.records[name] = cfg
	for _, b := range c.brokers {
		if b != c.lag {
			b.ApplyDeclare(name, cfg, user, trusted)
		}
	}
	return nil
}

// A declare of an exchange the node does not know goes to the catalog
// at once, whose log order decides (one round trip to the leader); one
// the node knows, or a passive one, syncs first and answers from the
// local copy. Options the client left out match what the exchange was
// declared with elsewhere, though the node fills in its defaults to
// create one.
func TestCatalogDeclareNewSkipsSync(t *testing.T) {
	m, mc := newCatalogCluster(t, "a", "b")
	c := &syncCounter{memCatalog: mc}
	for _, b := range m.brokers {
		b.SetCatalog(c)
	}
	ps := Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub}}
	if _, err := m.brokers["a"].Declare("prices", ps); err != nil {
		t.Fatal(err)
	}
	if c.syncs != 0 || len(mc.records) != 1 {
		t.Fatalf("a new exchange: %d syncs, %d records; want 0 and 1", c.syncs, len(mc.records))
	}
	if _, err := m.brokers["b"].Declare("prices", ps); err != nil {
		t.Fatal(err)
	}
	if c.syncs != 1 {
		t.Fatalf("a known exchange: %d syncs, want 1", c.syncs)
	}
	if _, err := m.brokers["a"].Declare("nothing", Spec{Passive: true}); err == nil || c.syncs != 2 {
		t.Fatalf("a passive declare of an unknown exchange: %v, %d syncs (want not found after a sync)", err, c.syncs)
	}
	// quotes is sticky, declared on a; b has not applied it yet. A
	// declare on b that names no strategy matches it, though b would
	// create a new one as broadcast; one naming another clashes.
	c.lag = m.brokers["b"]
	sticky := Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: "sticky"}}
	if _, err := m.brokers["a"].Declare("quotes", sticky); err != nil {
		t.Fatal(err)
	}
	if m.brokers["b"].Exchange("quotes") != nil {
		t.Fatal("the test needs b to lag")
	}
	ex, err := m.brokers["b"].Declare("quotes", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternReqResp}})
	if err != nil || ex.Config().Strategy != "sticky" {
		t.Fatalf("a declare without strategy on a lagging node: %v", err)
	}
	m.brokers["b"].ApplyDelete("quotes")
	rr := Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: "round-robin"}}
	if _, err := m.brokers["b"].Declare("quotes", rr); err == nil {
		t.Fatal("a clashing declare on a lagging node succeeded")
	}
}
