package broker

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier/wire"
)

// meshSink is a test client's sink: it keeps the bodies of the MESSAGE
// frames by attachment, and queues every other frame.
type meshSink struct {
	mu    sync.Mutex
	msgs  map[uint32][]string
	n     atomic.Int64 // MESSAGE frames
	other chan *wire.Frame
}

func newMeshSink() *meshSink {
	return &meshSink{msgs: map[uint32][]string{}, other: make(chan *wire.Frame, 1<<15)}
}

func (k *meshSink) Deliver(f *wire.Frame) {
	if f.Type == wire.TypeMessage {
		k.mu.Lock()
		k.msgs[f.Attach] = append(k.msgs[f.Attach], string(f.Body))
		k.mu.Unlock()
		k.n.Add(1)
		f.Release()
		return
	}
	k.other <- f.Clone()
	f.Release()
}

// got returns the bodies attachment id received.
func (k *meshSink) got(id uint32) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.msgs[id]...)
}

// meshClient is a session of one mesh node, driven as a client would.
type meshClient struct {
	t     testing.TB
	b     *Broker
	s     *Session
	k     *meshSink
	ref   atomic.Uint64
	mu    sync.Mutex
	stash []*wire.Frame // frames read while waiting for another
}

func (m *mesh) client(node string) *meshClient {
	k := newMeshSink()
	b := m.brokers[node]
	c := &meshClient{t: m.t, b: b, s: b.Open(k, "test"), k: k}
	m.t.Cleanup(c.s.Close)
	return c
}

// waitFor returns the first frame that ok accepts, from what was
// stashed or arrives within 10s; the others are stashed.
func (c *meshClient) waitFor(what string, ok func(*wire.Frame) bool) *wire.Frame {
	c.t.Helper()
	f := c.poll(ok, 10*time.Second)
	if f == nil {
		c.t.Fatalf("no %s within 10s", what)
	}
	return f
}

// poll is waitFor, returning nil after wait.
func (c *meshClient) poll(ok func(*wire.Frame) bool, wait time.Duration) *wire.Frame {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, f := range c.stash {
		if ok(f) {
			c.stash = append(c.stash[:i], c.stash[i+1:]...)
			return f
		}
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case f := <-c.k.other:
			if ok(f) {
				return f
			}
			c.stash = append(c.stash, f)
		case <-timer.C:
			return nil
		}
	}
}

// send hands f to the session with a fresh Ref, and returns the Ref.
func (c *meshClient) send(f *wire.Frame) uint64 {
	f.Ref = c.ref.Add(1)
	ref := f.Ref
	c.s.Handle(f)
	return ref
}

// reply waits for the OK or ERROR of ref.
func (c *meshClient) reply(ref uint64) *wire.Frame {
	c.t.Helper()
	return c.waitFor(fmt.Sprintf("reply to %d", ref), func(f *wire.Frame) bool {
		return (f.Type == wire.TypeOK || f.Type == wire.TypeError) && f.Ref == ref
	})
}

// must waits for the OK of ref, failing on an ERROR.
func (c *meshClient) must(ref uint64) *wire.Frame {
	c.t.Helper()
	f := c.reply(ref)
	if f.Type == wire.TypeError {
		c.t.Fatalf("ref %d: ERROR %d %s", ref, f.Aux, f.Tag)
	}
	return f
}

func attachFrame(id uint32, exchange string, role uint64, patterns ...string) *wire.Frame {
	f := wire.NewFrame(wire.TypeAttach)
	f.Attach, f.Name, f.Aux = id, exchange, role
	f.Body = jsonBody(wire.AttachSpec{Patterns: patterns})
	return f
}

// subscribe attaches subscriber id to exchange with patterns and waits
// for its OK.
func (c *meshClient) subscribe(id uint32, exchange string, patterns ...string) {
	c.t.Helper()
	c.must(c.send(attachFrame(id, exchange, wire.RoleSubscriber, patterns...)))
}

func (c *meshClient) detach(id uint32) {
	c.t.Helper()
	f := wire.NewFrame(wire.TypeDetach)
	f.Attach = id
	c.must(c.send(f))
}

func (c *meshClient) publish(exchange, key, body string) {
	f := wire.NewFrame(wire.TypePublish)
	f.Name, f.Key, f.Body = exchange, key, []byte(body)
	c.send(f)
}

// declareEverywhere declares a pub-sub exchange on every node, and waits
// until each has answered the others' requests for its table (see
// pubsubDeclared).
func (m *mesh) declareEverywhere(name string, controlled bool) {
	m.t.Helper()
	for _, b := range m.brokers {
		if _, err := b.Declare(name, Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub, Controlled: controlled}}); err != nil {
			m.t.Fatal(err)
		}
	}
	m.settle()
}

// settle waits until no frame is in flight between the nodes.
func (m *mesh) settle() {
	m.t.Helper()
	waitUntil(m.t, "the links are quiet", m.quiet)
}

// waitUntil polls cond for up to 10s.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// linkStats returns b's pub-sub counters of its link to node.
func linkStats(b *Broker, node string) PeerPubSubStats {
	for _, s := range b.PeerPubSubStats() {
		if s.Node == node {
			return s
		}
	}
	return PeerPubSubStats{Node: node}
}

