package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/node"
)

// testOptions make the demo quick; the checks do not depend on timing.
var testOptions = Options{Tick: 40 * time.Millisecond, Wait: 10 * time.Second}

func quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func startNode(t *testing.T, listen string) *node.Node {
	t.Helper()
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: listen, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// syncBuffer is a bytes.Buffer safe for the demo's goroutines.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestDemoEmbedded(t *testing.T) {
	n := startNode(t, "")
	demo(t, Embedded(n))
}

func TestDemoRemote(t *testing.T) {
	n := startNode(t, "127.0.0.1:0")
	demo(t, Remote(n.URL(), quiet()))
}

// TestRun runs the command's own code path both ways and checks the lines
// a reader of the README is told to expect.
func TestRun(t *testing.T) {
	n := startNode(t, "127.0.0.1:0")
	for _, url := range []string{"", n.URL()} {
		t.Run(fmt.Sprintf("url=%q", url), func(t *testing.T) {
			var out syncBuffer
			if err := run(testContext(t), url, &out); err != nil {
				t.Fatalf("run: %v\n%s", err, out.String())
			}
			for _, want := range []string{
				"gets served: users-1=3 users-2=3 users-3=3",
				"notifier: profile.updated.2 -> would e-mail Grace Hopper <grace.hopper@navy.example> (v2,",
				`a request to "users.scheduler" is answered by scheduler-a`,
				"scheduler-b: event member-down scheduler-a(",
				`a request to "users.scheduler" is answered by scheduler-b`,
				"the notifier got 4 updates",
			} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func demo(t *testing.T, dial Dialer) {
	t.Helper()
	var out syncBuffer
	rep, err := Demo(testContext(t), dial, &out, testOptions)
	defer func() {
		if t.Failed() {
			t.Logf("demo output:\n%s", out.String())
		}
	}()
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	o := testOptions
	o.defaults()

	t.Run("RoundRobin", func(t *testing.T) {
		if len(rep.Instances) != o.Instances {
			t.Fatalf("instances %v, want %d", rep.Instances, o.Instances)
		}
		// Sequential requests to a round-robin exchange take turns
		// exactly: every instance serves the same share.
		for _, name := range rep.Instances {
			if got, want := rep.Gets[name], o.Gets/o.Instances; got != want {
				t.Errorf("%s served %d gets, want %d (all: %v)", name, got, want, rep.Gets)
			}
		}
	})

	t.Run("Updates", func(t *testing.T) {
		want := []string{"profile.updated.1", "profile.updated.2", "profile.updated.2", "profile.updated.3"}
		if got := slices.Sorted(slices.Values(rep.Notified)); !slices.Equal(got, want) {
			t.Errorf("notifier got %v, want %v", got, want)
		}
		for name, c := range rep.Copies {
			if len(c) != len(seed) {
				t.Errorf("%s holds %d users, want %d: %v", name, len(c), len(seed), c)
			}
			for _, op := range seed {
				if c[op.ID].Name != op.Name {
					t.Errorf("%s's user %s is %+v, want name %q", name, op.ID, c[op.ID], op.Name)
				}
			}
			if u := c["2"]; u.Version != 2 || u.Email != "grace.hopper@navy.example" {
				t.Errorf("%s's user 2 is %+v, want v2 with the new e-mail", name, u)
			}
		}
		if len(rep.Copies) != o.Instances {
			t.Errorf("%d copies, want %d", len(rep.Copies), o.Instances)
		}
	})

	t.Run("Scheduler", func(t *testing.T) {
		a, b := rep.Schedulers[0], rep.Schedulers[1]
		if rep.LeaderBefore != a || rep.LeaderAfter != b {
			t.Errorf("leader requests answered by %q then %q, want %q then %q", rep.LeaderBefore, rep.LeaderAfter, a, b)
		}
		if len(rep.Runs[a]) < o.Runs || len(rep.Runs[b]) < o.Runs {
			t.Fatalf("runs: %s %d, %s %d; want at least %d each", a, len(rep.Runs[a]), b, len(rep.Runs[b]), o.Runs)
		}
		// Only the leader runs the job: the first while it lives, the
		// second only once the first's connection is closed.
		for _, r := range rep.Runs[a] {
			if r.At.After(rep.Closed) {
				t.Errorf("%s ran job #%d after its connection closed", a, r.N)
			}
		}
		for _, r := range rep.Runs[b] {
			if r.At.Before(rep.Closing) {
				t.Errorf("%s ran job #%d while %s still led", b, r.N, a)
			}
		}
		evs := rep.Events
		if len(evs) == 0 || evs[0].Kind != courier.EventLeader || evs[0].Leader != rep.FirstID || evs[0].IsLeader {
			t.Errorf("%s's first event is %+v, want leader %s, not itself", b, first(evs), rep.FirstID)
		}
		down := slices.IndexFunc(evs, func(e courier.Event) bool {
			return e.Kind == courier.EventMemberDown && e.Member != nil && e.Member.ID == rep.FirstID
		})
		lead := slices.IndexFunc(evs, func(e courier.Event) bool {
			return e.Kind == courier.EventLeader && e.Leader == rep.SecondID && e.IsLeader
		})
		if down < 0 || lead < 0 {
			t.Errorf("%s got events %+v; want member-down %s and leader %s", b, evs, rep.FirstID, rep.SecondID)
		}
	})
}

func first(evs []courier.Event) any {
	if len(evs) == 0 {
		return nil
	}
	return evs[0]
}

// TestDemoRefusesForeignHandler: a handler that is not the demo's on the
// users exchange (the quick start's `courier reply users pong`) stops the
// demo before it attaches, with an error that names it.
func TestDemoRefusesForeignHandler(t *testing.T) {
	n := startNode(t, "127.0.0.1:0")
	ctx := context.Background()
	other := n.Connect()
	defer other.Close()
	users, err := other.ReqResp(ctx, usersExchange)
	if err != nil {
		t.Fatal(err)
	}
	att, err := users.Handle(ctx, func(r *courier.Request) { r.Reply([]byte("pong")) })
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_, err = Demo(ctx, Remote(n.URL(), quiet()), &out, Options{})
	if err == nil || !strings.Contains(err.Error(), `exchange "users" is in use`) || !strings.Contains(err.Error(), att.ID()) {
		t.Fatalf("Demo with a foreign handler: %v, want an error naming %s", err, att.ID())
	}
	if out.Len() != 0 {
		t.Errorf("Demo printed before refusing:\n%s", out.String())
	}
}
