package meta

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// rawForward dials node's forwarding listener directly, as a peer (or a
// hostile one) would.
func rawForward(t *testing.T, c *testCluster, node string) net.Conn {
	t.Helper()
	c.tn.mu.Lock()
	addr := c.tn.fwdOf[node]
	c.tn.mu.Unlock()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	return conn
}

// readAnswer reads one frame and then expects the connection to close.
func readAnswer(t *testing.T, conn net.Conn, closes bool) (byte, response) {
	t.Helper()
	r := bufio.NewReader(conn)
	var resp response
	typ, err := readFrame(r, &resp, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	if closes {
		if _, err := r.ReadByte(); err != io.EOF {
			t.Fatalf("connection not closed after a bad frame: %v", err)
		}
	}
	return typ, resp
}

func TestForwardProtocolRefusesBadFrames(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.waitLeader(10 * time.Second).NodeID()
	header := func(version, typ byte, n uint32) []byte {
		b := []byte{version, typ, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[2:], n)
		return b
	}
	cases := []struct {
		name string
		send []byte
		want string
	}{
		{"too large", header(protoVersion, typeApply, maxFrame+1), "at most"},
		{"4 GiB", header(protoVersion, typeApply, 1<<32-1), "at most"},
		{"other version", append(header(9, typeApply, 2), "{}"...), "version 9"},
		{"not JSON", append(header(protoVersion, typeApply, 3), "{{{"...), "bad forwarding frame"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn := rawForward(t, c, lead)
			conn.Write(tc.send)
			typ, resp := readAnswer(t, conn, true)
			if typ != typeError || resp.Err == nil || !strings.Contains(resp.Err.Msg, tc.want) || !errors.Is(resp.Err.err(), ErrBadFrame) {
				t.Fatalf("answer %x %+v, want an error with %q", typ, resp.Err, tc.want)
			}
		})
	}
	// Commands only the leader makes itself are refused from a peer.
	for _, op := range []string{opBump, opRehome, opForget, opUnforget, "made-up"} {
		conn := rawForward(t, c, lead)
		if err := writeFrame(conn, typeApply, request{TimeoutMS: 1000, Command: &command{V: cmdVersion, Op: op, Name: "n2"}}); err != nil {
			t.Fatal(err)
		}
		typ, resp := readAnswer(t, conn, false)
		if typ != typeError || !errors.Is(resp.Err.err(), ErrBadFrame) {
			t.Fatalf("%s from a peer: %x %+v", op, typ, resp.Err)
		}
	}
	// A command of another version is refused.
	conn0 := rawForward(t, c, lead)
	writeFrame(conn0, typeApply, request{TimeoutMS: 1000, Command: &command{V: cmdVersion + 1, Op: opDelete, Name: "x"}})
	if typ, resp := readAnswer(t, conn0, false); typ != typeError || !errors.Is(resp.Err.err(), ErrBadCommand) {
		t.Fatalf("command of a later version: %x %+v", typ, resp.Err)
	}
	// An unknown request type is refused; a request without time left
	// too; the connection then serves a good request.
	conn := rawForward(t, c, lead)
	writeFrame(conn, 42, request{TimeoutMS: 1000})
	if typ, _ := readAnswer(t, conn, false); typ != typeError {
		t.Fatalf("unknown type answered %x", typ)
	}
	writeFrame(conn, typeRead, request{})
	if typ, resp := readAnswer(t, conn, false); typ != typeError || !errors.Is(resp.Err.err(), ErrNoQuorum) {
		t.Fatalf("request without time: %x %+v", typ, resp.Err)
	}
	writeFrame(conn, typeStatus, request{TimeoutMS: 1000})
	if typ, resp := readAnswer(t, conn, false); typ != typeOK || resp.Status == nil || resp.Status.Leader != lead || !resp.Status.HasState {
		t.Fatalf("status: %x %+v", typ, resp.Status)
	}
	// A follower asked for a read index says it does not lead.
	conn = rawForward(t, c, c.follower().NodeID())
	writeFrame(conn, typeRead, request{TimeoutMS: 1000})
	if typ, resp := readAnswer(t, conn, false); typ != typeError || !errors.Is(resp.Err.err(), ErrNotLeader) {
		t.Fatalf("read index from a follower: %x %+v", typ, resp.Err)
	}
}

func TestErrorsCrossTheWire(t *testing.T) {
	for _, err := range []error{
		wire.Errorf(wire.CodeClash, "exchange %q exists", "x"),
		auth.ErrLastAdmin, ErrNoQuorum, ErrRemoved, errors.New("something else"),
	} {
		back := encodeError(err).err()
		var we, got *wire.Error
		switch {
		case errors.As(err, &we):
			if !errors.As(back, &got) || *got != *we {
				t.Errorf("%v came back as %v", err, back)
			}
		case back.Error() != err.Error():
			t.Errorf("%v came back as %v", err, back)
		case err.Error() != "something else" && !errors.Is(back, err):
			t.Errorf("%v came back as %v, not the sentinel", err, back)
		}
	}
	if encodeError(nil) != nil || (*errInfo)(nil).err() != nil {
		t.Error("nil error not nil")
	}
}

