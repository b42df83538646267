package server_test

import (
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// The heartbeat's promises, measured against a real TCP peer that goes
// silent: the server acts within the timeout (3 intervals), the
// attachments of a silent connection go at once, and an interval a
// client asks for applies from its handshake, PINGs included. Each test
// states its tolerance: scheduling on a loaded machine, not slack in the
// promise.

// timingTolerance is what a loaded two-core machine running -race may
// add to a timer and a goroutine hand-off.
const timingTolerance = 500 * time.Millisecond

// rawLeader connects a raw client asking for heartbeat interval hb,
// declares exchange as a leader-strategy request-response exchange and
// attaches it as its first handler, its leader. It returns once the
// ATTACH is answered; the client neither reads nor writes after that.
func rawLeader(t *testing.T, n *node.Node, exchange string, hb time.Duration) *raw {
	t.Helper()
	c := dialRaw(t, n)
	c.helloAsking(hb)
	decl, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: "leader"})
	c.send(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: exchange, Body: decl})
	if f := c.next(); f == nil || f.Type != wire.TypeOK {
		t.Fatalf("declare: %+v", f)
	}
	c.send(&wire.Frame{Type: wire.TypeAttach, Ref: 2, Attach: 1, Name: exchange, Aux: wire.RoleHandler})
	for f := c.next(); f == nil || f.Type != wire.TypeOK; f = c.next() {
		if f == nil {
			t.Fatal("attach: connection closed")
		}
	}
	return c
}

// TestSilentLeaderReplacedInTime: a leader whose connection goes silent
// (no FIN: the raw client neither reads nor writes) is replaced within
// the heartbeat timeout. (It took the timeout and a second more: the
// session closed only once a read deadline of a second had passed.)
func TestSilentLeaderReplacedInTime(t *testing.T) {
	// The silent leader asks for 300 ms; the other member lives by the
	// server's second.
	const hb = 300 * time.Millisecond
	n := startNode(t, time.Second)
	ctx := testutil.Context(t, 30*time.Second)
	rawLeader(t, n, "jobs", hb)
	silent := time.Now() // its last frame
	other, err := client.Dial(ctx, n.URL(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	jobs, err := other.ReqResp(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	led := make(chan time.Time, 1)
	if _, err := jobs.Handle(ctx, func(r *courier.Request) { r.Reply(nil) }, courier.OnEvent(func(e courier.Event) {
		if e.IsLeader {
			select {
			case led <- time.Now():
			default:
			}
		}
	})); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-led:
		t.Logf("new leader %s after the old one fell silent (timeout %s)", at.Sub(silent), 3*hb)
		if took := at.Sub(silent); took > 3*hb+timingTolerance {
			t.Errorf("new leader %s after the old one fell silent, want within %s (+%s)", took, 3*hb, timingTolerance)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no new leader")
	}
}

// TestAskedHeartbeatApplies: a client that asks for an interval shorter
// than the server's gets it from its handshake on: the server PINGs it
// after one interval of quiet and cuts it within three of silence. (The
// server's own interval applied until its first check: with 2 s, the
// first PING and the cut came after a second.)
func TestAskedHeartbeatApplies(t *testing.T) {
	const asked = 100 * time.Millisecond
	n := startNode(t, 2*time.Second)
	nc, err := net.Dial("tcp", n.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := &raw{t: t, nc: nc, r: wire.NewReader(nc, 1<<20)}
	body, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, Name: "raw", HeartbeatMS: int(asked / time.Millisecond)})
	c.send(&wire.Frame{Type: wire.TypeHello, Body: body})
	var f wire.Frame
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := c.r.Next(&f); err != nil || f.Type != wire.TypeWelcome {
		t.Fatalf("want WELCOME: %v %+v", err, f)
	}
	welcomed := time.Now()
	var w wire.Welcome
	if err := json.Unmarshal(f.Body, &w); err != nil || w.HeartbeatMS != int(asked/time.Millisecond) {
		t.Fatalf("WELCOME %s: %v", f.Body, err)
	}
	// From here on the client sends nothing (not even PONG) and reads.
	var pinged, cut time.Duration
	for {
		var f wire.Frame
		if err := c.r.Next(&f); err != nil {
			t.Fatalf("read: %v (pinged after %s)", err, pinged)
		}
		switch {
		case f.Type == wire.TypePing && pinged == 0:
			pinged = time.Since(welcomed)
		case f.Type == wire.TypeError && wire.Code(f.Aux) == wire.CodeHeartbeat:
			cut = time.Since(welcomed)
		}
		if cut != 0 {
			break
		}
	}
	t.Logf("asked %s: first PING after %s, cut after %s", asked, pinged, cut)
	if pinged == 0 || pinged > asked+timingTolerance {
		t.Errorf("first PING %s after the handshake, want %s (+%s)", pinged, asked, timingTolerance)
	}
	if cut > 3*asked+timingTolerance {
		t.Errorf("cut %s after the handshake, want within %s (+%s)", cut, 3*asked, timingTolerance)
	}
}
