package node_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// startAt starts a node on dir, under name ("" for the default).
func startAt(t *testing.T, dir, name string) *node.Node {
	t.Helper()
	n, err := node.Start(node.Config{Name: name, DataDir: dir, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestGeneratedNameIsKept: a node started without a name chooses one
// (the host's and four hex digits), records it in its data directory
// and keeps it across restarts, counting its starts; two nodes started
// without names get different ones.
func TestGeneratedNameIsKept(t *testing.T) {
	dir := t.TempDir()
	n := startAt(t, dir, "")
	name := n.Name()
	if !broker.ValidNodeName(name) || name == "n1" || n.Boot() != 1 {
		t.Fatalf("first start: name %q, boot %d", name, n.Boot())
	}
	n.Close()
	for boot := uint64(2); boot <= 3; boot++ {
		n = startAt(t, dir, "")
		if n.Name() != name || n.Boot() != boot {
			t.Fatalf("start %d: name %q, boot %d; want %q, %d", boot, n.Name(), n.Boot(), name, boot)
		}
		n.Close()
	}
	fi, err := os.Stat(filepath.Join(dir, node.IdentityFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("identity file: %v, %v; want mode 0600", fi, err)
	}
	other := startAt(t, t.TempDir(), "")
	defer other.Close()
	if other.Name() == name {
		t.Fatalf("two nodes started without names are both %q", name)
	}
}

// TestDataDirOfAnotherNode: a data directory belongs to the node that
// first started on it: another explicit name is refused with an error
// that says how to proceed; the same name, or none, is accepted.
func TestDataDirOfAnotherNode(t *testing.T) {
	dir := t.TempDir()
	startAt(t, dir, "alpha").Close()
	// Refused before anything is written: no first administrator either.
	_, err := node.Start(node.Config{Name: "beta", DataDir: dir, Log: quiet(), AdminUser: "admin", AdminPassword: "secret-pw-1"})
	if _, serr := os.Stat(filepath.Join(dir, "users.json")); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("users file written by a refused start: %v", serr)
	}
	if !errors.Is(err, node.ErrDataDirOfAnotherNode) {
		t.Fatalf("start as beta on alpha's directory: %v, want ErrDataDirOfAnotherNode", err)
	}
	for _, want := range []string{`"alpha"`, "--node alpha", "data directory of its own", node.IdentityFile} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	for _, name := range []string{"alpha", ""} {
		n := startAt(t, dir, name)
		if n.Name() != "alpha" {
			t.Errorf("started as %q: name %q, want alpha", name, n.Name())
		}
		n.Close()
	}
}

// TestNodeNameChecked: names that could not be embedded in ids are
// refused before anything is written.
func TestNodeNameChecked(t *testing.T) {
	for _, name := range []string{"n.1", "n/1", "rabbit@host", "-n", strings.Repeat("x", 65)} {
		dir := t.TempDir()
		if _, err := node.Start(node.Config{Name: name, DataDir: dir, Log: quiet()}); err == nil || !strings.Contains(err.Error(), "invalid node name") {
			t.Errorf("name %q: %v, want an invalid node name error", name, err)
		}
		if _, err := os.Stat(filepath.Join(dir, node.IdentityFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("name %q: identity file written: %v", name, err)
		}
	}
}

// TestFailedStartRecordsNothing: a start that fails (a listener beyond
// loopback without users, refused before the data directory is claimed;
// a management address in use, found after) neither names the data
// directory nor counts a start, so that a start retried at once keeps
// its count, as `courier server` retries without the management API
// when its default address is taken.
func TestFailedStartRecordsNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, node.IdentityFile)
	for _, cfg := range []node.Config{
		{DataDir: dir, Log: quiet(), Listen: "0.0.0.0:0"},
		{DataDir: dir, Log: quiet(), Listen: "127.0.0.1:0", HTTP: busy.Addr().String()},
	} {
		if _, err := node.Start(cfg); err == nil {
			t.Fatalf("%+v started", cfg)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("identity file after a failed first start: %v", err)
		}
	}
	startAt(t, dir, "gamma").Close()
	if _, err := node.Start(node.Config{DataDir: dir, Log: quiet(), HTTP: busy.Addr().String()}); err == nil {
		t.Fatal("started on a management address in use")
	}
	if n := startAt(t, dir, ""); n.Name() != "gamma" || n.Boot() != 2 {
		t.Errorf("after a failed second start: name %q, boot %d; want gamma, 2", n.Name(), n.Boot())
	} else {
		n.Close()
	}
}

// TestBadIdentityFile: an identity file that is not one is refused,
// whatever its size, and left for the operator to repair.
func TestBadIdentityFile(t *testing.T) {
	for name, content := range map[string]string{
		"garbage":   "not json",
		"version":   `{"version":2,"name":"a","boot":1}`,
		"name":      `{"version":1,"name":"a.b","boot":1}`,
		"boot":      `{"version":1,"name":"a","boot":0}`,
		"unknown":   `{"version":1,"name":"a","boot":1,"x":1}`,
		"oversized": `{"version":1,"name":"a","boot":1}` + strings.Repeat(" ", 1<<20),
	} {
		dir := t.TempDir()
		path := filepath.Join(dir, node.IdentityFile)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := node.Start(node.Config{DataDir: dir, Log: quiet()})
		if !errors.Is(err, node.ErrBadIdentity) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want ErrBadIdentity naming %s", name, err, path)
		}
		if b, _ := os.ReadFile(path); string(b) != content {
			t.Errorf("%s: the file was changed", name)
		}
	}
}

// TestConnectionIDsAfterRestart: connection ids name the node, and after
// a restart they never repeat an id given out before it, embedded or
// over the network; member ids in leader events carry them.
func TestConnectionIDsAfterRestart(t *testing.T) {
	dir := t.TempDir()
	ctx := testutil.Context(t, 30*time.Second)
	seen := map[string]bool{}
	for boot := 1; boot <= 3; boot++ {
		n, err := node.Start(node.Config{Name: "n4", DataDir: dir, Log: quiet(), Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		prefix := "n4/c"
		if boot > 1 {
			prefix = fmt.Sprintf("n4/c%d-", boot)
		}
		var ids []string
		for range 3 {
			ids = append(ids, n.Connect().ID())
		}
		cl, err := client.Dial(ctx, n.URL(), client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, cl.ID())
		for _, id := range ids {
			if seen[id] || !strings.HasPrefix(id, prefix) {
				t.Errorf("boot %d: connection id %q (seen before: %v), want a new one with prefix %q", boot, id, seen[id], prefix)
			}
			seen[id] = true
		}
		// Member ids, in events too, are the connection's id and the
		// attachment's.
		rr, err := cl.ReqResp(ctx, "jobs", courier.Leader)
		if err != nil {
			t.Fatal(err)
		}
		events := make(chan courier.Event, 8)
		h, err := rr.Handle(ctx, func(*courier.Request) {}, courier.OnEvent(func(ev courier.Event) { events <- ev }))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(h.ID(), cl.ID()+".") {
			t.Errorf("member id %q, want the prefix %q", h.ID(), cl.ID()+".")
		}
		ev := testutil.Recv(t, events, 10*time.Second)
		if ev.Leader != h.ID() || broker.NodeOf(ev.Leader) != "n4" {
			t.Errorf("leader event names %q, want %q", ev.Leader, h.ID())
		}
		cl.Close()
		n.Close()
	}
}