// TestPeerIdentityLimitsCommands: a peer whose identity the stream
// proves may renew only its own record and declare only exchanges homed
// on itself.
func TestPeerIdentityLimitsCommands(t *testing.T) {
	c := newCluster(t, 3, nil)
	lead := c.leader()
	cfg := wire.ExchangeConfig{Pattern: wire.PatternPubSub}
	for _, tc := range []struct {
		cmd command
		ok  bool
	}{
		{command{Op: opRenew, Name: "n9"}, true},
		{command{Op: opRenew, Name: "n1"}, false},
		{command{Op: opDeclare, Name: "x", Config: &cfg, Home: "n9"}, true},
		{command{Op: opDeclare, Name: "y", Config: &cfg, Home: "n1"}, false},
	} {
		tc.cmd.V = cmdVersion
		resp := lead.handle(typeApply, &request{TimeoutMS: 5000, Command: &tc.cmd}, "n9")
		if got := resp.Err == nil; got != tc.ok {
			t.Errorf("%s %s%s from n9: %+v", tc.cmd.Op, tc.cmd.Name, tc.cmd.Home, resp.Err)
		}
	}
	// A queue's leader records only itself as the queue's home.
	ql := command{V: cmdVersion, Op: opQueueLeader, Name: "q", Home: "n1", Group: 1, Epoch: 1}
	if resp := lead.handle(typeApply, &request{TimeoutMS: 5000, Command: &ql}, "n9"); resp.Err == nil || !errors.Is(resp.Err.err(), ErrBadFrame) {
		t.Errorf("queue-leader n1 from n9: %+v", resp.Err)
	}
	// And only itself as the one that made a membership change.
	md := command{V: cmdVersion, Op: opQueueMemberDone, Name: "q", Home: "n1", Group: 1, Member: "n9"}
	if resp := lead.handle(typeApply, &request{TimeoutMS: 5000, Command: &md}, "n9"); resp.Err == nil || !errors.Is(resp.Err.err(), ErrBadFrame) {
		t.Errorf("queue-member-done by n1 from n9: %+v", resp.Err)
	}
	// A heartbeat too: only for the sender's own record, once the
	// leader has started its term, and only from a node that marks it
	// on the voters (one of an older version renews through the log).
	n1 := lead.cfg.NodeID
	beat := func(node, peer string) response {
		return lead.handle(typeBeat, &request{TimeoutMS: 5000, Node: node, Marks: true}, peer)
	}
	// Live once the leader's first renewal is applied, which on a loaded
	// machine may come after it answers heartbeats.
	testutil.WaitForf(t, 15*time.Second, func() bool {
		r := beat(n1, n1)
		return r.Err == nil && r.Beat != nil && r.Beat.Live
	}, "the leader answers its own heartbeats as live")
	if resp := beat("n1", "n9"); resp.Err == nil || !errors.Is(resp.Err.err(), ErrBadFrame) {
		t.Errorf("heartbeat for n1 from n9: %+v", resp.Err)
	}
	if resp := lead.handle(typeBeat, &request{TimeoutMS: 5000, Node: "n9"}, "n9"); resp.Err == nil || !errors.Is(resp.Err.err(), ErrBadFrame) {
		t.Errorf("heartbeat without marks: %+v", resp.Err)
	}
	if resp := beat("n9", "n9"); resp.Err != nil || resp.Beat == nil || !resp.Beat.Live || resp.Beat.Term != lead.raft.CurrentTerm() || len(resp.Beat.Voters) != 3 {
		t.Errorf("heartbeat of n9 (renewed above) from n9: %+v %+v", resp.Err, resp.Beat)
	}
	resp := beat(n1, n1)
	if e, _ := lead.Lease(); resp.Err != nil || resp.Beat == nil || !resp.Beat.Live || resp.Beat.Epoch != e {
		t.Errorf("heartbeat of the leader %s from itself: %+v %+v, epoch %d", n1, resp.Err, resp.Beat, e)
	}

	// Marks: only of the sender's own heartbeats.
	f := c.follower()
	if resp := f.handle(typeMark, &request{TimeoutMS: 5000, Node: "n1"}, "n9"); resp.Err == nil || !errors.Is(resp.Err.err(), ErrBadFrame) {
		t.Errorf("mark for n1 from n9: %+v", resp.Err)
	}
	if resp := f.handle(typeMark, &request{TimeoutMS: 5000, Node: "n9", Config: 7}, "n9"); resp.Err != nil || resp.Mark == nil {
		t.Errorf("mark of n9 from n9: %+v", resp.Err)
	}
	// Fencing rounds: only from the leader the voter follows, in its
	// term; a node that is not the leader cannot fence the heartbeats
	// the leader answers.
	term := f.raft.CurrentTerm()
	if resp := f.handle(typeFence, &request{TimeoutMS: 5000, Term: term}, "n9"); resp.Err == nil || !errors.Is(resp.Err.err(), ErrNotLeader) {
		t.Errorf("fencing round from n9, not the leader: %+v", resp.Err)
	}
	if resp := f.handle(typeFence, &request{TimeoutMS: 5000, Term: term + 1}, n1); resp.Err == nil || !errors.Is(resp.Err.err(), ErrStale) {
		t.Errorf("fencing round of a term to come: %+v", resp.Err)
	}
	resp = f.handle(typeFence, &request{TimeoutMS: 5000, Term: term}, n1)
	if resp.Err != nil || resp.Fence == nil || resp.Fence.Receipts["n9"].Config != 7 {
		t.Errorf("fencing round from the leader %s: %+v %+v", n1, resp.Err, resp.Fence)
	}
}
