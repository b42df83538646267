//go:build unix

package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/server"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// A peer that stops reading must be found out however large the
// machine's socket buffers are. These tests make the stall certain: the
// stalled client's receive buffer is set small before it connects, the
// flood goes on until the server acts (bounded in time), and a test
// waits for the server's own account of a blocked write
// (server.ConnInfo.SendBlocked) rather than guess how much fills the
// buffers.

// dialStalled connects a raw client named name whose socket takes
// almost nothing; it sends HELLO and reads WELCOME, and then reads no
// more.
func dialStalled(t *testing.T, n *node.Node, name string) *raw {
	t.Helper()
	return dialStalledAsking(t, n, name, 0)
}

// dialStalledAsking is dialStalled asking for heartbeat interval hb.
func dialStalledAsking(t *testing.T, n *node.Node, name string, hb time.Duration) *raw {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	nc, err := d.Dial("tcp", n.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &raw{t: t, nc: nc, r: wire.NewReader(nc, 1<<20)}
	body, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, Name: name, HeartbeatMS: int(hb / time.Millisecond)})
	c.send(&wire.Frame{Type: wire.TypeHello, Body: body})
	if f := c.next(); f == nil || f.Type != wire.TypeWelcome {
		t.Fatalf("want WELCOME, got %+v", f)
	}
	return c
}

// attach attaches the raw client to exchange with role and waits for OK.
func (c *raw) attach(exchange string, role uint64, spec wire.AttachSpec) {
	c.t.Helper()
	body, _ := json.Marshal(spec)
	c.send(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: exchange, Aux: role, Body: body})
	for {
		f := c.next()
		switch {
		case f != nil && f.Type == wire.TypeEvent:
			continue // a handler hears of its group first
		case f == nil || f.Type != wire.TypeOK:
			c.t.Fatalf("attach: %+v", f)
		}
		return
	}
}

