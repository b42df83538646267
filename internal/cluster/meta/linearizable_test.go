package meta

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// The linearizability model: each exchange name is a register holding
// its pattern ("" when absent), each user name one holding "user" when
// it exists (a put creates or replaces it). Declare creates it (created), matches it
// (exists) or clashes; delete removes it (deleted) or finds nothing
// (notfound); get reads it. A write whose outcome is unknown (no quorum,
// node killed mid-call) may or may not have happened.

type linIn struct {
	Op      string // declare, delete, get
	Key     string
	Pattern string
}

type linOut struct {
	Result  string // created, exists, clash, deleted, notfound; a get's pattern
	Unknown bool
}

var linModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(linIn).Key
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() []any { return []any{""} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(string), input.(linIn), output.(linOut)
		switch in.Op {
		case "declare":
			switch {
			case out.Unknown && s == "":
				return []any{s, in.Pattern}
			case out.Unknown:
				return []any{s}
			case out.Result == "created" && s == "":
				return []any{in.Pattern}
			case out.Result == "exists" && s == in.Pattern:
				return []any{s}
			case out.Result == "clash" && s != "" && s != in.Pattern:
				return []any{s}
			}
		case "delete":
			switch {
			case out.Unknown && s != "":
				return []any{s, ""}
			case out.Unknown:
				return []any{s}
			case out.Result == "deleted" && s != "":
				return []any{""}
			case out.Result == "notfound" && s == "":
				return []any{s}
			}
		case "get", "user-get":
			if out.Result == s {
				return []any{s}
			}
		case "user-put":
			// Creates or replaces the user: present afterwards either way.
			if out.Unknown {
				return []any{s, "user"}
			}
			if (out.Result == "created") == (s == "") {
				return []any{"user"}
			}
		case "user-delete":
			switch {
			case out.Unknown && s != "":
				return []any{s, ""}
			case out.Unknown:
				return []any{s}
			case out.Result == "deleted" && s != "":
				return []any{""}
			case out.Result == "notfound" && s == "":
				return []any{s}
			}
		}
		return nil
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linIn), output.(linOut)
		res := out.Result
		if out.Unknown {
			res = "?"
		}
		switch in.Op {
		case "declare":
			return fmt.Sprintf("declare(%s, %s) → %s", in.Key, in.Pattern, res)
		case "delete", "user-put", "user-delete":
			return fmt.Sprintf("%s(%s) → %s", in.Op, in.Key, res)
		}
		return fmt.Sprintf("get(%s) → %q", in.Key, res)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("%q", state) },
}

// linHash is the password hash of the users the history puts: made once,
// argon2 is slow on purpose.
var linHash = func() string {
	h, err := auth.HashPassword("linearizable")
	if err != nil {
		panic(err)
	}
	return h
}()

// linRecorder records a history for porcupine, timed on the monotonic
// clock from its start.
type linRecorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	// unknown ops are given a return time after every other.
	unknown []int
}

func newLinRecorder() *linRecorder { return &linRecorder{start: time.Now()} }

func (r *linRecorder) now() int64 { return int64(time.Since(r.start)) }

// do runs one operation on m and records it: a get that failed is left
// out (it changed nothing), a write that failed otherwise than by a
// definite answer is recorded as unknown.
func (r *linRecorder) do(ctx context.Context, client int, m *Meta, in linIn) {
	call := r.now()
	var out linOut
	var we *wire.Error
	switch in.Op {
	case "declare":
		_, created, err := m.Declare(ctx, in.Key, wire.ExchangeConfig{Pattern: in.Pattern}, DeclareOptions{})
		switch {
		case err == nil && created:
			out.Result = "created"
		case err == nil:
			out.Result = "exists"
		case errors.As(err, &we) && we.Code == wire.CodeClash:
			out.Result = "clash"
		default:
			out.Unknown = true
		}
	case "delete":
		err := m.Delete(ctx, in.Key)
		switch {
		case err == nil:
			out.Result = "deleted"
		case errors.As(err, &we) && we.Code == wire.CodeNotFound:
			out.Result = "notfound"
		default:
			out.Unknown = true
		}
	case "get":
		ex, ok, err := m.Get(ctx, in.Key)
		if err != nil {
			return
		}
		if ok {
			out.Result = ex.Config.Pattern
		}
	case "user-put":
		created, err := m.PutUser(ctx, in.Key, auth.UserChange{PasswordHash: linHash})
		switch {
		case err == nil && created:
			out.Result = "created"
		case err == nil:
			out.Result = "replaced"
		default:
			out.Unknown = true
		}
	case "user-delete":
		err := m.DeleteUser(ctx, in.Key)
		switch {
		case err == nil:
			out.Result = "deleted"
		case errors.Is(err, auth.ErrNoUser):
			out.Result = "notfound"
		default:
			out.Unknown = true
		}
	case "user-get":
		_, ok, err := m.GetUser(ctx, in.Key)
		if err != nil {
			return
		}
		if ok {
			out.Result = "user"
		}
	}
	ret := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if out.Unknown {
		r.unknown = append(r.unknown, len(r.ops))
	}
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// check runs porcupine over the history; on a violation it writes the
// visualization next to the test's temporary files and says where.
func (r *linRecorder) check(t *testing.T) porcupine.CheckResult {
	r.mu.Lock()
	ops := append([]porcupine.Operation(nil), r.ops...)
	r.mu.Unlock()
	end := r.now() + 1
	for _, i := range r.unknown {
		ops[i].Return = end
	}
	model := linModel.ToModel()
	res, info := porcupine.CheckOperationsVerbose(model, ops, 60*time.Second)
	if res != porcupine.Ok {
		path := filepath.Join(t.TempDir(), "history.html")
		if os.Getenv("META_LIN_HTML") != "" {
			path = os.Getenv("META_LIN_HTML")
		}
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			t.Logf("history visualized in %s", path)
		}
	}
	return res
}

