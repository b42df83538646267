package server_test

// Tests of what docs/protocol.md says a client may rely on where a
// client written from it alone had to guess (issue 13 §6), each against
// a real server over TCP, frame by frame.

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// until reads frames, skipping PINGs, until one satisfies want; it fails
// the test if the connection ends first or a frame refused by bad fails.
func (c *raw) until(what string, want func(*wire.Frame) bool, bad func(*wire.Frame) bool) *wire.Frame {
	c.t.Helper()
	for {
		f := c.next()
		switch {
		case f == nil:
			c.t.Fatalf("connection ended while waiting for %s", what)
		case want(f):
			return f
		case bad != nil && bad(f):
			c.t.Fatalf("while waiting for %s: %s Ref %d flags 0x%02x Aux %d Tag %q", what, f.Type, f.Ref, f.Flags, f.Aux, f.Tag)
		}
	}
}

// answer waits for the OK or ERROR of ref, skipping other frames.
func (c *raw) answer(ref uint64) *wire.Frame {
	c.t.Helper()
	return c.until("the answer", func(f *wire.Frame) bool {
		return (f.Type == wire.TypeOK || f.Type == wire.TypeError) && f.Ref == ref
	}, nil)
}

// declare declares exchange name with pattern and waits for its OK.
func (c *raw) declare(ref uint64, name, pattern string) {
	c.t.Helper()
	body, _ := json.Marshal(wire.ExchangeConfig{Pattern: pattern})
	c.send(&wire.Frame{Type: wire.TypeDeclare, Ref: ref, Name: name, Body: body})
	if f := c.answer(ref); f.Type != wire.TypeOK {
		c.t.Fatalf("declare %s: ERROR %d %s", name, f.Aux, f.Tag)
	}
}

func isEvent(kind uint64, member string) func(*wire.Frame) bool {
	return func(f *wire.Frame) bool {
		if f.Type != wire.TypeEvent || f.Aux != kind {
			return false
		}
		var ev wire.EventBody
		return json.Unmarshal(f.Body, &ev) == nil && ev.Member != nil && ev.Member.ID == member
	}
}

// §2.4: a defined flag on another frame type is no error, and a PONG
// copies the PING's flags.
func TestDocFlagsOnOtherTypes(t *testing.T) {
	c := dialRaw(t, startNode(t, time.Second))
	c.hello()
	flags := wire.FlagReply | wire.FlagError
	c.send(&wire.Frame{Type: wire.TypePing, Flags: flags, Ref: 9})
	f := c.until("PONG", func(f *wire.Frame) bool { return f.Type == wire.TypePong }, nil)
	if f.Ref != 9 || f.Flags != flags {
		t.Fatalf("PONG Ref %d flags 0x%02x, want Ref 9 and the PING's flags 0x%02x", f.Ref, f.Flags, flags)
	}
	body, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternPubSub})
	c.send(&wire.Frame{Type: wire.TypeDeclare, Flags: wire.FlagChunk | wire.FlagFatal, Ref: 1, Name: "doc.flags", Body: body})
	if f := c.answer(1); f.Type != wire.TypeOK {
		t.Fatalf("DECLARE with flags Chunk and Fatal: ERROR %d %s, want OK", f.Aux, f.Tag)
	}
}

// §4.6: an operation with Ref 0 is carried out and answered with Ref 0.
func TestDocRefZeroAnswered(t *testing.T) {
	c := dialRaw(t, startNode(t, time.Second))
	c.hello()
	body, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternPubSub})
	c.send(&wire.Frame{Type: wire.TypeDeclare, Name: "doc.ref0", Body: body})
	f := c.answer(0)
	var info wire.ExchangeInfo
	if f.Type != wire.TypeOK || json.Unmarshal(f.Body, &info) != nil || info.Name != "doc.ref0" {
		t.Fatalf("DECLARE with Ref 0: %s Ref %d Aux %d body %s, want OK with Ref 0", f.Type, f.Ref, f.Aux, f.Body)
	}
	c.send(&wire.Frame{Type: wire.TypePublish, Flags: wire.FlagReply, Name: "doc.ref0", Key: "k"})
	if f := c.answer(0); f.Type != wire.TypeOK {
		t.Fatalf("PUBLISH with Reply and Ref 0: ERROR %d %s, want OK with Ref 0", f.Aux, f.Tag)
	}
}