// The count: 50,000 subscribers spread over 5 nodes (10,000
// under the race detector) receive a publication as one RPUB per
// interested node, each subscriber once, however many of its node's
// patterns match.
func TestMeshOneCopyPerInterestedNode(t *testing.T) {
	nodes := []string{"a", "b", "c", "d", "e"}
	m := newMesh(t, nodes...)
	m.declareEverywhere("x", false)
	perNode := 10000
	if raceEnabled {
		perNode = 2000
	}
	const perClient = 2000 // under Config.MaxAttachments
	clients := map[string][]*meshClient{}
	for _, n := range nodes {
		for len(clients[n])*perClient < perNode {
			c := m.client(n)
			clients[n] = append(clients[n], c)
			for i := range uint32(perClient) {
				// Overlapping patterns: each subscriber matches once, and
				// so does each node.
				patterns := []string{"t.*"}
				switch i % 3 {
				case 1:
					patterns = append(patterns, "t.#")
				case 2:
					patterns = append(patterns, "*.1", "t.1")
				}
				c.subscribe(i+1, "x", patterns...)
			}
		}
	}
	// A node with interest in the other key only.
	only := m.client("e")
	only.subscribe(1, "x", "u.only")

	for _, from := range nodes {
		for _, to := range nodes {
			if from == to {
				continue
			}
			// One RSUB per pattern's first subscriber (t.*, t.#, *.1,
			// t.1, u.only), never one per subscriber; and one as x was
			// declared.
			if n := m.count(from, to, wire.TypeRSub); n > 6 {
				t.Errorf("%s→%s: %d RSUBs for %d subscribers, want ≤5", from, to, n, perNode)
			}
		}
	}

	clients["a"][0].publish("x", "t.1", "hello")
	total := int64(len(nodes) * perNode)
	delivered := func() int64 {
		var n int64
		for _, cs := range clients {
			for _, c := range cs {
				n += c.k.n.Load()
			}
		}
		return n
	}
	waitUntil(t, "every subscriber gets the publication", func() bool { return delivered() >= total })
	for _, to := range nodes[1:] {
		if n := m.count("a", to, wire.TypeRPub); n != 1 {
			t.Errorf("a→%s: %d RPUB, want 1", to, n)
		}
	}
	for _, n := range nodes {
		for _, c := range clients[n] {
			for i := range uint32(perClient) {
				if got := c.k.got(i + 1); len(got) != 1 || got[0] != "hello" {
					t.Fatalf("subscriber %d on %s got %q, want [hello] once", i+1, n, got)
				}
			}
		}
	}
	if got := delivered(); got != total {
		t.Errorf("%d deliveries, want %d", got, total)
	}
	if got := only.k.n.Load(); got != 0 {
		t.Errorf("the subscriber of u.only got %d messages", got)
	}
	st := linkStats(m.brokers["a"], "b")
	if st.PubsSent != 1 || st.PubBytesSent != uint64(len("t.1")+len("hello")) {
		t.Errorf("a's link to b: %+v, want 1 RPUB of 8 bytes", st)
	}
	if st := linkStats(m.brokers["b"], "a"); st.PubsReceived != 1 {
		t.Errorf("b's link to a: %+v, want 1 RPUB received", st)
	}
	t.Logf("%d subscribers on %d nodes: one publication on a sent %d RPUBs (a→b %d, a→c %d, a→d %d, a→e %d)",
		total, len(nodes), m.count("a", "b", wire.TypeRPub)+m.count("a", "c", wire.TypeRPub)+m.count("a", "d", wire.TypeRPub)+m.count("a", "e", wire.TypeRPub),
		m.count("a", "b", wire.TypeRPub), m.count("a", "c", wire.TypeRPub), m.count("a", "d", wire.TypeRPub), m.count("a", "e", wire.TypeRPub))

	// A key only e wants crosses one link.
	clients["b"][0].publish("x", "u.only", "just e")
	waitUntil(t, "e's subscriber gets u.only", func() bool { return only.k.n.Load() == 1 })
	for _, to := range []string{"a", "c", "d"} {
		if n := m.count("b", to, wire.TypeRPub); n != 0 {
			t.Errorf("b→%s: %d RPUB for a key only e wants", to, n)
		}
	}
	if n := m.count("b", "e", wire.TypeRPub); n != 1 {
		t.Errorf("b→e: %d RPUB, want 1", n)
	}
}

// A thousand local subscribers of one pattern cost one RSUB per node;
// the RUNSUB goes once the last leaves, and only then do publications
// stop crossing.
func TestMeshInterestRefcounted(t *testing.T) {
	m := newMesh(t, "a", "b")
	m.declareEverywhere("x", false)
	base := m.count("b", "a", wire.TypeRSub) // b's request for a's table of x, as it declared it
	sub := m.client("b")
	const n = 1000
	for i := range uint32(n) {
		sub.subscribe(i+1, "x", "k.#")
	}
	if got := m.count("b", "a", wire.TypeRSub) - base; got != 1 {
		t.Fatalf("%d RSUBs for %d subscribers of one pattern, want 1", got, n)
	}
	pub := m.client("a")
	for i := range uint32(n - 1) {
		sub.detach(i + 1)
	}
	if got := m.count("b", "a", wire.TypeRUnsub); got != 0 {
		t.Fatalf("RUNSUB sent with a subscriber left (%d)", got)
	}
	pub.publish("x", "k.1", "one")
	waitUntil(t, "the last subscriber gets it", func() bool { return len(sub.k.got(n)) == 1 })
	sub.detach(n)
	if got := m.count("b", "a", wire.TypeRUnsub); got != 1 {
		t.Fatalf("%d RUNSUBs after the last left, want 1", got)
	}
	waitUntil(t, "a forgets b's interest", func() bool { return linkStats(m.brokers["a"], "b").Patterns == 0 })
	pub.publish("x", "k.2", "two") // routed before publish returns
	if got := m.count("a", "b", wire.TypeRPub); got != 1 {
		t.Errorf("%d RPUBs a→b, want 1 (none after the RUNSUB)", got)
	}
	st := linkStats(m.brokers["b"], "a")
	if st.SubsSent != uint64(base)+1 || st.UnsubsSent != 1 {
		t.Errorf("b's counters: %+v, want %d RSUBs and 1 RUNSUB sent", st, base+1)
	}
	if st := linkStats(m.brokers["a"], "b"); st.SubsReceived != uint64(base)+1 || st.UnsubsReceived != 1 {
		t.Errorf("a's counters: %+v, want %d RSUBs and 1 RUNSUB received", st, base+1)
	}
}

