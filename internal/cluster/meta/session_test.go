package meta

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
	"github.com/hashicorp/raft"
)

// applyLog runs c through the fsm as raft would, at index.
func applyLog(t *testing.T, f *fsm, index uint64, c command) *result {
	t.Helper()
	c.V = c.version()
	b, err := json.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	return f.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: b}).(*result)
}

func declareCmd(name, session string, seq, done uint64) command {
	return command{Op: opDeclare, Name: name, Config: &wire.ExchangeConfig{Pattern: wire.PatternPubSub}, Home: "n1",
		Session: session, Seq: seq, Done: done}
}

// TestSessionDuplicateApplied is the history the chaos checker found
// when retries came without sessions: a declare and a delete each
// committed twice (the node retried after its leader changed). In a
// session the second copy returns the first one's result and changes
// nothing.
func TestSessionDuplicateApplied(t *testing.T) {
	f := newFSM(nil, 1<<20)
	const s = "n1/abc"
	if r := applyLog(t, f, 1, command{Op: opOpenSession, Session: s}); r.Err != nil {
		t.Fatalf("open: %v", r.Err)
	}
	if r := applyLog(t, f, 2, declareCmd("x", s, 1, 1)); r.Err != nil || !r.Created {
		t.Fatalf("declare: %+v", r)
	}
	if r := applyLog(t, f, 3, command{Op: opDelete, Name: "x", Session: s, Seq: 2, Done: 1}); r.Err != nil {
		t.Fatalf("delete: %+v", r)
	}
	// The declare again (its first answer was lost): it is not applied
	// after the delete, and says it created the exchange, as it did.
	if r := applyLog(t, f, 4, declareCmd("x", s, 1, 1)); r.Err != nil || !r.Created || r.Exchange == nil || r.Exchange.Index != 2 {
		t.Fatalf("declare again: %+v", r)
	}
	if _, ok := f.st.Exchanges["x"]; ok {
		t.Fatal("a duplicate declare re-created the exchange after its delete")
	}
	// The delete again: its stored success, not "not found".
	if r := applyLog(t, f, 5, command{Op: opDelete, Name: "x", Session: s, Seq: 2, Done: 1}); r.Err != nil {
		t.Fatalf("delete again: %v", r.Err)
	}
	// A new command in the session is applied.
	if r := applyLog(t, f, 6, command{Op: opDelete, Name: "x", Session: s, Seq: 3, Done: 3}); !isCode(r.Err, wire.CodeNotFound) {
		t.Fatalf("third command: %v", r.Err)
	}
	// Done 3 dropped the results of 1 and 2: a copy of them now is
	// refused, never applied.
	if r := applyLog(t, f, 7, declareCmd("x", s, 1, 3)); !errors.Is(r.Err, ErrSessionExpired) {
		t.Fatalf("a command below done: %+v", r)
	}
	if _, ok := f.st.Exchanges["x"]; ok {
		t.Fatal("a command below done was applied")
	}
	// A stored error comes back as the same error.
	if r := applyLog(t, f, 8, command{Op: opDelete, Name: "x", Session: s, Seq: 3, Done: 3}); !isCode(r.Err, wire.CodeNotFound) {
		t.Fatalf("stored error: %v", r.Err)
	}
	// A session never opened applies nothing.
	if r := applyLog(t, f, 9, declareCmd("y", "n2/zzz", 1, 1)); !errors.Is(r.Err, ErrSessionExpired) {
		t.Fatalf("unknown session: %+v", r)
	}
	if len(f.st.Exchanges) != 0 {
		t.Fatalf("exchanges: %v", f.st.Exchanges)
	}
	// Only catalog commands are made in a session.
	if r := applyLog(t, f, 10, command{Op: opRenew, Name: "n1", Session: s, Seq: 4}); !errors.Is(r.Err, ErrBadCommand) {
		t.Fatalf("renewal in a session: %+v", r)
	}
}

// TestSessionUsers: user commands are exactly-once too.
func TestSessionUsers(t *testing.T) {
	f := newFSM(nil, 1<<20)
	const s = "n1/abc"
	applyLog(t, f, 1, command{Op: opOpenSession, Session: s})
	hash, err := auth.HashPassword("pw-pw-pw")
	if err != nil {
		t.Fatal(err)
	}
	put := command{Op: opPutUser, Name: "u", PasswordHash: hash, MustNotExist: true, Session: s, Seq: 1, Done: 1}
	if r := applyLog(t, f, 2, put); r.Err != nil || !r.Created {
		t.Fatalf("put: %+v", r)
	}
	if r := applyLog(t, f, 3, put); r.Err != nil || !r.Created {
		t.Fatalf("put again: %+v (a second apply would fail: the user exists)", r)
	}
}