// TestLinearizableUnderFaults runs clients doing declare, delete and get
// of exchanges, and put, delete and get of users, on random nodes while the leader is cut off, then killed and
// restarted, and checks the history with porcupine.
func TestLinearizableUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("fault run")
	}
	c := newCluster(t, 3, nil)
	// A user no client deletes: the last user cannot be deleted, and the
	// model of each user name does not know the others.
	if _, err := c.waitLeader(10*time.Second).PutUser(testutil.Context(t, 10*time.Second), "keeper", auth.UserChange{PasswordHash: linHash}); err != nil {
		t.Fatal(err)
	}
	rec := newLinRecorder()
	keys := []string{"k1", "k2", "k3", "k4"}
	users := []string{"u1", "u2"}
	patterns := []string{wire.PatternReqResp, wire.PatternPubSub}
	ops := []string{"declare", "declare", "delete", "get", "get", "user-put", "user-delete", "user-get"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for client := range 6 {
		rng := rand.New(rand.NewPCG(uint64(client), 14))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				nodes := c.running()
				m := nodes[rng.IntN(len(nodes))]
				in := linIn{Op: ops[rng.IntN(len(ops))], Key: keys[rng.IntN(len(keys))], Pattern: patterns[rng.IntN(len(patterns))]}
				if in.Op != "declare" {
					in.Pattern = ""
				}
				if strings.HasPrefix(in.Op, "user-") {
					in.Key = users[rng.IntN(len(users))]
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				rec.do(ctx, client, m, in)
				cancel()
			}
		})
	}
	phase := func(what string, d time.Duration) {
		t.Logf("%v: %s", time.Since(rec.start).Round(time.Millisecond), what)
		time.Sleep(d) // the nemesis's schedule, not a wait for correctness
	}
	phase("steady", 1500*time.Millisecond)
	lead := c.waitLeader(10 * time.Second)
	c.tn.cut(lead.NodeID())
	phase("leader "+lead.NodeID()+" cut off", 3*time.Second)
	c.tn.heal(lead.NodeID())
	phase("healed", 2*time.Second)
	lead = c.waitLeader(10 * time.Second)
	c.kill(lead.NodeID())
	phase("leader "+lead.NodeID()+" killed", 2500*time.Millisecond)
	c.start(lead.NodeID(), 3)
	phase(lead.NodeID()+" restarted", 2500*time.Millisecond)
	close(stop)
	wg.Wait()

	rec.mu.Lock()
	n, unknown := len(rec.ops), len(rec.unknown)
	counts := map[string]int{}
	for _, op := range rec.ops {
		counts[op.Input.(linIn).Op]++
	}
	rec.mu.Unlock()
	t.Logf("history: %d operations (%v), %d writes of unknown outcome", n, counts, unknown)
	if counts["get"] < 50 || counts["declare"] < 50 || counts["user-get"] < 20 || counts["user-put"] < 20 {
		t.Fatalf("too few operations to judge: %v", counts)
	}
	if res := rec.check(t); res != porcupine.Ok {
		t.Fatalf("history not linearizable: %v", res)
	}
}

// TestLinearizableCatchesStaleReads shows that the checker above can
// fail: with reads served from the local state (no read index), a node
// cut off from the group returns a stale value after a write elsewhere
// completed, and porcupine reports it.
func TestLinearizableCatchesStaleReads(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 60*time.Second)
	f := c.follower()
	lead := c.leader()
	rec := newLinRecorder()
	rec.do(ctx, 0, f, linIn{Op: "get", Key: "k"}) // "" everywhere
	c.tn.cut(f.NodeID())
	rec.do(ctx, 1, lead, linIn{Op: "declare", Key: "k", Pattern: wire.PatternPubSub})
	for _, m := range []*Meta{f, lead} {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		m.staleReads = m == f
		rec.do(rctx, 2, m, linIn{Op: "get", Key: "k"})
		cancel()
	}
	c.tn.heal(f.NodeID())
	if len(rec.ops) != 4 || rec.ops[1].Output.(linOut).Result != "created" || rec.ops[2].Output.(linOut).Result != "" {
		t.Fatalf("unexpected history: %+v", rec.ops)
	}
	if res := rec.check(t); res != porcupine.Illegal {
		t.Fatalf("a stale read was not caught: %v", res)
	}
	// The same read with the read index fails rather than lie.
	f.staleReads = false
	c.tn.cut(f.NodeID())
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, _, err := f.Get(rctx, "k"); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("linearizable read on a cut-off node: %v, want ErrNoQuorum", err)
	}
}
