package meta

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

func reqresp(strategy string) wire.ExchangeConfig {
	return wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: strategy}
}

func TestDeclareOnFollowerReadsItsWrite(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 30*time.Second)
	f := c.follower()
	ex, created, err := f.Declare(ctx, "orders", reqresp(""), DeclareOptions{By: "alice"})
	if err != nil || !created {
		t.Fatalf("declare on follower %s: created %v, %v", f.NodeID(), created, err)
	}
	if ex.Home != f.NodeID() || ex.Config.Strategy != "broadcast" || ex.DeclaredBy != "alice" {
		t.Fatalf("declared %+v, want home %s, strategy broadcast, by alice", ex, f.NodeID())
	}
	// Read-your-writes on the node used: no waiting.
	if got, ok := f.Exchange("orders"); !ok || got != ex {
		t.Fatalf("follower's local state right after Declare: %+v %v", got, ok)
	}
	for _, m := range c.running() {
		testutil.WaitForf(t, 10*time.Second, func() bool { _, ok := m.Exchange("orders"); return ok }, "orders on %s", m.NodeID())
	}
	// Declaring again anywhere matches; the default strategy named
	// explicitly matches too; another strategy or pattern clashes.
	for _, m := range c.running() {
		got, created, err := m.Declare(ctx, "orders", reqresp("broadcast"), DeclareOptions{})
		if err != nil || created || got != ex {
			t.Fatalf("redeclare on %s: %+v created %v, %v", m.NodeID(), got, created, err)
		}
	}
	var we *wire.Error
	_, _, err = f.Declare(ctx, "orders", reqresp("round-robin"), DeclareOptions{})
	if !errors.As(err, &we) || we.Code != wire.CodeClash {
		t.Fatalf("clash on follower: %v, want a wire clash", err)
	}
	_, _, err = c.waitLeader(10*time.Second).Declare(ctx, "orders", wire.ExchangeConfig{Pattern: wire.PatternPubSub}, DeclareOptions{})
	if !errors.As(err, &we) || we.Code != wire.CodeClash {
		t.Fatalf("clash on leader: %v, want a wire clash", err)
	}
	if _, _, err := f.Declare(ctx, "nope", wire.ExchangeConfig{}, DeclareOptions{Passive: true}); !errors.As(err, &we) || we.Code != wire.CodeNotFound {
		t.Fatalf("passive declare of a missing exchange: %v", err)
	}
	// Linearizable read from another follower.
	for _, m := range c.running() {
		got, ok, err := m.Get(ctx, "orders")
		if err != nil || !ok || got != ex {
			t.Fatalf("Get on %s: %+v %v %v", m.NodeID(), got, ok, err)
		}
	}
	// A change too large to replicate fails at once, as bad options.
	huge := wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: "fun", RouteExpr: strings.Repeat("x", maxFrame)}
	start := time.Now()
	if _, _, err := f.Declare(ctx, "huge", huge, DeclareOptions{}); !errors.As(err, &we) || we.Code != wire.CodeBadOptions || !strings.Contains(we.Msg, "metadata change") || time.Since(start) > 5*time.Second {
		t.Fatalf("oversized declare: %v after %v", err, time.Since(start))
	}
	if err := f.Delete(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Exchange("orders"); ok {
		t.Fatal("deleted exchange still in the follower's state")
	}
	if err := f.Delete(ctx, "orders"); !errors.As(err, &we) || we.Code != wire.CodeNotFound {
		t.Fatalf("second delete: %v, want not found", err)
	}
}