// TestSessionTableBounded: opening more than maxSessions sessions drops
// the least recently used, the same on every replica; idle ones expire
// by log index.
func TestSessionTableBounded(t *testing.T) {
	f := newFSM(nil, 1<<20)
	for i := range maxSessions + 10 {
		applyLog(t, f, uint64(i+1), command{Op: opOpenSession, Session: fmt.Sprintf("n/%d", i)})
	}
	if len(f.sessions) != maxSessions {
		t.Fatalf("%d sessions, want %d", len(f.sessions), maxSessions)
	}
	for i := range 10 {
		if _, ok := f.sessions[fmt.Sprintf("n/%d", i)]; ok {
			t.Fatalf("the oldest session n/%d was kept", i)
		}
	}
	far := uint64(maxSessions+10) + sessionIdleEntries + 5
	applyLog(t, f, far, command{Op: opOpenSession, Session: "late/1"})
	if len(f.sessions) != 1 {
		t.Fatalf("idle sessions kept: %d", len(f.sessions))
	}
	// Results are bounded per session.
	const s = "late/1"
	for i := range maxSessionResults + 3 {
		applyLog(t, f, far+1+uint64(i), command{Op: opDelete, Name: "none", Session: s, Seq: uint64(i + 1), Done: 1})
	}
	if n := len(f.sessions[s].Results); n != maxSessionResults {
		t.Fatalf("%d results kept, want %d", n, maxSessionResults)
	}
}

// TestSnapshotKeepsSessions: a snapshot holds the session table, so a
// duplicate applied after a restore is still caught; a snapshot of
// version 1 (the state alone) still loads.
func TestSnapshotKeepsSessions(t *testing.T) {
	f := newFSM(nil, 1<<20)
	const s = "n1/abc"
	applyLog(t, f, 1, command{Op: opOpenSession, Session: s})
	applyLog(t, f, 2, declareCmd("x", s, 1, 1))
	applyLog(t, f, 3, command{Op: opDelete, Name: "x", Session: s, Seq: 2, Done: 1})
	b := snapshotBytes(t, f)
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil || string(probe["snapshot_version"]) != "2" || probe["sessions"] == nil {
		t.Fatalf("snapshot: %s", b)
	}
	g := newFSM(nil, 1<<20)
	if err := g.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
	if r := applyLog(t, g, 4, declareCmd("x", s, 1, 1)); r.Err != nil || !r.Created {
		t.Fatalf("declare again after restore: %+v", r)
	}
	if _, ok := g.st.Exchanges["x"]; ok {
		t.Fatal("a duplicate was applied after a restore")
	}

	// Version 1: the state alone.
	old, err := json.Marshal(f.st)
	if err != nil {
		t.Fatal(err)
	}
	h := newFSM(nil, 1<<20)
	if err := h.Restore(io.NopCloser(bytes.NewReader(old))); err != nil {
		t.Fatalf("a version 1 snapshot: %v", err)
	}
	if h.st.Index != f.st.Index || len(h.sessions) != 0 {
		t.Fatalf("restored %+v, %d sessions", h.st, len(h.sessions))
	}
	// A later version is refused.
	if err := h.Restore(io.NopCloser(bytes.NewReader([]byte(`{"snapshot_version":3}`)))); err == nil {
		t.Fatal("a snapshot of version 3 loaded")
	}
}

func snapshotBytes(t *testing.T, f *fsm) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return []byte(snap.(snapshot))
}

// TestClientSessionDone: Done is the lowest sequence in flight.
func TestClientSessionDone(t *testing.T) {
	var s clientSession
	s.expired("", "n1")
	var a, b, c command
	s.begin(&a)
	s.begin(&b)
	if a.Seq != 1 || b.Seq != 2 || b.Done != 1 {
		t.Fatalf("a %d/%d b %d/%d", a.Seq, a.Done, b.Seq, b.Done)
	}
	s.end(&a)
	s.begin(&c)
	if c.Done != 2 {
		t.Fatalf("done %d, want 2", c.Done)
	}
	s.end(&b)
	s.end(&c)
	s.refresh(&c)
	if c.Done != 4 {
		t.Fatalf("done %d, want 4", c.Done)
	}
}

// TestDeclareMatch: an existing exchange is judged against the
// declaration as made (Match), a new one created from Config.
func TestDeclareMatch(t *testing.T) {
	f := newFSM(nil, 1<<20)
	sticky := wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: "sticky"}
	if r := applyLog(t, f, 1, command{Op: opDeclare, Name: "q", Config: &sticky, Home: "n1"}); r.Err != nil || !r.Created {
		t.Fatalf("create: %+v", r)
	}
	filled := wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: "broadcast"}
	asMade := wire.ExchangeConfig{Pattern: wire.PatternReqResp}
	if r := applyLog(t, f, 2, command{Op: opDeclare, Name: "q", Config: &filled, Match: &asMade, Home: "n2"}); r.Err != nil || r.Created {
		t.Fatalf("a declaration naming no strategy: %+v", r)
	}
	if r := applyLog(t, f, 3, command{Op: opDeclare, Name: "q", Config: &filled, Home: "n2"}); !isCode(r.Err, wire.CodeClash) {
		t.Fatalf("the defaults judged: %+v, want a clash", r)
	}
	if r := applyLog(t, f, 4, command{Op: opDeclare, Name: "new", Config: &filled, Match: &asMade, Home: "n2"}); r.Err != nil || r.Exchange.Config.Strategy != "broadcast" {
		t.Fatalf("a new exchange: %+v", r)
	}
}
