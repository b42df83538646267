package meta

import (
	"bytes"
	"errors"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

func TestLivenessCommands(t *testing.T) {
	f := newFSM(nil, 1<<20)
	do := func(i uint64, c command) result {
		r, _ := f.apply(i, &c)
		return r
	}
	if r := do(1, command{Op: opRenew, Name: "a"}); r.Err != nil || r.Epoch != 1 {
		t.Fatalf("first renewal: %+v", r)
	}
	do(2, command{Op: opRenew, Name: "b"})
	// A bump that names an older renewal is stale: the node renewed since.
	do(3, command{Op: opRenew, Name: "a", Epoch: 1})
	if r := do(4, command{Op: opBump, Name: "a", Epoch: 1, Renewed: 1}); !errors.Is(r.Err, ErrStale) {
		t.Fatalf("bump of a renewed record: %+v", r)
	}
	if r := do(5, command{Op: opBump, Name: "a", Epoch: 1, Renewed: 3}); r.Err != nil || r.Epoch != 2 || !f.st.Nodes["a"].Expired {
		t.Fatalf("bump: %+v %+v", r, f.st.Nodes["a"])
	}
	if r := do(6, command{Op: opBump, Name: "a", Epoch: 1, Renewed: 3}); !errors.Is(r.Err, ErrStale) {
		t.Fatalf("second bump: %+v", r)
	}
	if r := do(7, command{Op: opBump, Name: "zz"}); !errors.Is(r.Err, ErrUnknownNode) {
		t.Fatalf("bump of an unknown node: %+v", r)
	}
	// The expired node renews with its old epoch and learns the new one.
	if r := do(8, command{Op: opRenew, Name: "a", Epoch: 1}); r.Err != nil || r.Epoch != 2 || f.st.Nodes["a"].Expired {
		t.Fatalf("renewal after a bump: %+v %+v", r, f.st.Nodes["a"])
	}
	if r := do(9, command{Op: opRehome, Name: "a"}); !errors.Is(r.Err, ErrStale) {
		t.Fatalf("re-homing a live node: %+v", r)
	}
	// Forget tombstones: renewals are refused.
	do(10, command{Op: opForget, Name: "b"})
	if r := do(11, command{Op: opRenew, Name: "b"}); !errors.Is(r.Err, ErrRemoved) {
		t.Fatalf("renewal of a removed node: %+v", r)
	}
	do(12, command{Op: opUnforget, Name: "b"})
	if r := do(13, command{Op: opRenew, Name: "b"}); r.Err != nil || r.Epoch != 1 {
		t.Fatalf("renewal after unforget: %+v", r)
	}
}

// TestRehomeIsDeterministic: the same state re-homes the same way, by
// load, ties by node name; with no live node nothing moves.
func TestRehomeIsDeterministic(t *testing.T) {
	build := func() *fsm {
		f := newFSM(nil, 1<<20)
		i := uint64(0)
		next := func() uint64 { i++; return i }
		for _, n := range []string{"c", "a", "b"} {
			f.apply(next(), &command{Op: opRenew, Name: n})
		}
		cfg := wire.ExchangeConfig{Pattern: wire.PatternPubSub}
		for _, x := range []struct{ name, home string }{{"x1", "a"}, {"x2", "a"}, {"x3", "a"}, {"x4", "a"}, {"x5", "a"}, {"y", "b"}} {
			f.apply(next(), &command{Op: opDeclare, Name: x.name, Config: &cfg, Home: x.home})
		}
		f.apply(next(), &command{Op: opBump, Name: "a", Epoch: 1, Renewed: 2})
		return f
	}
	f := build()
	r, changes := f.apply(100, &command{Op: opRehome, Name: "a"})
	if r.Err != nil || r.Moved != 5 || len(changes) != 5 {
		t.Fatalf("rehome: %+v, %d changes", r, len(changes))
	}
	homes := map[string]string{}
	for name, ex := range f.st.Exchanges {
		homes[name] = ex.Home
	}
	// b has y: c takes x1, then b and c tie at 1 (b first), ...
	want := map[string]string{"x1": "c", "x2": "b", "x3": "c", "x4": "b", "x5": "c", "y": "b"}
	if !reflect.DeepEqual(homes, want) {
		t.Fatalf("homes %v, want %v", homes, want)
	}
	g := build()
	g.apply(100, &command{Op: opRehome, Name: "a"})
	if !reflect.DeepEqual(f.st.Exchanges, g.st.Exchanges) {
		t.Fatal("two replicas re-homed differently")
	}
	// Every node expired: nothing moves.
	h := newFSM(nil, 1<<20)
	cfg := wire.ExchangeConfig{Pattern: wire.PatternPubSub}
	h.apply(1, &command{Op: opRenew, Name: "a"})
	h.apply(2, &command{Op: opDeclare, Name: "x", Config: &cfg, Home: "a"})
	h.apply(3, &command{Op: opBump, Name: "a", Epoch: 1, Renewed: 1})
	if r, _ := h.apply(4, &command{Op: opRehome, Name: "a"}); r.Moved != 0 || h.st.Exchanges["x"].Home != "a" {
		t.Fatalf("rehome with no live node: %+v", r)
	}
}

func TestBadCommandsAndSnapshots(t *testing.T) {
	f := newFSM(nil, 1<<10)
	for _, data := range [][]byte{[]byte("{"), []byte(`{"v":3,"op":"noop"}`), []byte(`{"v":0,"op":"noop"}`), []byte(`{"v":1,"op":"what"}`), bytes.Repeat([]byte(" "), maxCommandLen+1)} {
		res := f.Apply(&raft.Log{Index: 1, Data: data}).(*result)
		if !errors.Is(res.Err, ErrBadCommand) {
			t.Errorf("%.20q: %v, want ErrBadCommand", data, res.Err)
		}
	}
	// A snapshot round-trips; one over the bound is refused.
	cfg := wire.ExchangeConfig{Pattern: wire.PatternPubSub}
	f.Apply(&raft.Log{Index: 2, Data: []byte(`{"v":1,"op":"declare","name":"x","config":{"pattern":"pubsub"},"home":"n1"}`)})
	s, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	s.Persist(&sink{Buffer: &buf})
	g := newFSM(nil, 1<<10)
	if err := g.Restore(io.NopCloser(bytes.NewReader(buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if g.st.Index != 2 || g.st.Exchanges["x"].Config != cfg {
		t.Fatalf("restored %+v", g.st)
	}
	big := newFSM(nil, 16)
	if err := big.Restore(io.NopCloser(bytes.NewReader(buf.Bytes()))); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized snapshot: %v", err)
	}
	// The user commands check what auth checks.
	for _, c := range []command{
		{Op: opPutUser, Name: "u", PasswordHash: "not-a-hash"},
		{Op: opPutUser, Name: "u", PasswordHash: "", Tags: []string{"root"}},
		{Op: opSetPerms, Name: "u"},
		{Op: opPutUser, Name: "u"},
	} {
		if r, _ := f.apply(3, &c); r.Err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	hash, _ := auth.HashPassword("pw-pw-pw")
	// The last user stays, administrator or not.
	if r, _ := f.apply(3, &command{Op: opPutUser, Name: "solo", PasswordHash: hash}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r, _ := f.apply(4, &command{Op: opDeleteUser, Name: "solo"}); !errors.Is(r.Err, auth.ErrNoUsers) {
		t.Fatalf("delete the last user: %v, want ErrNoUsers", r.Err)
	}
	if r, _ := f.apply(3, &command{Op: opPutUser, Name: "u", PasswordHash: hash, Permissions: &auth.Permissions{Read: auth.Patterns{"a..b"}}}); !errors.Is(r.Err, auth.ErrBadPattern) {
		t.Errorf("bad pattern: %v", r.Err)
	}
}

type sink struct{ *bytes.Buffer }

func (s *sink) ID() string    { return "test" }
func (s *sink) Cancel() error { return nil }
func (s *sink) Close() error  { return nil }

func TestBoltStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raft.db")
	s, err := openBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if i, _ := s.LastIndex(); i != 0 {
		t.Fatal("empty store has entries")
	}
	at := time.Unix(1700000000, 123)
	logs := []*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogConfiguration, Data: []byte("conf")},
		{Index: 2, Term: 1, Type: raft.LogCommand, Data: []byte("cmd"), Extensions: []byte("ext"), AppendedAt: at},
		{Index: 3, Term: 2, Type: raft.LogNoop},
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	var got raft.Log
	if err := s.GetLog(2, &got); err != nil || got.Term != 1 || string(got.Data) != "cmd" || string(got.Extensions) != "ext" || !got.AppendedAt.Equal(at) {
		t.Fatalf("GetLog(2): %+v %v", got, err)
	}
	if err := s.GetLog(9, &got); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog(9): %v", err)
	}
	if err := s.DeleteRange(1, 2); err != nil {
		t.Fatal(err)
	}
	if first, _ := s.FirstIndex(); first != 3 {
		t.Fatalf("first %d after DeleteRange", first)
	}
	s.SetUint64([]byte("term"), 7)
	if v, _ := s.GetUint64([]byte("term")); v != 7 {
		t.Fatalf("term %d", v)
	}
	if v, err := s.GetUint64([]byte("none")); v != 0 || err != nil {
		t.Fatalf("missing number: %d %v", v, err)
	}
	if _, err := s.Get([]byte("none")); err == nil || err.Error() != "not found" {
		t.Fatalf("missing key: %v", err)
	}
	// A corrupted entry is an error, not a panic or a huge allocation.
	s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLogs).Put(key(3), append(encodeLog(logs[2])[:logHeader], 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0))
	})
	if err := s.GetLog(3, &got); !errors.Is(err, errCorruptLog) {
		t.Fatalf("corrupt entry: %v", err)
	}
	s.Close()
	// Reopened, the numbers are still there.
	s, err = openBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, _ := s.GetUint64([]byte("term")); v != 7 {
		t.Fatalf("term after reopening: %d", v)
	}
}
