package server_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// Dead letters and permissions (issue 12, finding 4): a task exchange's
// dead letters go to its dead_letter exchange on behalf of its declarer,
// who must be allowed to write there, when it declares and at each dead
// letter.

// startWithUsers starts a node with an administrator "admin" (password
// "adminpw", every permission), a client listener and, with http, the
// management listener.
func startWithUsers(t *testing.T, http bool) (*node.Node, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := node.Config{
		DataDir: dir, Listen: "127.0.0.1:0", AdminUser: "admin", AdminPassword: "adminpw",
		Log: slog.New(slog.DiscardHandler),
	}
	if http {
		cfg.HTTP = "127.0.0.1:0"
	}
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, dir
}

// setPermissions replaces a user's permissions in the users file, as an
// operator's tool would, and reloads the node, as SIGHUP does.
func setPermissions(t *testing.T, n *node.Node, dataDir, name string, p auth.Permissions) {
	t.Helper()
	st, err := auth.Open(auth.Config{Dir: dataDir, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SetPermissions(name, p); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
}

// newsSubscriber has the administrator declare pub-sub exchange b.news
// and subscribe to everything on it; it returns the admin connection,
// the exchange and what the subscriber receives.
func newsSubscriber(t *testing.T, n *node.Node) (*courier.PubSub, <-chan string) {
	t.Helper()
	ctx := testutil.Context(t, 10*time.Second)
	admin, err := dialURL(t, "courier://admin:adminpw@"+n.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	news, err := admin.PubSub(ctx, "b.news")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 64)
	if _, err := news.Subscribe(ctx, "#", func(m *courier.Delivery) { got <- string(m.Body) }); err != nil {
		t.Fatal(err)
	}
	return news, got
}

// expectOnly publishes a marker to news and checks that it is the next
// thing the subscriber receives: nothing else reached it before.
func expectOnly(t *testing.T, news *courier.PubSub, got <-chan string, marker string) {
	t.Helper()
	ctx := testutil.Context(t, 10*time.Second)
	if err := news.PublishSync(ctx, courier.Message{Key: "marker", Body: []byte(marker)}); err != nil {
		t.Fatal(err)
	}
	if m := testutil.Recv(t, got, 5*time.Second); m != marker {
		t.Fatalf("the subscriber on b.news received %q before the marker: a dead letter went into an exchange its declarer may not write to", m)
	}
}

// TestDeadLetterNeedsWriteAtDeclare is the scenario of the report: a user
// with configure, write and read on a.* only declares a task exchange
// whose dead letters go to b.news, bounded to one task with drop-head,
// and submits twice. The declaration is refused with code 17, and the
// administrator's subscriber on b.news receives nothing.
func TestDeadLetterNeedsWriteAtDeclare(t *testing.T) {
	n, dir := startWithUsers(t, false)
	news, got := newsSubscriber(t, n)
	addUser(t, n, dir, "mallory", "mallorypw", auth.Permissions{
		Configure: auth.Patterns{"a.*"}, Write: auth.Patterns{"a.*"}, Read: auth.Patterns{"a.*"},
	})
	ctx := testutil.Context(t, 10*time.Second)
	mallory, err := dialURL(t, "courier://mallory:mallorypw@"+n.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := mallory.Tasks(ctx, "a.t2", courier.DeadLetter("b.news"), courier.MaxLength(1), courier.DropHead())
	we := wantWireCode(t, err, wire.CodeUnauthorized)
	if we.Fatal || !strings.Contains(we.Msg, `"b.news"`) || !strings.Contains(we.Msg, "write") {
		t.Fatalf("declare with a forbidden dead_letter: %+v", we)
	}
	if tasks != nil {
		for i := range 2 {
			tasks.Submit(ctx, courier.Task{Body: []byte(fmt.Sprintf("stolen %d", i))})
		}
	}
	if n.Broker().Exchange("a.t2") != nil {
		t.Fatal("the refused exchange exists")
	}
	// The same user may still declare it without the dead letter, or
	// with one it may write to; the connection goes on.
	if _, err := mallory.Tasks(ctx, "a.dl"); err != nil {
		t.Fatal(err)
	}
	if _, err := mallory.Tasks(ctx, "a.t3", courier.DeadLetter("a.dl"), courier.MaxLength(1), courier.DropHead()); err != nil {
		t.Fatal(err)
	}
	expectOnly(t, news, got, "marker")
}

// TestDeadLetterRevokedPermission: a user declares task exchanges whose
// dead letters go to b.news while it may write there; once the permission
// is revoked (the users file changed and reloaded, as on SIGHUP), dead
// letters by drop-head, NACK without requeue, TTL expiry and max attempts
// are dropped and counted, and the subscriber on b.news receives none.
func TestDeadLetterRevokedPermission(t *testing.T) {
	n, dir := startWithUsers(t, false)
	news, got := newsSubscriber(t, n)
	allowed := auth.Permissions{
		Configure: auth.Patterns{"a.*"}, Write: auth.Patterns{"a.*", "b.news"}, Read: auth.Patterns{"a.*"},
	}
	addUser(t, n, dir, "mallory", "mallorypw", allowed)
	ctx := testutil.Context(t, 20*time.Second)
	mallory, err := dialURL(t, "courier://mallory:mallorypw@"+n.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	declare := func(name string, opts ...courier.ExchangeOption) *courier.Tasks {
		t.Helper()
		tasks, err := mallory.Tasks(ctx, name, append(opts, courier.DeadLetter("b.news"))...)
		if err != nil {
			t.Fatalf("declare %s while allowed to write to b.news: %v", name, err)
		}
		return tasks
	}
	drop := declare("a.drop", courier.MaxLength(1), courier.DropHead())
	nack := declare("a.nack")
	ttl := declare("a.ttl", courier.QueueTTL(time.Millisecond))
	attempts := declare("a.attempts", courier.MaxAttempts(1), courier.Backoff(time.Millisecond, time.Millisecond))

	submit := func(tasks *courier.Tasks, body string) {
		t.Helper()
		if _, err := tasks.Submit(ctx, courier.Task{Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	deadLettered := func(name string) uint64 {
		return n.Broker().Exchange(name).Info().Queue.DeadLettered
	}

	// While allowed, dead letters arrive: the setup does deliver them.
	submit(drop, "allowed 1")
	submit(drop, "allowed 2")
	if m := testutil.Recv(t, got, 5*time.Second); m != "allowed 1" {
		t.Fatalf("while allowed, the subscriber received %q, want the dropped head", m)
	}

	setPermissions(t, n, dir, "mallory", auth.Permissions{
		Configure: allowed.Configure, Write: auth.Patterns{"a.*"}, Read: allowed.Read,
	})

	// Drop-head: the head ("allowed 2") and then "revoked 1" are dropped.
	submit(drop, "revoked 1")
	submit(drop, "revoked 2")
	// NACK without requeue, and a failure past max attempts.
	submit(nack, "rejected")
	submit(attempts, "failing")
	if _, err := nack.Work(ctx, func(*courier.Job) error { return courier.Reject(fmt.Errorf("no")) }); err != nil {
		t.Fatal(err)
	}
	if _, err := attempts.Work(ctx, func(*courier.Job) error { return fmt.Errorf("fails") }); err != nil {
		t.Fatal(err)
	}
	// TTL expiry: nobody works on a.ttl.
	submit(ttl, "expired")

	want := map[string]uint64{"a.drop": 3, "a.nack": 1, "a.attempts": 1, "a.ttl": 1}
	for name, k := range want {
		testutil.WaitForf(t, 10*time.Second, func() bool { return deadLettered(name) == k },
			"%s dead-lettered %d tasks, want %d", name, deadLettered(name), k)
	}
	expectOnly(t, news, got, "marker")
	for name, k := range want {
		if name == "a.drop" {
			k-- // its first dead letter went through while allowed
		}
		if d := n.Broker().Exchange(name).Info().Queue.DeadLetterDropped; d != k {
			t.Errorf("%s: dead_letter_dropped %d, want %d", name, d, k)
		}
	}

	// Granted again, the dead letters flow again.
	setPermissions(t, n, dir, "mallory", allowed)
	submit(drop, "allowed again")
	if m := testutil.Recv(t, got, 5*time.Second); m != "revoked 2" {
		t.Fatalf("granted again, the subscriber received %q, want the dropped head", m)
	}
}

// TestDeadLetterNeedsWriteThroughAPI: the management API declares as the
// user of the request. An administrator who may not write to b.news
// cannot create a task exchange or a queue whose dead letters go there.
func TestDeadLetterNeedsWriteThroughAPI(t *testing.T) {
	n, dir := startWithUsers(t, true)
	if _, err := newsExchange(t, n); err != nil {
		t.Fatal(err)
	}
	st, err := auth.Open(auth.Config{Dir: dir, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p := auth.Permissions{Configure: auth.Patterns{"#"}, Write: auth.Patterns{"a.*"}, Read: auth.Patterns{"#"}}
	if _, err := st.PutUser("ops", auth.UserChange{Password: "opspw", Tags: []string{auth.TagAdministrator}, Permissions: &p}); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	base := "http://" + n.HTTPAddr().String()
	put := func(user, pass, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPut, base+path, strings.NewReader(body))
		req.SetBasicAuth(user, pass)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct{ path, body string }{
		{"/api/exchanges/a.t2", `{"pattern":"tasks","dead_letter":"b.news","max_length":1,"overflow":"drop-head"}`},
		{"/api/queues/a.q2", `{"durable":true,"arguments":{"x-dead-letter-exchange":"b.news"}}`},
	} {
		status, body := put("ops", "opspw", c.path, c.body)
		if status != http.StatusForbidden || !strings.Contains(body, "access_refused") || !strings.Contains(body, "b.news") {
			t.Errorf("PUT %s by a user who may not write to b.news: %d %s, want 403 access_refused", c.path, status, body)
		}
		// The administrator with every permission may.
		if status, body := put("admin", "adminpw", c.path, c.body); status != http.StatusCreated {
			t.Errorf("PUT %s by admin: %d %s, want 201", c.path, status, body)
		}
	}
}

// newsExchange declares b.news as the trusted embedded connection.
func newsExchange(t *testing.T, n *node.Node) (*courier.PubSub, error) {
	t.Helper()
	return n.Connect().PubSub(testutil.Context(t, 5*time.Second), "b.news")
}