// Several publishers on each of 3 nodes, subscribers on each: every
// subscriber gets every publisher's messages in the order published.
func TestMeshPerPublisherOrder(t *testing.T) {
	nodes := []string{"a", "b", "c"}
	m := newMesh(t, nodes...)
	m.declareEverywhere("x", false)
	var subs []*meshClient
	for _, n := range nodes {
		c := m.client(n)
		c.subscribe(1, "x", "o.#")
		c.subscribe(2, "x", "o.*", "#")
		subs = append(subs, c)
	}
	const perPublisher = 300
	var wg sync.WaitGroup
	publishers := 0
	for _, n := range nodes {
		for p := range 2 {
			pub := m.client(n)
			name := fmt.Sprintf("%s%d", n, p)
			publishers++
			wg.Go(func() {
				for i := range perPublisher {
					pub.publish("x", "o."+name, fmt.Sprintf("%s %d", name, i))
				}
			})
		}
	}
	wg.Wait()
	want := publishers * perPublisher
	for _, c := range subs {
		for id := uint32(1); id <= 2; id++ {
			waitUntil(t, "every message arrives", func() bool { return len(c.k.got(id)) >= want })
			next := map[string]int{}
			for _, body := range c.k.got(id) {
				name, seq, _ := strings.Cut(body, " ")
				i, _ := strconv.Atoi(seq)
				if i != next[name] {
					t.Fatalf("subscriber %d on %s: %s's message %d after %d", id, c.b.Node(), name, i, next[name]-1)
				}
				next[name]++
			}
			if len(c.k.got(id)) != want {
				t.Fatalf("subscriber %d on %s: %d messages, want %d", id, c.b.Node(), len(c.k.got(id)), want)
			}
		}
	}
}

// A publication on any node right after Subscribe returned reaches the
// subscriber: Subscribe waits for every node's RSUBACK.
func TestMeshPublishRightAfterSubscribe(t *testing.T) {
	m := newMesh(t, "a", "b", "c")
	m.declareEverywhere("x", false)
	sub := m.client("b")
	pa, pc := m.client("a"), m.client("c")
	const rounds = 300
	for i := range uint32(rounds) {
		key := fmt.Sprintf("r.%d", i)
		sub.subscribe(i+1, "x", key) // a new pattern each time: 0→1
		pa.publish("x", key, "from a")
		pc.publish("x", key, "from c")
	}
	for i := range uint32(rounds) {
		waitUntil(t, "both publications arrive", func() bool { return len(sub.k.got(i+1)) == 2 })
	}
}

// The OK of a subscribe waits for the RSUBACK of every node up, and no
// longer than that node is up.
func TestMeshSubscribeWaitsForAcks(t *testing.T) {
	m := newMesh(t, "a", "b", "c")
	m.declareEverywhere("x", false)
	sub := m.client("b")
	m.hold("a", "b") // a's RSUBACK waits on the link
	ref := sub.send(attachFrame(1, "x", wire.RoleSubscriber, "w.1"))
	waitUntil(t, "a installs b's interest", func() bool { return linkStats(m.brokers["a"], "b").Patterns == 1 })
	waitUntil(t, "c installs b's interest", func() bool { return linkStats(m.brokers["c"], "b").Patterns == 1 })
	if f := sub.poll(func(f *wire.Frame) bool { return f.Ref == ref }, 50*time.Millisecond); f != nil {
		t.Fatalf("subscribe answered (%s) before a's RSUBACK", f.Type)
	}
	m.release("a", "b")
	sub.must(ref)

	// A node that goes down is not waited for.
	m.hold("c", "b")
	ref = sub.send(attachFrame(2, "x", wire.RoleSubscriber, "w.2"))
	waitUntil(t, "c installs b's interest", func() bool { return linkStats(m.brokers["c"], "b").Patterns == 2 })
	if f := sub.poll(func(f *wire.Frame) bool { return f.Ref == ref }, 50*time.Millisecond); f != nil {
		t.Fatalf("subscribe answered (%s) before c's RSUBACK", f.Type)
	}
	m.cutLink("b", "c")
	sub.must(ref)

	// A second subscriber of a pattern whose RSUB is not yet
	// acknowledged waits too.
	m.hold("a", "b")
	ref1 := sub.send(attachFrame(3, "x", wire.RoleSubscriber, "w.3"))
	ref2 := sub.send(attachFrame(4, "x", wire.RoleSubscriber, "w.3"))
	if f := sub.poll(func(f *wire.Frame) bool { return f.Ref == ref1 || f.Ref == ref2 }, 50*time.Millisecond); f != nil {
		t.Fatalf("subscribe answered (%s ref %d) before a's RSUBACK", f.Type, f.Ref)
	}
	m.release("a", "b")
	sub.must(ref1)
	sub.must(ref2)
}

// A node whose link goes down loses its stand-ins; when it comes back
// it sends its whole table, and publications reach it again.
func TestMeshPeerDownAndUp(t *testing.T) {
	m := newMesh(t, "a", "b")
	m.declareEverywhere("x", false)
	m.declareEverywhere("y", false)
	sub := m.client("b")
	sub.subscribe(1, "x", "p.*", "q.#")
	sub.subscribe(2, "y", "#")
	pub := m.client("a")
	if got := linkStats(m.brokers["a"], "b").Patterns; got != 3 {
		t.Fatalf("a holds %d of b's patterns, want 3", got)
	}
	if got := m.brokers["a"].Exchange("x").Info().Subscribers; got != 0 {
		t.Errorf("a lists %d subscribers of x: another node's stand-in is none", got)
	}
	m.cutLink("a", "b")
	if got := linkStats(m.brokers["a"], "b"); got.Patterns != 0 || got.Up {
		t.Fatalf("after the cut a holds %+v of b", got)
	}
	pub.publish("x", "p.1", "lost")
	if n := m.count("a", "b", wire.TypeRPub); n != 0 {
		t.Fatalf("%d RPUB to a node that is down", n)
	}
	// Meanwhile b's interest changes: the table sent on the way up is
	// the one of now.
	sub.detach(2)
	sub.subscribe(3, "x", "z.z")
	rsubs := m.count("b", "a", wire.TypeRSub)
	m.heal("a", "b")
	if got := m.count("b", "a", wire.TypeRSub); got != rsubs+1 {
		t.Fatalf("%d RSUBs on the way up, want 1 (the table of x)", got-rsubs)
	}
	waitUntil(t, "a installs b's table", func() bool { return linkStats(m.brokers["a"], "b").Patterns == 3 })
	pub.publish("x", "p.2", "p2")
	pub.publish("x", "z.z", "zz")
	pub.publish("y", "any", "not any more")
	waitUntil(t, "the publications after the heal arrive", func() bool {
		return len(sub.k.got(1)) == 1 && len(sub.k.got(3)) == 1
	})
	if got := sub.k.got(1); got[0] != "p2" {
		t.Errorf("subscriber 1 got %q, want [p2]", got)
	}
	if n := m.count("a", "b", wire.TypeRPub); n != 2 {
		t.Errorf("%d RPUB after the heal, want 2 (none for y)", n)
	}
}