// §4.6: a SUBMIT with Reply but Ref 0 gets no OK; one with a Ref does.
func TestDocSubmitReplyRefZero(t *testing.T) {
	c := dialRaw(t, startNode(t, time.Second))
	c.hello()
	c.declare(1, "doc.confirm", wire.PatternTasks)
	c.send(&wire.Frame{Type: wire.TypeSubmit, Flags: wire.FlagReply, Name: "doc.confirm", Body: []byte("a")})
	c.send(&wire.Frame{Type: wire.TypeSubmit, Flags: wire.FlagReply, Ref: 2, Name: "doc.confirm", Body: []byte("b")})
	// Tasks of one queue are confirmed in order: an answer for the first
	// would come before the second's.
	f := c.until("the confirm of Ref 2",
		func(f *wire.Frame) bool { return f.Type == wire.TypeOK && f.Ref == 2 },
		func(f *wire.Frame) bool { return f.Type == wire.TypeOK || f.Type == wire.TypeError })
	if f.Aux != 2 {
		t.Fatalf("the confirm of the second task has task id %d, want 2 (the first task was taken)", f.Aux)
	}
}

// §5.1: a DECLARE may leave out its body; passive, it checks only that
// the exchange exists.
func TestDocDeclareWithoutBody(t *testing.T) {
	c := dialRaw(t, startNode(t, time.Second))
	c.hello()
	c.declare(1, "doc.open", wire.PatternPubSub)
	cases := []struct {
		ref  uint64
		name string
		aux  uint64 // 1: passive
		code wire.Code
	}{
		{2, "doc.open", 1, 0},
		{3, "doc.open", 0, 0},
		{4, "doc.none", 1, wire.CodeNotFound},
		{5, "doc.none", 0, wire.CodeBadOptions},
	}
	for _, tc := range cases {
		c.send(&wire.Frame{Type: wire.TypeDeclare, Ref: tc.ref, Name: tc.name, Aux: tc.aux})
		f := c.answer(tc.ref)
		switch {
		case tc.code == 0 && f.Type != wire.TypeOK:
			t.Errorf("DECLARE %s Aux %d without body: ERROR %d %s, want OK", tc.name, tc.aux, f.Aux, f.Tag)
		case tc.code == 0:
			var info wire.ExchangeInfo
			if err := json.Unmarshal(f.Body, &info); err != nil || info.Pattern != wire.PatternPubSub {
				t.Errorf("DECLARE %s Aux %d without body: OK body %s, want its ExchangeInfo", tc.name, tc.aux, f.Body)
			}
		case f.Type != wire.TypeError || wire.Code(f.Aux) != tc.code:
			t.Errorf("DECLARE %s Aux %d without body: %s Aux %d, want ERROR %d", tc.name, tc.aux, f.Type, f.Aux, tc.code)
		}
	}
}