// pinging has c send a PING every interval, so that it is not silent,
// until the returned func is called.
func (c *raw) pinging(interval time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypePing, Ref: 1}, 0)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if _, err := c.nc.Write(p); err != nil {
					return
				}
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// session returns the session of the connection named name, or nil.
func session(n *node.Node, name string) *broker.Session {
	for _, s := range n.Broker().Sessions(nil) {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

// blockedFor returns how long the server's write to the connection
// named name has lasted, -1 once that connection is gone.
func blockedFor(n *node.Node, name string) time.Duration {
	s := session(n, name)
	if s == nil {
		return -1
	}
	ci, _ := server.Describe(s.Sink())
	return ci.SendBlocked
}

// waitBlocked waits until the server has been held in a write to the
// connection named name for at least 100 ms (a write to a socket with
// room takes microseconds), and returns when that write began.
func waitBlocked(t *testing.T, n *node.Node, name string) time.Time {
	t.Helper()
	var began time.Time
	testutil.WaitForf(t, 30*time.Second, func() bool {
		b := blockedFor(n, name)
		if b >= 100*time.Millisecond {
			began = time.Now().Add(-b)
			return true
		}
		return false
	}, "the server's write to %s never blocked", name)
	return began
}

// flood publishes 16 KiB messages on ex until stop is closed or a
// publish fails; it returns how many it published.
func flood(ctx context.Context, ex *courier.PubSub, stop <-chan struct{}) (published chan int) {
	published = make(chan int, 1)
	go func() {
		body := make([]byte, 16<<10)
		n := 0
		defer func() { published <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := ex.Publish(ctx, "k", body); err != nil {
				return
			}
			n++
		}
	}()
	return published
}

// TestStalledConsumer: a subscriber that stops reading holds at most its
// outbox; once the slow-consumer timeout passes it is cut off, alone,
// and the publisher and the other subscriber get on with every message.
// (It failed on every run on a machine with 4 MiB send and 32 MiB
// receive buffers, when the flood was a fixed 4 MB and the server's
// writes had no deadline.)
func TestStalledConsumer(t *testing.T) {
	const slow = 300 * time.Millisecond
	n := startNodeWith(t, func(c *node.Config) {
		c.Limits.OutboxBytes = 64 << 10
		c.Limits.SlowConsumerTimeout = slow
	})
	ctx := testutil.Context(t, 60*time.Second)
	pub, err := dial(t, n, client.Options{}).PubSub(ctx, "feed")
	if err != nil {
		t.Fatal(err)
	}
	stalled := dialStalled(t, n, "stalled")
	stalled.attach("feed", wire.RoleSubscriber, wire.AttachSpec{Patterns: []string{"#"}})
	var got atomic.Int64
	healthy, err := dial(t, n, client.Options{}).PubSub(ctx, "feed")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := healthy.Subscribe(ctx, "#", func(*courier.Delivery) { got.Add(1) }); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	published := flood(ctx, pub, stop)
	began := waitBlocked(t, n, "stalled")
	testutil.WaitForf(t, 20*time.Second, func() bool {
		return n.Broker().Exchange("feed").Subscribers() == 1
	}, "the stalled subscriber was not cut off")
	cut := time.Since(began)
	close(stop)
	total := <-published
	testutil.WaitForf(t, 20*time.Second, func() bool { return got.Load() == int64(total) },
		"the healthy subscriber got %d of %d", got.Load(), total)
	// Promised: cut within the timeout plus one second; two more for a
	// loaded machine to notice.
	if cut > slow+3*time.Second {
		t.Errorf("the stalled subscriber was cut %s after the server's write to it blocked, want %s (+1s)", cut, slow)
	}
}

// TestSilentPeerCutWhileWriteBlocked: a peer that neither reads nor
// sends is cut by the heartbeat timeout, even while the server is held
// in a write to it, long before the slow-consumer timeout.
func TestSilentPeerCutWhileWriteBlocked(t *testing.T) {
	const hb = 200 * time.Millisecond // the silent peer's, asked; the others live by the server's second
	n := startNodeWith(t, func(c *node.Config) {
		c.Limits.OutboxBytes = 64 << 10
		c.Limits.SlowConsumerTimeout = time.Minute
	})
	ctx := testutil.Context(t, 60*time.Second)
	pub, err := dial(t, n, client.Options{}).PubSub(ctx, "feed")
	if err != nil {
		t.Fatal(err)
	}
	stalled := dialStalledAsking(t, n, "silent", hb)
	stopPings := stalled.pinging(hb / 4)
	defer stopPings()
	stalled.attach("feed", wire.RoleSubscriber, wire.AttachSpec{Patterns: []string{"#"}})
	stop := make(chan struct{})
	defer close(stop)
	flood(ctx, pub, stop)
	waitBlocked(t, n, "silent")
	stopPings()
	silent := time.Now()
	testutil.WaitForf(t, 20*time.Second, func() bool {
		return n.Broker().Exchange("feed").Subscribers() == 0
	}, "the silent peer was not cut off while the server's write to it was blocked")
	// Promised: the heartbeat timeout (3 × hb) plus one second; two more
	// for a loaded machine.
	if took := time.Since(silent); took > 3*hb+3*time.Second {
		t.Errorf("the silent peer was cut %s after it fell silent, want %s (+1s)", took, 3*hb)
	}
}

// TestStalledHandlerDoesNotHoldRequester: a handler that stops reading
// never holds up its requesters' traffic to other exchanges. Requests
// for it fail at once (code 19) once its outbox holds eight times the
// limit, and the handler is cut by the write timeout. (Before, the
// requester's read loop waited for room in the handler's outbox, the
// slow-consumer timeout for every request.)
func TestStalledHandlerDoesNotHoldRequester(t *testing.T) {
	const slow = 5 * time.Second
	n := startNodeWith(t, func(c *node.Config) {
		c.Limits.OutboxBytes = 16 << 10
		c.Limits.SlowConsumerTimeout = slow
		// The offer limit is 8 × 16 KiB + 2 × (this + 64 KiB): small, so
		// that the flood passes it long before the timeout however
		// loaded the machine (with 4 MiB frames, 9 MiB, it did not once).
		c.Limits.MaxFrame = 64 << 10
	})
	ctx := testutil.Context(t, 90*time.Second)
	fast := echoService(t, n, "fast") // its own requester connection...
	req := dial(t, n, client.Options{Name: "requester"})
	// ...and the connection under test, which requests from both.
	fastEx, err := req.ReqResp(ctx, "fast")
	if err != nil {
		t.Fatal(err)
	}
	_ = fast
	slowEx, err := req.ReqResp(ctx, "slow", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	stalled := dialStalled(t, n, "stalled-handler")
	stopPings := stalled.pinging(100 * time.Millisecond) // alive, but never reading
	defer stopPings()
	stalled.attach("slow", wire.RoleHandler, wire.AttachSpec{})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[wire.Code]int{}
	// Many requesters, each giving up soon and sending another: the
	// requests pile up for the handler until everything is full.
	for range 64 {
		wg.Go(func() {
			body := make([]byte, 32<<10)
			for {
				select {
				case <-stop:
					return
				default:
				}
				rctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
				_, err := slowEx.Request(rctx, courier.Message{Body: body})
				cancel()
				var we *wire.Error
				mu.Lock()
				if errors.As(err, &we) {
					codes[we.Code]++
				} else if err != nil {
					codes[wire.CodeTimeout]++
				} else {
					codes[wire.CodeOK]++
				}
				mu.Unlock()
				if we != nil && we.Code != wire.CodeSlowConsumer {
					time.Sleep(time.Millisecond) // handler gone: do not spin
				}
			}
		})
	}
	began := waitBlocked(t, n, "stalled-handler")
	var worst time.Duration
	var cut time.Duration
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := fastEx.Request(rctx, courier.Message{Body: []byte("ping")})
		cancel()
		if err != nil {
			t.Fatalf("request to the healthy exchange: %v", err)
		}
		worst = max(worst, time.Since(start))
		if cut == 0 && session(n, "stalled-handler") == nil {
			cut = time.Since(began)
		}
		if cut != 0 && time.Since(began) > cut+time.Second {
			break // and a second more after the cut
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("healthy requests: worst %s; stalled handler cut %s after its write blocked; slow requests by code: %v", worst, cut, codes)
	if worst >= slow {
		t.Errorf("a request to the healthy exchange took %s: the stalled handler held its requester for the slow-consumer timeout", worst)
	}
	if cut == 0 {
		t.Fatal("the stalled handler was never cut")
	}
	if cut > slow+3*time.Second {
		t.Errorf("the stalled handler was cut %s after its write blocked, want %s (+1s)", cut, slow)
	}
	if codes[wire.CodeSlowConsumer] == 0 {
		t.Errorf("no request for the stalled handler failed with code 19: %v", codes)
	}
}