// A node cannot make another hold more than MaxPatternsPerPeer of its
// patterns per exchange: past it, its stand-in takes '#' (it gets every
// publication, and its own matching sorts them out).
func TestMeshPeerPatternsBounded(t *testing.T) {
	m := newMeshConfig(t, Config{MaxPatternsPerPeer: 10}, "a", "b")
	m.declareEverywhere("x", false)
	sub := m.client("b")
	for i := range uint32(10) {
		sub.subscribe(i+1, "x", fmt.Sprintf("k.%d", i))
	}
	if st := linkStats(m.brokers["a"], "b"); st.Patterns != 10 || st.Collapsed != 0 {
		t.Fatalf("a holds %+v of b", st)
	}
	sub.subscribe(11, "x", "k.10")
	waitUntil(t, "b's interest collapses to '#'", func() bool {
		st := linkStats(m.brokers["a"], "b")
		return st.Patterns == 1 && st.Collapsed == 1
	})
	pub := m.client("a")
	pub.publish("x", "k.10", "wanted")
	pub.publish("x", "other", "not wanted")
	waitUntil(t, "both cross", func() bool { return linkStats(m.brokers["b"], "a").PubsReceived == 2 })
	if got := sub.k.got(11); len(got) != 1 || got[0] != "wanted" {
		t.Errorf("subscriber 11 got %q", got)
	}
	if n := sub.k.n.Load(); n != 1 {
		t.Errorf("b's subscribers got %d messages, want 1", n)
	}

	// A hostile node's huge RSUB holds no more.
	c := m.brokers["a"]
	patterns := make([]string, 100000)
	for i := range patterns {
		patterns[i] = fmt.Sprintf("h.%d", i)
	}
	f := wire.NewFrame(wire.TypeRSub)
	f.Name, f.Body = "x", jsonBody(wire.PatternsBody{Patterns: patterns})
	before := c.PatternStats().Patterns
	c.FromPeer("b", f)
	if got := c.PatternStats().Patterns; got != before {
		t.Errorf("a collapsed stand-in grew from %d to %d patterns", before, got)
	}
	// And bad patterns are refused.
	f = wire.NewFrame(wire.TypeRSub)
	f.Name, f.Body = "x", []byte(`{"patterns":["a..b"]}`)
	m.brokers["b"].FromPeer("a", f)
	if st := linkStats(m.brokers["b"], "a"); st.Refused != 1 {
		t.Errorf("b's link to a: %+v, want 1 refused", st)
	}
}

// A hostile node's RSUBs, each under the cap, cannot take a node past
// it either.
func TestMeshPeerPatternsBoundedAcrossFrames(t *testing.T) {
	m := newMeshConfig(t, Config{MaxPatternsPerPeer: 100}, "a", "b")
	m.declareEverywhere("x", false)
	a := m.brokers["a"]
	for i := range 50 {
		f := wire.NewFrame(wire.TypeRSub)
		f.Name = "x"
		f.Body = jsonBody(wire.PatternsBody{Patterns: []string{fmt.Sprintf("h.%d.a", i), fmt.Sprintf("h.%d.b", i), fmt.Sprintf("h.%d.c", i)}})
		a.FromPeer("b", f)
	}
	if st := linkStats(a, "b"); st.Patterns != 1 || st.Collapsed != 1 {
		t.Errorf("a holds %+v of b, want '#' alone", st)
	}
	if got := a.PatternStats().Patterns; got != 1 {
		t.Errorf("a has %d patterns, want 1", got)
	}
}

// Publications for an exchange a node does not know are dropped and
// counted; interest in it is held for when it is declared there.
func TestMeshUnknownExchangeDropped(t *testing.T) {
	m := newMesh(t, "a", "b")
	b := m.brokers["b"]
	f := wire.NewFrame(wire.TypeRPub)
	f.Name, f.Key, f.Body = "nope", "k", []byte("x")
	b.FromPeer("a", f)
	f = wire.NewFrame(wire.TypeRSub)
	f.Ref, f.Name, f.Body = 7, "nope", []byte(`{"patterns":["#"]}`)
	b.FromPeer("a", f)
	st := linkStats(b, "a")
	if st.DroppedUnknown != 1 || st.PubsReceived != 1 {
		t.Errorf("b's link to a: %+v, want the RPUB dropped", st)
	}
	// The RSUB is acknowledged all the same, so that no subscribe waits
	// for a node that cannot take its interest.
	waitUntil(t, "RSUBACK", func() bool { return m.count("b", "a", wire.TypeRSubAck) == 1 })
}

// A durable subscription is a local subscriber of its node: its patterns
// are interest, and its queue gets the other nodes' publications.
func TestMeshDurableSubscription(t *testing.T) {
	m := newMesh(t, "a", "b")
	m.declareEverywhere("x", false)
	sub := m.client("b")
	f := wire.NewFrame(wire.TypeAttach)
	f.Attach, f.Name, f.Aux = 1, "x", wire.RoleSubscriber
	f.Body = jsonBody(wire.AttachSpec{Patterns: []string{"d.#"}, Durable: "keep"})
	sub.must(sub.send(f))
	if got := linkStats(m.brokers["a"], "b").Patterns; got != 1 {
		t.Fatalf("a holds %d of b's patterns, want 1", got)
	}
	sub.detach(1)
	if got := m.count("b", "a", wire.TypeRUnsub); got != 0 {
		t.Fatalf("RUNSUB while the durable subscription lives on")
	}
	pub := m.client("a")
	pub.publish("x", "d.1", "kept")
	q := m.brokers["b"].Queue("x/keep")
	if q == nil {
		t.Fatal("no queue x/keep")
	}
	waitUntil(t, "the queue keeps a's publication", func() bool { return q.Stats().Messages() == 1 })
}

// controllerClient attaches a controller of exchange on node and returns
// it with its attachment id 1.
func (m *mesh) controller(node, exchange string) *meshClient {
	m.t.Helper()
	c := m.client(node)
	c.must(c.send(attachFrame(1, exchange, wire.RoleController)))
	return c
}