func TestConflictingDeclaresResolveConsistently(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 30*time.Second)
	cfgs := []wire.ExchangeConfig{reqresp("round-robin"), {Pattern: wire.PatternPubSub}, reqresp("leader"), {Pattern: wire.PatternTasks}}
	for round := range 5 {
		name := "race" + string(rune('a'+round))
		type outcome struct {
			cfg     wire.ExchangeConfig
			ex      Exchange
			created bool
			err     error
		}
		var wg sync.WaitGroup
		out := make([]outcome, 0, 12)
		var mu sync.Mutex
		for i, m := range c.running() {
			for j := range 4 {
				cfg := cfgs[(i+j+round)%len(cfgs)]
				wg.Go(func() {
					ex, created, err := m.Declare(ctx, name, cfg, DeclareOptions{})
					mu.Lock()
					out = append(out, outcome{cfg, ex, created, err})
					mu.Unlock()
				})
			}
		}
		wg.Wait()
		var winner *outcome
		for i := range out {
			if out[i].created {
				if winner != nil {
					t.Fatalf("%s created twice: %+v and %+v", name, winner, out[i])
				}
				winner = &out[i]
			}
		}
		if winner == nil {
			t.Fatalf("%s: nobody created it: %+v", name, out)
		}
		for _, o := range out {
			same := o.cfg.Pattern == winner.cfg.Pattern && o.cfg.Strategy == winner.cfg.Strategy
			var we *wire.Error
			switch {
			case same && (o.err != nil || o.ex != winner.ex):
				t.Fatalf("%s: %+v matches the winner %+v but got %+v, %v", name, o.cfg, winner.cfg, o.ex, o.err)
			case !same && (!errors.As(o.err, &we) || we.Code != wire.CodeClash):
				t.Fatalf("%s: %+v against the winner %+v: %v, want a clash", name, o.cfg, winner.cfg, o.err)
			}
		}
		for _, m := range c.running() {
			got, ok, err := m.Get(ctx, name)
			if err != nil || !ok || got != winner.ex {
				t.Fatalf("%s on %s: %+v %v %v, want %+v", name, m.NodeID(), got, ok, err, winner.ex)
			}
		}
	}
}

