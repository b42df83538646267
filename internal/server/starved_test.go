package server_test

import (
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/server"
	"github.com/courier-mq/courier/wire"
)

// TestStarvedReadLoopIsNotSilence: a client whose PINGs wait in the
// server's socket because the connection's read loop is behind (held
// here by a hook, as a loop starved of CPU on an overloaded machine is:
// Go runs its timers before the goroutines the network made ready) is
// not silent, and the server must not cut it for the heartbeat. It did:
// in the 5-node fan-out of issue 14, servers cut hundreds of subscriber
// connections "for silence" while their PINGs waited unread, and
// everything queued for them was lost.
func TestStarvedReadLoopIsNotSilence(t *testing.T) {
	n := startNode(t, 5*time.Second)
	c := dialRaw(t, n)
	// 100 ms heartbeats: the server cuts after 300 ms of silence.
	if w := c.helloAsking(100 * time.Millisecond); w.HeartbeatMS != 100 {
		t.Fatalf("heartbeat agreed %d ms, want 100", w.HeartbeatMS)
	}
	hold := make(chan struct{})
	held := make(chan struct{}, 1)
	server.SetReadHook(func() {
		select {
		case held <- struct{}{}:
		default:
		}
		<-hold
	})
	defer server.SetReadHook(nil)
	defer func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	}()
	// The read loop takes this PING, then stops at the hook before the
	// next frame.
	c.send(&wire.Frame{Type: wire.TypePing, Ref: 1})
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the read loop did not reach the hook")
	}
	// The client keeps its heartbeat for 2 s, well past the 300 ms
	// timeout, while the server reads nothing.
	for i := range 40 {
		c.send(&wire.Frame{Type: wire.TypePing, Ref: uint64(i + 2)})
		time.Sleep(50 * time.Millisecond)
	}
	server.SetReadHook(nil)
	close(hold)
	// The connection is alive: the server answers every PING, the last
	// one included, and cut nothing.
	for {
		f := c.next()
		if f == nil {
			t.Fatal("the server closed the connection of a client that kept its heartbeat")
		}
		if f.Type == wire.TypeError {
			t.Fatalf("the server cut the connection: %s (code %d)", f.Tag, f.Aux)
		}
		if f.Type == wire.TypePong && f.Ref == 41 {
			return
		}
	}
}