// nextSubRequest returns the next SUBREQUEST c's controller gets.
func (c *meshClient) nextSubRequest() (*wire.Frame, wire.SubRequestBody) {
	c.t.Helper()
	f := c.waitFor("SUBREQUEST", func(f *wire.Frame) bool { return f.Type == wire.TypeSubRequest })
	var sr wire.SubRequestBody
	if err := json.Unmarshal(f.Body, &sr); err != nil {
		c.t.Fatal(err)
	}
	return f, sr
}

func (c *meshClient) decide(req *wire.Frame, verdict uint64, reason string, narrowed []string) {
	f := wire.NewFrame(wire.TypeDecision)
	f.Ref, f.Attach, f.Aux, f.Tag = req.Ref, req.Attach, verdict, reason
	if narrowed != nil {
		f.Body = jsonBody(wire.PatternsBody{Patterns: narrowed})
	}
	c.s.Handle(f)
}

// Controllers on node a decide for subscribers on node b: accept,
// refuse and narrow, and the subscriptions they accept take effect
// cluster-wide.
func TestMeshInvertedPubSub(t *testing.T) {
	m := newMesh(t, "a", "b")
	m.declareEverywhere("cx", true)
	ctrl := m.controller("a", "cx")
	waitUntil(t, "b learns of a's controller", func() bool {
		node, _ := m.brokers["b"].Exchange("cx").remoteController()
		return node == "a"
	})
	sub := m.client("b")

	// Accept.
	ref := sub.send(attachFrame(1, "cx", wire.RoleSubscriber, "acc.*"))
	req, sr := ctrl.nextSubRequest()
	if psNodeOf(sr.Member.ID) != "b" || len(sr.Patterns) != 1 || sr.Patterns[0] != "acc.*" {
		t.Fatalf("SUBREQUEST %+v", sr)
	}
	ctrl.decide(req, wire.VerdictAccept, "", nil)
	var res wire.AttachResult
	json.Unmarshal(sub.must(ref).Body, &res)
	if len(res.Patterns) != 1 || res.Patterns[0] != "acc.*" {
		t.Fatalf("attach result %+v", res)
	}
	ctrl.publish("cx", "acc.1", "accepted")
	waitUntil(t, "the accepted subscriber gets a's publication", func() bool { return len(sub.k.got(1)) == 1 })

	// Refuse.
	ref = sub.send(attachFrame(2, "cx", wire.RoleSubscriber, "ref.*"))
	req, _ = ctrl.nextSubRequest()
	ctrl.decide(req, wire.VerdictRefuse, "not you", nil)
	if f := sub.reply(ref); f.Type != wire.TypeError || wire.Code(f.Aux) != wire.CodeRejected || !strings.Contains(f.Tag, "not you") {
		t.Fatalf("refused: %s %d %q", f.Type, f.Aux, f.Tag)
	}

	// Narrow, on a SUBSCRIBE of an attached subscriber.
	s := wire.NewFrame(wire.TypeSubscribe)
	s.Attach, s.Body = 1, jsonBody(wire.PatternsBody{Patterns: []string{"wide.#"}})
	ref = sub.send(s)
	req, _ = ctrl.nextSubRequest()
	ctrl.decide(req, wire.VerdictAccept, "", []string{"wide.narrow"})
	var pb wire.PatternsBody
	json.Unmarshal(sub.must(ref).Body, &pb)
	if strings.Join(pb.Patterns, ",") != "acc.*,wide.narrow" {
		t.Fatalf("narrowed: %v", pb.Patterns)
	}
	ctrl.publish("cx", "wide.other", "no")
	ctrl.publish("cx", "wide.narrow", "yes")
	waitUntil(t, "the narrowed pattern's publication", func() bool { return len(sub.k.got(1)) == 2 })
	if got := sub.k.got(1); got[1] != "yes" {
		t.Errorf("got %q", got)
	}

	// The controller subscribes and unsubscribes the member on b.
	member := sr.Member.ID
	s = wire.NewFrame(wire.TypeSubscribe)
	s.Attach, s.Name, s.Body = 1, member, jsonBody(wire.PatternsBody{Patterns: []string{"pushed.*"}})
	json.Unmarshal(ctrl.must(ctrl.send(s)).Body, &pb)
	if strings.Join(pb.Patterns, ",") != "acc.*,wide.narrow,pushed.*" {
		t.Fatalf("SubscribeMember: %v", pb.Patterns)
	}
	ev := sub.waitFor("subscriptions event", func(f *wire.Frame) bool {
		return f.Type == wire.TypeEvent && f.Aux == wire.EventSubscriptions
	})
	if ev.Attach != 1 {
		t.Errorf("event for attachment %d", ev.Attach)
	}
	ctrl.publish("cx", "pushed.1", "pushed")
	waitUntil(t, "the pushed pattern's publication", func() bool { return len(sub.k.got(1)) == 3 })
	s = wire.NewFrame(wire.TypeUnsubscribe)
	s.Attach, s.Name, s.Body = 1, member, jsonBody(wire.PatternsBody{Patterns: []string{"pushed.*"}})
	ctrl.must(ctrl.send(s))
	s = wire.NewFrame(wire.TypeSubscribe)
	s.Attach, s.Name, s.Body = 1, "b/c999.9", jsonBody(wire.PatternsBody{Patterns: []string{"x"}})
	if f := ctrl.reply(ctrl.send(s)); f.Type != wire.TypeError || wire.Code(f.Aux) != wire.CodeNotFound {
		t.Errorf("SubscribeMember of no member: %s %d %q", f.Type, f.Aux, f.Tag)
	}
}