// §3, §4.3: SUBMIT uses credit and is given it back, as PUBLISH and
// REQUEST are: with a window of 4, 12 SUBMITs sent as credit comes in
// are all taken.
func TestDocSubmitUsesCredit(t *testing.T) {
	const window = 4
	c := dialRaw(t, startNodeWith(t, func(cfg *node.Config) { cfg.Limits.Credit = window }))
	if w := c.hello(); w.Credit != window {
		t.Fatalf("WELCOME credit %d, want %d", w.Credit, window)
	}
	c.declare(1, "doc.credit", wire.PatternTasks)
	credit := uint64(window)
	for sent := 0; sent < 3*window; {
		for ; credit > 0 && sent < 3*window; credit-- {
			c.send(&wire.Frame{Type: wire.TypeSubmit, Name: "doc.credit", Body: []byte("t")})
			sent++
		}
		if sent == 3*window {
			break
		}
		f := c.until("CREDIT", func(f *wire.Frame) bool { return f.Type == wire.TypeCredit },
			func(f *wire.Frame) bool { return f.Type == wire.TypeError })
		credit += f.Aux
	}
	c.send(&wire.Frame{Type: wire.TypeList, Ref: 2})
	if f := c.answer(2); f.Type != wire.TypeOK {
		t.Fatalf("after 12 SUBMITs on credit: ERROR %d %s", f.Aux, f.Tag)
	}
}

// §9, §10: the workers of a competing task exchange form its group and
// get leader, member-up and member-down events.
func TestDocCompetingWorkersFormAGroup(t *testing.T) {
	n := startNode(t, time.Second)
	a, b := dialRaw(t, n), dialRaw(t, n)
	wa, wb := a.hello(), b.hello()
	a.declare(1, "doc.workers", wire.PatternTasks)
	attach := func(c *raw, conn string) string {
		c.send(&wire.Frame{Type: wire.TypeAttach, Ref: 2, Attach: 1, Name: "doc.workers", Aux: wire.RoleWorker})
		me := conn + ".1"
		c.until("its leader event", isEvent(wire.EventLeader, me), nil)
		if f := c.answer(2); f.Type != wire.TypeOK {
			t.Fatalf("ATTACH as worker: ERROR %d %s", f.Aux, f.Tag)
		}
		return me
	}
	attach(a, wa.Conn)
	mb := attach(b, wb.Conn)
	a.until("member-up of the second worker", isEvent(wire.EventMemberUp, mb), nil)
	b.send(&wire.Frame{Type: wire.TypeDetach, Ref: 3, Attach: 1})
	a.until("member-down of the second worker", isEvent(wire.EventMemberDown, mb), nil)
}

// §5.1, §6.3, §11: a request in flight on an exchange that is deleted
// fails at its requester with code 11, not 20.
func TestDocDeleteFailsRequestsWithHandlerGone(t *testing.T) {
	n := startNode(t, time.Second)
	h, r := dialRaw(t, n), dialRaw(t, n)
	h.hello()
	r.hello()
	h.declare(1, "doc.deleted", wire.PatternReqResp)
	h.send(&wire.Frame{Type: wire.TypeAttach, Ref: 2, Attach: 1, Name: "doc.deleted", Aux: wire.RoleHandler})
	if f := h.answer(2); f.Type != wire.TypeOK {
		t.Fatalf("ATTACH: ERROR %d %s", f.Aux, f.Tag)
	}
	r.send(&wire.Frame{Type: wire.TypeRequest, Ref: 7, Name: "doc.deleted", Body: []byte("q")})
	h.until("the REQUEST", func(f *wire.Frame) bool { return f.Type == wire.TypeRequest }, nil)
	r.send(&wire.Frame{Type: wire.TypeDelete, Ref: 8, Name: "doc.deleted"})
	f := r.until("the failed RESPONSE", func(f *wire.Frame) bool { return f.Type == wire.TypeResponse && f.Ref == 7 }, nil)
	if f.Flags != wire.FlagError|wire.FlagLast || wire.Code(f.Aux) != wire.CodeHandlerGone {
		t.Fatalf("RESPONSE flags 0x%02x code %d %q, want flags Error|Last and code 11", f.Flags, f.Aux, f.Tag)
	}
	if f := h.until("EVENT detached", func(f *wire.Frame) bool { return f.Type == wire.TypeEvent && f.Aux == wire.EventDetached }, nil); f.Attach != 1 {
		t.Fatalf("EVENT detached for attachment %d, want 1", f.Attach)
	}
}
