package client_test

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// gatedProxy forwards TCP connections to a server; while held, what the
// server sends is read but kept back, so that cutting the connections
// loses it: a confirm the server sent and the client never got.
type gatedProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	held   bool
	conns  []net.Conn
}

func newGatedProxy(t *testing.T, target string) *gatedProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &gatedProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	t.Cleanup(func() { ln.Close(); p.hold(false); p.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { io.Copy(s, c); s.Close() }()
			go p.back(c, s)
		}
	}()
	return p
}

// back copies from the server s to the client c, keeping back what it
// read while held.
func (p *gatedProxy) back(c, s net.Conn) {
	defer c.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.held {
				p.cond.Wait()
			}
			p.mu.Unlock()
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *gatedProxy) url() string { return "courier://" + p.ln.Addr().String() }

func (p *gatedProxy) hold(on bool) {
	p.mu.Lock()
	p.held = on
	p.mu.Unlock()
	p.cond.Broadcast()
}

// cut closes every connection through the proxy; what was held is lost.
func (p *gatedProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestResentSubmitStoredOnce: a submit the server stored, whose confirm
// was lost with the connection, is sent again after the reconnect with
// the same (producer, seq): the queue keeps one task, and Submit returns
// its id.
func TestResentSubmitStoredOnce(t *testing.T) {
	n := startNode(t, "127.0.0.1:0", t.TempDir())
	p := newGatedProxy(t, n.Addr().String())
	ctx := testutil.Context(t, 2*wait)
	evs := newConnEvents()
	c, err := client.Dial(ctx, p.url(), client.Options{Log: quiet(), OnConnEvent: evs.fn})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ProducerID() == "" {
		t.Fatal("no producer id against a server that deduplicates")
	}
	jobs, err := c.Tasks(ctx, "once")
	if err != nil {
		t.Fatal(err)
	}
	q := n.Broker().Queue("once")
	p.hold(true)
	type result struct {
		id  courier.TaskID
		err error
	}
	done := make(chan result, 1)
	go func() {
		id, err := jobs.Submit(ctx, courier.Task{Body: []byte("x")})
		done <- result{id, err}
	}()
	testutil.WaitForf(t, wait, func() bool { return q.Stats().Published == 1 }, "the server to store the task")
	p.cut() // the confirm goes with the connection
	p.hold(false)
	evs.next(t, courier.ConnDisconnected)
	evs.next(t, courier.ConnReconnected)
	r := testutil.Recv(t, done, wait)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if s := q.Stats(); s.Messages() != 1 || s.Published != 1 || s.Deduplicated != 1 {
		t.Fatalf("after the resend: %d tasks, %d published, %d deduplicated; want 1, 1, 1", s.Messages(), s.Published, s.Deduplicated)
	}
	if want := q.NextID() - 1; r.id != want {
		t.Fatalf("Submit returned task %d, want the stored one, %d", r.id, want)
	}
	// The next submit is a new task.
	if _, err := jobs.Submit(ctx, courier.Task{Body: []byte("y")}); err != nil || q.Stats().Messages() != 2 {
		t.Fatalf("next submit: %v, %d tasks", err, q.Stats().Messages())
	}
}

// TestProducerIDOption: an explicit producer id is used, and with
// Task.Seq a second Conn (a restarted process) resending the same seq
// gets the first one's task; a bad producer id is refused.
func TestProducerIDOption(t *testing.T) {
	n := startNode(t, "127.0.0.1:0", t.TempDir())
	ctx := testutil.Context(t, wait)
	submit := func(seq uint64) courier.TaskID {
		t.Helper()
		c, err := client.Dial(ctx, n.URL(), client.Options{Log: quiet(), ProducerID: "billing-1"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if c.ProducerID() != "billing-1" {
			t.Fatalf("producer id %q", c.ProducerID())
		}
		jobs, err := c.Tasks(ctx, "invoices")
		if err != nil {
			t.Fatal(err)
		}
		id, err := jobs.Submit(ctx, courier.Task{Body: []byte("invoice"), Seq: seq})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	a := submit(42)
	if b := submit(42); b != a {
		t.Fatalf("the resend of seq 42 got task %d, want %d", b, a)
	}
	if b := submit(43); b == a {
		t.Fatal("seq 43 got seq 42's task")
	}
	if got := n.Broker().Queue("invoices").Stats().Messages(); got != 2 {
		t.Fatalf("%d tasks, want 2", got)
	}
	_, err := client.Dial(ctx, n.URL(), client.Options{Log: quiet(), ProducerID: "no spaces"})
	if !errors.Is(err, courier.ErrBadOptions) {
		t.Fatalf("bad producer id: %v", err)
	}
	c, err := client.Dial(ctx, n.URL(), client.Options{Log: quiet(), NoDedup: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ProducerID() != "" {
		t.Fatal("a producer id with NoDedup")
	}
}

// TestResendToOldServerWithoutPair: a Conn whose submits carry a pair,
// reconnected to a server that does not deduplicate (its WELCOME lacks
// "dedup"), sends the resend without pid and seq, which that server
// would refuse, and gets its confirm.
func TestResendToOldServerWithoutPair(t *testing.T) {
	n := startNode(t, "127.0.0.1:0", t.TempDir())
	p := newGatedProxy(t, n.Addr().String())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tags := make(chan string, 1)
	go func() { // an older server: no "dedup" in its WELCOME
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		r := wire.NewReader(nc, 1<<20)
		var f wire.Frame
		r.Next(&f)
		body, _ := json.Marshal(wire.Welcome{Version: 1, Conn: "old/c1", HeartbeatMS: 1000, TimeoutMS: 3000, MaxFrame: 1 << 20, Credit: 100})
		b, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeWelcome, Body: body}, 0)
		nc.Write(b)
		for r.Next(&f) == nil {
			var ans *wire.Frame
			switch f.Type {
			case wire.TypeDeclare:
				info, _ := json.Marshal(wire.ExchangeInfo{Name: f.Name, Pattern: wire.PatternTasks})
				ans = &wire.Frame{Type: wire.TypeOK, Ref: f.Ref, Body: info}
			case wire.TypeSubmit:
				tags <- f.Tag
				ans = &wire.Frame{Type: wire.TypeOK, Ref: f.Ref, Aux: 77}
			default:
				continue
			}
			b, _ := wire.AppendFrame(nil, ans, 0)
			nc.Write(b)
		}
	}()
	ctx := testutil.Context(t, 2*wait)
	evs := newConnEvents()
	c, err := client.Dial(ctx, p.url()+","+ln.Addr().String(), client.Options{Log: quiet(), OnConnEvent: evs.fn, IgnoreDiscoveredURLs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	jobs, err := c.Tasks(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	q := n.Broker().Queue("old")
	p.hold(true)
	done := make(chan error, 1)
	go func() {
		_, err := jobs.Submit(ctx, courier.Task{Body: []byte("x"), TTL: time.Minute})
		done <- err
	}()
	testutil.WaitForf(t, wait, func() bool { return q.Stats().Published == 1 }, "the first server to store the task")
	p.ln.Close() // the first server is gone for good
	p.cut()
	p.hold(false)
	if tag := testutil.Recv(t, tags, wait); tag != "ttl=60000" {
		t.Fatalf("the resend to the old server has Tag %q, want ttl=60000 alone", tag)
	}
	if err := testutil.Recv(t, done, wait); err != nil {
		t.Fatal(err)
	}
}