// With controllers on several nodes, every node asks the same one, the
// oldest; when it goes, the next oldest decides, and with none the
// subscription is refused.
func TestMeshControllersLeader(t *testing.T) {
	m := newMesh(t, "a", "b", "c")
	m.declareEverywhere("cx", true)
	first := m.controller("a", "cx")
	waitUntil(t, "c learns of a's controller", func() bool {
		node, _ := m.brokers["c"].Exchange("cx").remoteController()
		return node == "a"
	})
	second := m.controller("b", "cx")
	sub := m.client("c")
	local := m.client("b")
	for i, c := range []*meshClient{sub, local} {
		ref := c.send(attachFrame(uint32(10+i), "cx", wire.RoleSubscriber, "k"))
		req, _ := first.nextSubRequest()
		first.decide(req, wire.VerdictAccept, "", nil)
		c.must(ref)
	}
	// The oldest goes, with a request pending: the next decides it.
	ref := sub.send(attachFrame(1, "cx", wire.RoleSubscriber, "later"))
	first.nextSubRequest()
	first.detach(1)
	req, _ := second.nextSubRequest()
	second.decide(req, wire.VerdictAccept, "", nil)
	sub.must(ref)
	second.detach(1)
	waitUntil(t, "c forgets every controller", func() bool {
		node, _ := m.brokers["c"].Exchange("cx").remoteController()
		return node == ""
	})
	if f := sub.reply(sub.send(attachFrame(2, "cx", wire.RoleSubscriber, "none"))); f.Type != wire.TypeError || wire.Code(f.Aux) != wire.CodeRejected {
		t.Errorf("no controller: %s %d %q", f.Type, f.Aux, f.Tag)
	}
}

// A subscription request waiting for a controller on a node that goes
// down is asked again of the controllers left.
func TestMeshControllerNodeDown(t *testing.T) {
	m := newMesh(t, "a", "b", "c")
	m.declareEverywhere("cx", true)
	first := m.controller("a", "cx")
	waitUntil(t, "b learns of a's controller", func() bool {
		node, _ := m.brokers["b"].Exchange("cx").remoteController()
		return node == "a"
	})
	second := m.controller("c", "cx")
	sub := m.client("b")
	ref := sub.send(attachFrame(1, "cx", wire.RoleSubscriber, "k"))
	first.nextSubRequest()
	m.cutLink("a", "b")
	req, _ := second.nextSubRequest()
	second.decide(req, wire.VerdictAccept, "", nil)
	sub.must(ref)
}

func TestLeaderOf(t *testing.T) {
	ads := []ctrlAd{{node: "b", member: "b/c1.1", since: 20}, {node: "a", member: "a/c3.1", since: 10}, {node: "c", member: "c/c1.1", since: 10}}
	if l, _ := controllersLeader(ads); l.node != "a" {
		t.Errorf("leader %+v, want a's (oldest, then lowest id)", l)
	}
	if _, ok := controllersLeader(nil); ok {
		t.Error("a leader of none")
	}
}

// Subscribers a node had before it joined its cluster (such as durable
// subscriptions brought back from its store) are in the table it sends.
func TestMeshInterestFromBeforeJoining(t *testing.T) {
	sinks := map[string]*meshSink{}
	m := newMeshPrepared(t, Config{}, func(name string, b *Broker) {
		if _, err := b.Declare("x", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub}}); err != nil {
			t.Fatal(err)
		}
		if name != "b" {
			return
		}
		k := newMeshSink()
		sinks[name] = k
		s := b.Open(k, "early")
		t.Cleanup(s.Close)
		s.Handle(attachFrame(1, "x", wire.RoleSubscriber, "early.*"))
	}, "a", "b")
	waitUntil(t, "a installs b's early interest", func() bool { return linkStats(m.brokers["a"], "b").Patterns == 1 })
	pub := m.client("a")
	pub.publish("x", "early.1", "e")
	waitUntil(t, "the early subscriber gets a's publication", func() bool { return len(sinks["b"].got(1)) == 1 })
	// And a later subscriber of another pattern is announced as usual.
	sub := m.client("b")
	sub.subscribe(1, "x", "late")
	if got := linkStats(m.brokers["a"], "b").Patterns; got != 2 {
		t.Errorf("a holds %d of b's patterns, want 2", got)
	}
}

// A node's subscription requests waiting for a controller here are
// bounded: past MaxPatternsPerPeer patterns, they are refused at once.
func TestMeshRemoteAsksBounded(t *testing.T) {
	m := newMeshConfig(t, Config{MaxPatternsPerPeer: 5}, "a", "b")
	m.declareEverywhere("cx", true)
	ctrl := m.controller("a", "cx")
	a := m.brokers["a"]
	ask := func(token uint64, patterns ...string) {
		f := wire.NewFrame(wire.TypeRSubReq)
		f.Ref, f.Name = token, "cx"
		f.Body = jsonBody(wire.SubRequestBody{Member: wire.Member{ID: fmt.Sprintf("b/c1.%d", token)}, Patterns: patterns})
		a.FromPeer("b", f)
	}
	ask(1, "p.1", "p.2", "p.3")
	ask(2, "p.4", "p.5")
	ask(3, "p.6") // past the bound: refused at once
	waitUntil(t, "the refusal", func() bool { return m.count("a", "b", wire.TypeRDecide) == 1 })
	req, _ := ctrl.nextSubRequest()
	ctrl.decide(req, wire.VerdictRefuse, "", nil)
	ctrl.nextSubRequest()
	ask(4, "p.7") // room again
	ctrl.nextSubRequest()
	if n := m.count("a", "b", wire.TypeRDecide); n != 2 {
		t.Errorf("%d RDECIDEs, want 2 (the refusal at once, the controller's)", n)
	}
}

// tallySink counts the MESSAGE frames delivered to it.
type tallySink struct{ n *atomic.Int64 }

func (k tallySink) Deliver(f *wire.Frame) {
	if f.Type == wire.TypeMessage {
		k.n.Add(1)
	}
	f.Release()
}

