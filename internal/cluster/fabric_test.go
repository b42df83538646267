package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// recorder is a LinkHandler that records what it is told.
type recorder struct {
	mu     sync.Mutex
	frames map[string][]*wire.Frame
	events []string
}

func newRecorder() *recorder { return &recorder{frames: make(map[string][]*wire.Frame)} }

func (r *recorder) FromPeer(node string, fr *wire.Frame) {
	r.mu.Lock()
	r.frames[node] = append(r.frames[node], fr)
	r.mu.Unlock()
}
func (r *recorder) PeerUp(node string) {
	r.mu.Lock()
	r.events = append(r.events, "up "+node)
	r.mu.Unlock()
}
func (r *recorder) PeerDown(node string) {
	r.mu.Lock()
	r.events = append(r.events, "down "+node)
	r.mu.Unlock()
}

func (r *recorder) count(node string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.frames[node])
}

func (r *recorder) has(event string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e == event {
			return true
		}
	}
	return false
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func testLog(t testing.TB, w io.Writer) *slog.Logger {
	if w == nil {
		w = io.Discard
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func startFabric(t testing.TB, name string, join []string, mod func(*Config)) (*Fabric, *recorder) {
	t.Helper()
	cfg := Config{Name: name, Listen: "127.0.0.1:0", Join: join, Secret: testSecret, Log: testLog(t, nil),
		HandshakeTimeout: 10 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	rec := newRecorder()
	f.SetHandler(rec)
	t.Cleanup(func() { f.Close() })
	return f, rec
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// allUp reports whether f sees every name alive with links up.
func allUp(f *Fabric, names ...string) bool {
	ms := f.Members()
	seen := 0
	for _, m := range ms {
		for _, n := range names {
			if m.Name == n && m.State == StateAlive && (m.Self || m.Link.Up) {
				seen++
			}
		}
	}
	return seen == len(names)
}

func threeNodes(t *testing.T) ([]*Fabric, []*recorder) {
	a, ra := startFabric(t, "a", nil, nil)
	seed := []string{a.Advertise()}
	b, rb := startFabric(t, "b", seed, nil)
	c, rc := startFabric(t, "c", seed, nil)
	fs := []*Fabric{a, b, c}
	for _, f := range fs {
		waitFor(t, 20*time.Second, f.Name()+" sees a, b and c up", func() bool { return allUp(f, "a", "b", "c") })
	}
	return fs, []*recorder{ra, rb, rc}
}

func TestThreeNodesLinkUp(t *testing.T) {
	fs, recs := threeNodes(t)
	for i, f := range fs {
		for _, o := range fs {
			if o == f {
				continue
			}
			waitFor(t, 10*time.Second, f.Name()+" told PeerUp "+o.Name(), func() bool { return recs[i].has("up " + o.Name()) })
		}
		// The links may come up before memberlist has gossiped a
		// node's meta: wait for it.
		waitFor(t, 10*time.Second, f.Name()+" knows every node's address and start", func() bool {
			for _, m := range f.Members() {
				if m.ClusterAddr == "" || m.Started.IsZero() {
					return false
				}
			}
			return true
		})
	}
	// RTT comes from the link heartbeats.
	waitFor(t, 10*time.Second, "an RTT measured", func() bool {
		for _, m := range fs[0].Members() {
			if !m.Self && m.Link.RTT <= 0 {
				return false
			}
		}
		return true
	})
}

func TestSendInOrder(t *testing.T) {
	fs, recs := threeNodes(t)
	const n = 2000
	for i := range n {
		for _, to := range []string{"b", "c"} {
			fr := &wire.Frame{Type: wire.TypePublish, Name: "x", Ref: uint64(i + 1), Body: []byte(fmt.Sprint(i))}
			send := fs[0].Send
			if i%10 == 0 {
				send = fs[0].SendControl // the control link has its own order
				fr.Type = wire.TypeEvent
			}
			for {
				err := send(to, fr)
				if err == nil {
					break
				}
				if !errors.Is(err, ErrLinkFull) {
					t.Fatalf("send %d to %s: %v", i, to, err)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	for i, to := range []string{"b", "c"} {
		rec := recs[i+1]
		waitFor(t, 20*time.Second, to+" received every frame", func() bool { return rec.count("a") == n })
		rec.mu.Lock()
		var lastData, lastCtrl uint64
		for _, fr := range rec.frames["a"] {
			last := &lastData
			if fr.Type == wire.TypeEvent {
				last = &lastCtrl
			}
			if fr.Ref <= *last {
				t.Errorf("%s: frame %d after %d", to, fr.Ref, *last)
			}
			*last = fr.Ref
		}
		rec.mu.Unlock()
	}
	m := member(fs[0], "b")
	if m.Link.Data.FramesOut < n*9/10 || m.Link.Data.BytesOut == 0 || m.Link.Control.FramesOut < n/10 {
		t.Errorf("link counters: %+v", m.Link)
	}
	if err := fs[0].Send("nobody", &wire.Frame{Type: wire.TypePublish}); !errors.Is(err, ErrNoLink) {
		t.Errorf("send to an unknown node: %v, want ErrNoLink", err)
	}
	if err := fs[0].Send("b", &wire.Frame{Type: 0xEE}); err == nil {
		t.Error("a frame of an unknown type was sent")
	}
}

func member(f *Fabric, name string) Member {
	for _, m := range f.Members() {
		if m.Name == name {
			return m
		}
	}
	return Member{}
}

// TestCloseIsLeft: a node that closes is seen as left, and PeerDown is
// told at once.
func TestCloseIsLeft(t *testing.T) {
	fs, recs := threeNodes(t)
	fs[2].Close()
	for i, f := range fs[:2] {
		waitFor(t, 10*time.Second, f.Name()+" told PeerDown c", func() bool { return recs[i].has("down c") })
		waitFor(t, 10*time.Second, f.Name()+" sees c left", func() bool { return member(f, "c").State == StateLeft })
	}
}

// TestLinkCutRedials: a link cut under the fabric is redialled, with
// PeerDown and PeerUp.
func TestLinkCutRedials(t *testing.T) {
	a, ra := startFabric(t, "a", nil, nil)
	b, rb := startFabric(t, "b", []string{a.Advertise()}, nil)
	waitFor(t, 20*time.Second, "a and b up", func() bool { return allUp(a, "a", "b") && allUp(b, "a", "b") })
	p := a.peers["b"]
	p.mu.Lock()
	l := p.links[1]
	p.mu.Unlock()
	l.conn.Conn.(*Conn).Conn.Close() // under TLS: the peer sees a broken session
	waitFor(t, 10*time.Second, "PeerDown on both sides", func() bool { return ra.has("down b") && rb.has("down a") })
	waitFor(t, 10*time.Second, "links up again", func() bool { return member(a, "b").Link.Up && member(b, "a").Link.Up })
	if err := a.Send("b", &wire.Frame{Type: wire.TypePublish, Name: "after"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "b gets the frame", func() bool { return rb.count("a") == 1 })
	// Each side counted the session's end once: broken (b may instead
	// see a dial again first: other), never silent or stalled.
	for _, m := range []Member{member(a, "b"), member(b, "a")} {
		if c := m.Link.Cuts; c.Broken+c.Other != 1 || c.Silent+c.Stalled+c.Declared != 0 {
			t.Fatalf("cuts of the link with %s = %+v, want one broken", m.Name, c)
		}
	}
}

func TestWrongSecretRefused(t *testing.T) {
	var logA, logB syncBuffer
	a, _ := startFabric(t, "a", nil, func(c *Config) { c.Log = testLog(t, &logA) })
	b, _ := startFabric(t, "b", []string{a.Advertise()}, func(c *Config) {
		c.Secret = []byte("another secret, 32 bytes long!!!")
		c.Log = testLog(t, &logB)
	})
	// b cannot join: memberlist's stream to a fails the handshake.
	waitFor(t, 20*time.Second, "a logs why it refused b", func() bool {
		return strings.Contains(logA.String(), "did not prove the cluster secret")
	})
	waitFor(t, 20*time.Second, "b logs why it was refused", func() bool {
		return strings.Contains(logB.String(), "secrets differ")
	})
	if len(a.Members()) != 1 || len(b.Members()) != 1 {
		t.Errorf("members with different secrets: a %v, b %v", a.Members(), b.Members())
	}
	// A dial with the wrong secret is refused too.
	if _, err := b.dialAddr(a.Advertise(), KindLinkControl, 5*time.Second); !errors.Is(err, ErrAuth) {
		t.Errorf("dial with the wrong secret: %v, want ErrAuth", err)
	}
	// And with no security at all.
	plain := &security{}
	nc, err := net.Dial("tcp", a.Advertise())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := plain.clientHandshake(nc, KindLinkData, hello{Name: "x"}, 5*time.Second); !errors.Is(err, ErrAuth) {
		t.Errorf("dial without security: %v, want ErrAuth", err)
	}
}

func TestInsecureAddressRefused(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "192.0.2.1:7500"} {
		_, err := New(Config{Name: "a", Listen: addr, Log: testLog(t, nil)})
		if !errors.Is(err, ErrInsecure) || !strings.Contains(err.Error(), "cluster secret") {
			t.Errorf("listen on %s without security: %v, want ErrInsecure", addr, err)
		}
	}
	_, err := New(Config{Name: "a", Listen: "127.0.0.1:0", Advertise: "192.0.2.1:7500", Log: testLog(t, nil)})
	if !errors.Is(err, ErrInsecure) {
		t.Errorf("advertise beyond loopback without security: %v, want ErrInsecure", err)
	}
	// Loopback without security runs.
	a, _ := startFabric(t, "a", nil, func(c *Config) { c.Secret = nil })
	b, _ := startFabric(t, "b", []string{a.Advertise()}, func(c *Config) { c.Secret = nil })
	waitFor(t, 20*time.Second, "plain loopback nodes link", func() bool { return allUp(a, "a", "b") && allUp(b, "a", "b") })
}

// TestDialListener: others get authenticated streams of their own kind.
func TestDialListener(t *testing.T) {
	a, _ := startFabric(t, "a", nil, nil)
	b, _ := startFabric(t, "b", []string{a.Advertise()}, nil)
	waitFor(t, 20*time.Second, "a and b up", func() bool { return allUp(a, "a", "b") && allUp(b, "a", "b") })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Dial(ctx, "b", KindRaft); err == nil {
		t.Fatal("dial of a kind b does not serve")
	}
	ln := b.Listener(KindRaft)
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		buf := make([]byte, 5)
		io.ReadFull(c, buf)
		got <- c.(*Conn).Peer() + ":" + string(buf)
	}()
	c, err := a.Dial(ctx, "b", KindRaft)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	if s := <-got; s != "a:hello" {
		t.Errorf("accepted %q", s)
	}
	if _, err := a.Dial(ctx, "zed", KindRaft); !errors.Is(err, ErrUnknownNode) {
		t.Errorf("dial of an unknown node: %v", err)
	}
}

// TestMutualTLS: nodes with certificates of the cluster CA link; one
// whose certificate another CA signed is refused, however it knows the
// secret, and so is one without TLS.
func TestMutualTLS(t *testing.T) {
	ca, other := testutil.NewCA(t), testutil.NewCA(t)
	withCert := func(c testutil.Cert, caFile string) func(*Config) {
		return func(cfg *Config) { cfg.CertFile, cfg.KeyFile, cfg.CAFile = c.CertFile, c.KeyFile, caFile }
	}
	var logA syncBuffer
	a, _ := startFabric(t, "a", nil, func(cfg *Config) {
		withCert(ca.Client("a"), ca.File)(cfg)
		cfg.Log = testLog(t, &logA)
	})
	b, _ := startFabric(t, "b", []string{a.Advertise()}, withCert(ca.Server(), ca.File))
	waitFor(t, 20*time.Second, "a and b linked over mutual TLS", func() bool { return allUp(a, "a", "b") && allUp(b, "a", "b") })
	if _, err := b.dialAddr(a.Advertise(), KindLinkData, 5*time.Second); err != nil {
		t.Fatalf("dial with a certificate of the cluster CA: %v", err)
	}
	// Another CA's certificate.
	c, _ := startFabric(t, "c", nil, withCert(other.Client("c"), ca.File))
	if _, err := c.dialAddr(a.Advertise(), KindLinkData, 5*time.Second); !errors.Is(err, ErrAuth) {
		t.Errorf("dial with another CA's certificate: %v, want ErrAuth", err)
	}
	waitFor(t, 10*time.Second, "a logs the refusal", func() bool {
		return strings.Contains(logA.String(), "cluster CA") || strings.Contains(logA.String(), "bad certificate")
	})
	// No TLS, the secret only.
	d, _ := startFabric(t, "d", nil, nil)
	_, err := d.dialAddr(a.Advertise(), KindLinkData, 5*time.Second)
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "mutual TLS") {
		t.Errorf("dial without TLS: %v, want ErrAuth naming the security modes", err)
	}
	if _, err := New(Config{Name: "e", Listen: "127.0.0.1:0", CertFile: ca.Server().CertFile}); err == nil {
		t.Error("a certificate without its key and CA was accepted")
	}
}

// TestMutualTLSWithoutSecret: with mutual TLS alone memberlist's packets
// go over authenticated TCP; the nodes find each other, a node that
// stops is declared dead by memberlist, and nobody reads the UDP socket.
func TestMutualTLSWithoutSecret(t *testing.T) {
	ca := testutil.NewCA(t)
	mtls := func(name string) func(*Config) {
		c := ca.Client(name)
		return func(cfg *Config) {
			cfg.Secret = nil
			cfg.CertFile, cfg.KeyFile, cfg.CAFile = c.CertFile, c.KeyFile, ca.File
		}
	}
	a, ra := startFabric(t, "a", nil, mtls("a"))
	b, _ := startFabric(t, "b", []string{a.Advertise()}, mtls("b"))
	cfg := Config{Name: "c", Listen: "127.0.0.1:0", Join: []string{a.Advertise()}, Log: testLog(t, nil)}
	mtls("c")(&cfg)
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.crash)
	for _, f := range []*Fabric{a, b, c} {
		waitFor(t, 20*time.Second, f.Name()+" sees a, b and c up", func() bool { return allUp(f, "a", "b", "c") })
	}
	if !a.tr.overTCP {
		t.Fatal("memberlist's packets go over UDP without a key")
	}
	// Memberlist's own failure detection works over these packets: a
	// node whose links stay up but whose memberlist stops without
	// leaving is declared dead.
	c.ml.Shutdown()
	waitFor(t, 30*time.Second, "a's memberlist declares c dead", func() bool { return member(a, "c").State == StateDead })
	// The links go down after the verdict, on their own goroutine.
	waitFor(t, 10*time.Second, "PeerDown for a node memberlist declared dead", func() bool { return ra.has("down c") })
}

// TestBadFrameCutsThatLinkAlone: a peer that sends a malformed frame has
// its link cut (and redialled); the other links stay up.
func TestBadFrameCutsThatLinkAlone(t *testing.T) {
	fs, recs := threeNodes(t)
	a := fs[0]
	p := a.peers["b"]
	p.mu.Lock()
	l := p.links[1]
	p.mu.Unlock()
	l.out.Close() // the write loop stops writing; write the bad frame under it
	l.conn.Write([]byte{0, 0, 0, 3, 0xEE, 0, 0})
	waitFor(t, 10*time.Second, "b cuts its link with a", func() bool { return recs[1].has("down a") })
	if recs[1].has("down c") || recs[2].has("down b") || recs[2].has("down a") {
		t.Errorf("other links went down: b %v, c %v", recs[1].events, recs[2].events)
	}
	waitFor(t, 10*time.Second, "a and b linked again", func() bool { return member(a, "b").Link.Up && member(fs[1], "a").Link.Up })
}

// blocker is a LinkHandler whose FromPeer holds the link's reads until
// released: a peer that does not read.
type blocker struct {
	*recorder
	release chan struct{}
}

func (b *blocker) FromPeer(node string, fr *wire.Frame) { <-b.release }

// TestSlowPeerCut: Send never waits for a peer that does not read: it
// fails with ErrLinkFull once the outbox is full, and the link is cut
// after the slow-consumer timeout, and redialled.
func TestSlowPeerCut(t *testing.T) {
	const slow = time.Second
	a, ra := startFabric(t, "a", nil, func(c *Config) { c.SlowTimeout = slow })
	b, rb := startFabric(t, "b", []string{a.Advertise()}, nil)
	bl := &blocker{recorder: rb, release: make(chan struct{})}
	// Released before the fabrics close (cleanups run last first), also
	// when the test fails: a handler held for ever would hang b's Close,
	// and the whole package with it, hiding the failure.
	release := sync.OnceFunc(func() { close(bl.release) })
	t.Cleanup(release)
	b.SetHandler(bl)
	waitFor(t, 20*time.Second, "a and b up", func() bool { return allUp(a, "a", "b") && allUp(b, "a", "b") })
	body := make([]byte, 64<<10)
	var full time.Time
	for deadline := time.Now().Add(30 * time.Second); full.IsZero(); {
		start := time.Now()
		err := a.Send("b", &wire.Frame{Type: wire.TypePublish, Name: "x", Body: body})
		if took := time.Since(start); took > time.Second {
			t.Fatalf("Send waited %s", took)
		}
		switch {
		case errors.Is(err, ErrLinkFull):
			full = time.Now()
		case err != nil:
			t.Fatalf("send: %v", err)
		case time.Now().After(deadline):
			t.Fatal("the outbox never filled")
		}
	}
	waitFor(t, slow+10*time.Second, "a cuts its link with b, which does not read", func() bool { return ra.has("down b") })
	t.Logf("link cut %s after the outbox filled (slow-consumer timeout %s)", time.Since(full).Round(time.Millisecond), slow)
	release()
	waitFor(t, 20*time.Second, "linked again", func() bool { return member(a, "b").Link.Up && member(b, "a").Link.Up })
}

// crash stops f as a crash would: no leave, links and sockets closed.
func (f *Fabric) crash() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	peers := f.peerList()
	f.mu.Unlock()
	close(f.done)
	f.ml.Shutdown()
	f.closeSockets()
	for _, p := range peers {
		f.teardown(p, 0, cutOther, "crash")
	}
	f.tr.wg.Wait()
	f.wg.Wait()
}

// TestAdvertiseHostName: a cluster address advertised by host name is
// dialled by that name.
func TestAdvertiseHostName(t *testing.T) {
	a, _ := startFabric(t, "a", nil, nil)
	port := a.Addr().(*net.TCPAddr).Port
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // free a moment ago: taken again since, the test fails at start
	c, _ := startFabric(t, "c", []string{fmt.Sprintf("localhost:%d", port)}, func(c *Config) {
		c.Listen = fmt.Sprintf("127.0.0.1:%d", bPort)
		c.Advertise = fmt.Sprintf("localhost:%d", bPort)
	})
	waitFor(t, 20*time.Second, "a and c up", func() bool { return allUp(a, "a", "c") && allUp(c, "a", "c") })
	if got := member(a, "c").ClusterAddr; got != c.Advertise() || !strings.HasPrefix(got, "localhost:") {
		t.Errorf("a sees c at %q, want %q", got, c.Advertise())
	}
}

// greeter is a recorder that sends a frame to every peer from PeerUp,
// as the broker does (its interest table, its views).
type greeter struct {
	*recorder
	f *Fabric
}

func (g greeter) PeerUp(node string) {
	g.recorder.PeerUp(node)
	g.f.SendControl(node, &wire.Frame{Type: wire.TypePublish, Name: "hello from " + g.f.Name()})
	g.f.Send(node, &wire.Frame{Type: wire.TypePublish, Name: "data from " + g.f.Name()})
}

// TestAcceptorSendsFromPeerUp: frames the acceptor's handler sends from
// PeerUp go after the ready mark, so the dialer's session starts and
// receives them. Before, they went ahead of the OK, the dialer hung up
// ("the link began with PUBLISH, not OK") and redialled for ever: a
// node restarted while the other had subscribers never linked with it.
func TestAcceptorSendsFromPeerUp(t *testing.T) {
	b, _ := startFabric(t, "b", nil, nil) // the acceptor: the smaller name dials
	rb := newRecorder()
	b.SetHandler(greeter{rb, b})
	a, ra := startFabric(t, "a", []string{b.Advertise()}, nil)
	waitFor(t, 20*time.Second, "a and b up", func() bool { return allUp(a, "a", "b") && allUp(b, "a", "b") })
	waitFor(t, 10*time.Second, "a gets b's greetings", func() bool { return ra.count("b") == 2 })
	if rb.has("down a") {
		t.Errorf("the session flapped: b saw %v", rb.events)
	}
}