func TestUsersAndPermissionsFromAnyNode(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 60*time.Second)
	f := c.follower()
	full := auth.FullAccess()
	created, err := f.PutUser(ctx, "admin", auth.UserChange{Password: "s3cret-pass", Tags: []string{auth.TagAdministrator}, Permissions: &full, MustNotExist: true})
	if err != nil || !created {
		t.Fatalf("put admin on follower: %v %v", created, err)
	}
	u, ok := f.User("admin")
	if !ok || u.PasswordHash == "" || len(u.Tags) != 1 {
		t.Fatalf("admin on follower: %+v %v", u, ok)
	}
	// The sentinels of auth cross the forwarding link.
	if _, err := f.PutUser(ctx, "admin", auth.UserChange{MustNotExist: true, PasswordHash: u.PasswordHash}); !errors.Is(err, auth.ErrUserExists) {
		t.Fatalf("second create: %v, want ErrUserExists", err)
	}
	if err := f.DeleteUser(ctx, "admin"); !errors.Is(err, auth.ErrLastAdmin) {
		t.Fatalf("delete the last admin: %v, want ErrLastAdmin", err)
	}
	if err := f.SetPermissions(ctx, "ghost", full); !errors.Is(err, auth.ErrNoUser) {
		t.Fatalf("permissions of a ghost: %v, want ErrNoUser", err)
	}
	if _, err := f.PutUser(ctx, "bad name", auth.UserChange{PasswordHash: u.PasswordHash}); !errors.Is(err, auth.ErrBadName) {
		t.Fatalf("bad name: %v", err)
	}
	other := c.running()[0]
	if other == f {
		other = c.running()[1]
	}
	if _, err := other.PutUser(ctx, "bob", auth.UserChange{PasswordHash: u.PasswordHash}); err != nil {
		t.Fatal(err)
	}
	p := auth.Permissions{Configure: auth.Patterns{}, Write: auth.Patterns{"orders.#"}, Read: auth.Patterns{"#"}}
	if err := other.SetPermissions(ctx, "bob", p); err != nil {
		t.Fatal(err)
	}
	got, ok, err := f.GetUser(ctx, "bob")
	if err != nil || !ok || !samePermissions(got.Permissions, p) {
		t.Fatalf("bob on follower: %+v %v %v", got, ok, err)
	}
	if err := f.ClearPermissions(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	got, _ = f.User("bob")
	if len(got.Permissions.Write)+len(got.Permissions.Read)+len(got.Permissions.Configure) != 0 {
		t.Fatalf("cleared permissions: %+v", got.Permissions)
	}
	if err := f.DeleteUser(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.User("bob"); ok {
		t.Fatal("bob still there")
	}
	// The last user, even without the administrator tag, stays: no user
	// would open every node.
	if _, err := f.PutUser(ctx, "admin", auth.UserChange{Tags: []string{}}); !errors.Is(err, auth.ErrLastAdmin) {
		t.Fatalf("untag the last admin: %v, want ErrLastAdmin", err)
	}
	if _, err := f.PutUser(ctx, "carol", auth.UserChange{PasswordHash: u.PasswordHash}); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteUser(ctx, "admin"); !errors.Is(err, auth.ErrLastAdmin) {
		t.Fatalf("delete the last admin with another user: %v", err)
	}
}

// TestNoQuorumRefusesWrites cuts one node off: its writes and
// linearizable reads fail with ErrNoQuorum within their deadline (3 s,
// tolerance 2 s for a loaded machine), and the majority goes on; with a
// longer deadline (20 s) they fail once the node has known no leader for
// NoLeaderTimeout (3 s; tolerance 3 s).
func TestNoQuorumRefusesWrites(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 60*time.Second)
	for _, victim := range []string{"follower", "leader"} {
		lead := c.waitLeader(10 * time.Second)
		m := c.follower()
		if victim == "leader" {
			m = lead
		}
		c.tn.cut(m.NodeID())
		for _, op := range []string{"declare-long", "declare", "get"} {
			deadline := 3 * time.Second
			if op == "declare-long" {
				deadline = 20 * time.Second
			}
			dctx, cancel := context.WithTimeout(ctx, deadline)
			start := time.Now()
			var err error
			if op != "get" {
				_, _, err = m.Declare(dctx, "minority-"+victim, reqresp(""), DeclareOptions{})
			} else {
				_, _, err = m.Get(dctx, "anything")
			}
			took := time.Since(start)
			cancel()
			if !errors.Is(err, ErrNoQuorum) {
				t.Fatalf("%s on a cut-off %s: %v, want ErrNoQuorum", op, victim, err)
			}
			if took > 6*time.Second {
				t.Fatalf("%s on a cut-off %s failed after %v, deadline %v", op, victim, took, deadline)
			}
			t.Logf("%s on the cut-off %s %s: %v after %v", op, victim, m.NodeID(), err, took.Round(time.Millisecond))
		}
		// The majority elects a leader (if it lost it) and writes.
		var lead2 *Meta
		testutil.WaitForf(t, 10*time.Second, func() bool {
			lead2 = c.leader()
			return lead2 != nil && lead2 != m
		}, "a leader in the majority")
		if _, _, err := lead2.Declare(ctx, "majority-"+victim, reqresp(""), DeclareOptions{}); err != nil {
			t.Fatalf("majority write: %v", err)
		}
		// Once healed, the node hears from the leader again when Raft's
		// backoff towards it ends (at most about 10 s; tolerance 20 s).
		c.tn.heal(m.NodeID())
		healed := time.Now()
		var err error
		testutil.WaitForf(t, 30*time.Second, func() bool {
			var ok bool
			_, ok, err = m.Get(ctx, "majority-"+victim)
			return err == nil && ok
		}, "healed %s reads the majority's write: %v", m.NodeID(), err)
		t.Logf("healed %s read the majority's write %v after the heal", m.NodeID(), time.Since(healed).Round(time.Millisecond))
	}
}