// BenchmarkMeshFanOut publishes on one node to 300 subscribers of one
// pattern, all on that node ("one-broker") or 100 on each of 3 mesh
// nodes ("3-nodes": 2 RPUBs per publication, encoded and decoded by the
// wire codec, fanned out on the other nodes by their link readers). It
// reports publications and deliveries per second, with at most 4096
// publications in flight.
func BenchmarkMeshFanOut(b *testing.B) {
	const subscribers = 300
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, nodes := range []int{1, 3} {
		name := "one-broker"
		if nodes > 1 {
			name = fmt.Sprintf("%d-nodes", nodes)
		}
		b.Run(name, func(b *testing.B) {
			names := []string{"a", "b", "c"}[:nodes]
			m := newMeshConfig(b, Config{Log: discard}, names...)
			m.declareEverywhere("x", false)
			var delivered atomic.Int64
			for i := range subscribers {
				br := m.brokers[names[i%nodes]]
				s := br.Open(tallySink{&delivered}, "subscriber")
				b.Cleanup(s.Close)
				s.Handle(attachFrame(1, "x", wire.RoleSubscriber, "eu.#"))
			}
			pub := m.brokers["a"].Open(&holdSink{}, "publisher")
			body := make([]byte, 128)
			wait := func(want int64) {
				for delivered.Load() < want {
					runtime.Gosched()
				}
			}
			b.ReportAllocs()
			n := int64(0)
			for b.Loop() {
				f := wire.NewFrame(wire.TypePublish)
				f.Name, f.Key, f.Body = "x", "eu.fr.paris", body
				pub.Handle(f)
				if n++; n%4096 == 0 {
					wait((n - 4096) * subscribers)
				}
			}
			wait(n * subscribers)
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "pubs/s")
			b.ReportMetric(float64(n*subscribers)/b.Elapsed().Seconds(), "deliveries/s")
			if nodes > 1 {
				b.ReportMetric(float64(m.count("a", "b", wire.TypeRPub))/float64(n), "rpub/pub/node")
			}
		})
	}
}

// A node that declares an exchange after another node subscribed to it
// (whose RSUB it dropped then) asks for that node's table.
func TestMeshExchangeDeclaredLate(t *testing.T) {
	m := newMesh(t, "a", "b")
	spec := Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub}}
	if _, err := m.brokers["b"].Declare("x", spec); err != nil {
		t.Fatal(err)
	}
	sub := m.client("b")
	sub.subscribe(1, "x", "late.*")
	// Subscribe returned: a answered b's RSUB and holds its interest (it
	// dropped b's request for a's table of x, sent as b declared it).
	if got := linkStats(m.brokers["a"], "b").DroppedUnknown; got != 1 {
		t.Fatalf("a dropped %d frames of b for x, want 1", got)
	}
	if _, err := m.brokers["a"].Declare("x", spec); err != nil {
		t.Fatal(err)
	}
	// The interest held is in place as Declare returns: a publication
	// on a right after it reaches b's subscriber.
	if got := linkStats(m.brokers["a"], "b").Patterns; got != 1 {
		t.Fatalf("a holds %d patterns of b for x as its Declare returns, want 1", got)
	}
	m.client("a").publish("x", "late.1", "found")
	waitUntil(t, "b's subscriber gets a's publication", func() bool { return len(sub.k.got(1)) == 1 })
}

// Deleting a controlled exchange on the controllers' node refuses the
// subscription requests of other nodes that waited there: they fail
// with code 20, exchange deleted, as a local one does.
func TestMeshControlledExchangeDeleted(t *testing.T) {
	m := newMesh(t, "a", "b")
	m.declareEverywhere("cx", true)
	ctrl := m.controller("a", "cx")
	waitUntil(t, "b learns of a's controller", func() bool {
		node, _ := m.brokers["b"].Exchange("cx").remoteController()
		return node == "a"
	})
	sub := m.client("b")
	ref := sub.send(attachFrame(1, "cx", wire.RoleSubscriber, "k"))
	ctrl.nextSubRequest()
	if err := m.brokers["a"].Delete("cx"); err != nil {
		t.Fatal(err)
	}
	if f := sub.reply(ref); f.Type != wire.TypeError || wire.Code(f.Aux) != wire.CodeExchangeDeleted || !strings.Contains(f.Tag, "deleted") {
		t.Fatalf("got %s %d %q", f.Type, f.Aux, f.Tag)
	}
}

// A node coming up learns the whole table; until it has it in place, a
// new subscriber of a pattern the others knew already waits for it too.
func TestMeshSubscribeWaitsForNodeComingUp(t *testing.T) {
	m := newMesh(t, "a", "b", "c")
	m.declareEverywhere("x", false)
	sub := m.client("b")
	sub.subscribe(1, "x", "j.*")
	m.cutLink("a", "b")
	m.hold("a", "b") // a's RSUBACK of b's table will wait
	m.heal("a", "b")
	waitUntil(t, "a installs b's table", func() bool { return linkStats(m.brokers["a"], "b").Patterns == 1 })
	ref := sub.send(attachFrame(2, "x", wire.RoleSubscriber, "j.*"))
	if f := sub.poll(func(f *wire.Frame) bool { return f.Ref == ref }, 50*time.Millisecond); f != nil {
		t.Fatalf("subscribe answered (%s) before a acknowledged b's table", f.Type)
	}
	m.release("a", "b")
	sub.must(ref)
	m.client("a").publish("x", "j.1", "after")
	waitUntil(t, "both subscribers get it", func() bool { return len(sub.k.got(1)) == 1 && len(sub.k.got(2)) == 1 })
}

// Malformed or out-of-place pub-sub frames from a node are dropped (and
// counted where they are malformed), never a panic nor a change.
func TestMeshBadFramesFromANode(t *testing.T) {
	m := newMesh(t, "a", "b")
	m.declareEverywhere("x", false)
	m.declareEverywhere("cx", true)
	a := m.brokers["a"]
	before := a.PatternStats()
	frames := []*wire.Frame{
		{Type: wire.TypeRSub, Ref: 1, Name: "x", Body: []byte("{")},
		{Type: wire.TypeRSub, Ref: 2, Name: "x", Body: []byte(`{"patterns":["#.#.#.#.#"]}`)},
		{Type: wire.TypeRUnsub, Name: "x", Body: []byte(`{"patterns":[""]}`)},
		{Type: wire.TypeRPub, Name: "cx"},                                                                         // no one there: fanned out to nobody
		{Type: wire.TypeRSubAck, Ref: 1 << 40},                                                                    // acknowledges what was never sent
		{Type: wire.TypeRDecide, Ref: 12345, Name: "cx"},                                                          // no such request
		{Type: wire.TypeRDecide, Ref: 12345, Name: "nope"},                                                        // no such exchange
		{Type: wire.TypeRCtrl, Name: "cx", Tag: "c/c1.1"},                                                         // another node's controller: ignored
		{Type: wire.TypeRCtrl, Name: "x", Tag: "b/c1.1"},                                                          // not controlled
		{Type: wire.TypeRSubReq, Ref: 3, Name: "cx", Body: []byte(`{"member":{"id":"z/c1.1"},"patterns":["k"]}`)}, // not b's member
		{Type: wire.TypeRSubReq, Ref: 4, Name: "cx", Body: []byte(`{`)},
		{Type: wire.TypeRSubReq, Ref: 5, Name: "x", Body: []byte(`{}`)},
		{Type: wire.TypeRMember, Ref: 6, Name: "cx", Tag: "a/c99.1", Body: []byte(`{"patterns":["k"]}`)},
		{Type: wire.TypeRMember, Ref: 7, Name: "cx", Tag: "a/c99.1", Body: []byte(`{"patterns":["a..b"]}`)},
	}
	for _, f := range frames {
		g := wire.NewFrame(f.Type)
		*g = *f
		a.FromPeer("b", g)
	}
	if got := a.PatternStats(); got.Patterns != before.Patterns {
		t.Errorf("a's patterns went from %d to %d", before.Patterns, got.Patterns)
	}
	if node, _ := a.Exchange("cx").remoteController(); node != "" {
		t.Errorf("a took %s for a controller's node", node)
	}
	st := linkStats(a, "b")
	if st.Refused != 6 {
		t.Errorf("a's link to b: %+v, want 6 refused", st)
	}
	// Every RSUBREQ and RMEMBER is answered, so nothing waits on b.
	waitUntil(t, "the answers", func() bool { return m.count("a", "b", wire.TypeRDecide) == 5 })
}

// A node that keeps its link up but never acknowledges interest holds a
// subscribe no longer than maxInterestWait (shortened here).
func TestMeshSubscribeWaitIsBounded(t *testing.T) {
	m := newMesh(t, "a", "b")
	m.declareEverywhere("x", false)
	m.brokers["b"].ps.maxWait = 200 * time.Millisecond
	m.hold("a", "b") // a's RSUBACK never comes while the test runs
	sub := m.client("b")
	start := time.Now()
	sub.subscribe(1, "x", "k")
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("subscribe returned after %s, before the wait's bound", took)
	}
}

// Under churn (subscribers coming and going on every node, links cut and
// healed meanwhile), every node ends up holding exactly the interest
// of each other node, and each node's counts are its subscribers'.
func TestMeshInterestConvergesUnderChurn(t *testing.T) {
	nodes := []string{"a", "b", "c"}
	m := newMesh(t, nodes...)
	m.declareEverywhere("x", false)
	patterns := []string{"p.1", "p.2", "p.*", "p.#", "#", "q.1", "q.*"}
	var wg sync.WaitGroup
	for ni, n := range nodes {
		for w := range 2 {
			c := m.client(n)
			seed := uint32(ni*7 + w*13 + 1)
			wg.Go(func() {
				attached := map[uint32]bool{}
				for i := range uint32(1500) {
					seed = seed*1103515245 + 12345
					id := 1 + seed>>16%20
					if attached[id] {
						c.detach(id)
						delete(attached, id)
						continue
					}
					p1, p2 := patterns[(seed>>8)%uint32(len(patterns))], patterns[(seed>>20+i)%uint32(len(patterns))]
					c.subscribe(id, "x", p1, p2)
					attached[id] = true
				}
			})
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	pub := m.client("c")
	cycles := 0
	for churning := true; churning; cycles++ {
		select {
		case <-done:
			churning = false
		default:
		}
		m.cutLink("a", "b")
		pub.publish("x", "p.1", "during")
		m.heal("a", "b")
		m.cutLink("b", "c")
		pub.publish("x", "q.1", "during")
		m.heal("b", "c")
	}
	t.Logf("%d cut-and-heal cycles during the churn", cycles)
	m.settle()
	for _, from := range nodes {
		src := m.brokers[from].Exchange("x")
		src.subMu.RLock()
		want := map[string]int{}
		for _, a := range src.subs.all() {
			if !a.isPeerSub() {
				for _, p := range a.patterns {
					want[p]++
				}
			}
		}
		have := map[string]int{}
		for p, li := range src.interest {
			have[p] = li.n
		}
		src.subMu.RUnlock()
		if fmt.Sprint(have) != fmt.Sprint(want) {
			t.Errorf("%s counts %v, its subscribers have %v", from, have, want)
		}
		for _, to := range nodes {
			if to == from {
				continue
			}
			dst := m.brokers[to].Exchange("x")
			dst.subMu.RLock()
			var got []string
			if si := dst.peerSubs[from]; si != nil {
				got = append(got, si.a.patterns...)
			}
			dst.subMu.RUnlock()
			slices.Sort(got)
			if exp := slices.Sorted(maps.Keys(want)); !slices.Equal(got, exp) {
				t.Errorf("%s holds %v of %s's interest, want %v", to, got, from, exp)
			}
		}
	}
}

// Interest held for exchanges a node does not know is bounded per node:
// a node cannot grow another's memory by naming exchanges that do not
// exist there.
func TestMeshEarlyInterestBounded(t *testing.T) {
	m := newMeshConfig(t, Config{MaxPatternsPerPeer: 10}, "a", "b")
	b := m.brokers["b"]
	for i := range 20 {
		f := wire.NewFrame(wire.TypeRSub)
		f.Ref, f.Name, f.Body = uint64(i+1), fmt.Sprintf("nope%d", i), []byte(`{"patterns":["a","b"]}`)
		b.FromPeer("a", f)
	}
	b.ps.earlyMu.Lock()
	held := b.ps.earlyN["a"]
	b.ps.earlyMu.Unlock()
	if held > 10 {
		t.Errorf("b holds %d patterns of a for unknown exchanges, limit 10", held)
	}
	if st := linkStats(b, "a"); st.Refused == 0 {
		t.Errorf("nothing refused past the limit: %+v", st)
	}
	m.cutLink("a", "b")
	b.ps.earlyMu.Lock()
	left := len(b.ps.early)
	b.ps.earlyMu.Unlock()
	if left != 0 {
		t.Errorf("b still holds interest of a for %d exchanges after its link went down", left)
	}
}
