package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

var quiet = slog.New(slog.DiscardHandler)

func TestNoUsersLoopbackOnly(t *testing.T) {
	for _, cfg := range []Config{
		{Listen: "0.0.0.0:0"},
		{Listen: ":0"},
		{Listen: "127.0.0.1:0", HTTP: "0.0.0.0:0"},
	} {
		cfg.DataDir, cfg.Log = t.TempDir(), quiet
		n, err := Start(cfg)
		if err == nil {
			n.Close()
			t.Fatalf("started with listen %q http %q and no users", cfg.Listen, cfg.HTTP)
		}
		if !strings.Contains(err.Error(), "no users") || !strings.Contains(err.Error(), "COURIER_ADMIN_USER") {
			t.Errorf("refusal says %q; want the reason and the remedy", err)
		}
	}
	// With users, an address beyond loopback is accepted (checked without
	// listening on it), and the users can no longer all go.
	cfg := Config{DataDir: t.TempDir(), Log: quiet, Listen: "0.0.0.0:7400", AdminUser: "admin", AdminPassword: "pw"}
	users, err := openUsers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := users.DeleteUser("admin"); !errors.Is(err, auth.ErrNoUsers) && !errors.Is(err, auth.ErrLastAdmin) {
		t.Fatalf("deleting the only user of an exposed node: %v", err)
	}
	if _, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AdminUser: "admin"}); err == nil {
		t.Fatal("an administrator without a password was accepted")
	}
}

func startWithAdmin(t *testing.T) (*Node, string) {
	t.Helper()
	dir := t.TempDir()
	n, err := Start(Config{DataDir: dir, Log: quiet, Listen: "127.0.0.1:0", AdminUser: "admin", AdminPassword: "adminpw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, dir
}

func TestConnectAs(t *testing.T) {
	n, _ := startWithAdmin(t)
	ctx := testutil.Context(t, 10*time.Second)
	if _, err := n.ConnectAs("admin", "nope"); !isCode(err, wire.CodeUnauthorized) {
		t.Fatalf("ConnectAs with a wrong password: %v", err)
	}
	p := auth.Permissions{Read: auth.Patterns{"news.#"}}
	if _, err := n.users.PutUser("reader", auth.UserChange{Password: "pw", Permissions: &p}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Connect().PubSub(ctx, "news.eu"); err != nil {
		t.Fatal(err)
	}
	c, err := n.ConnectAs("reader", "pw")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	news, err := c.PubSub(ctx, "news.eu")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := news.Subscribe(ctx, "#", func(*courier.Delivery) {}); err != nil {
		t.Fatal(err)
	}
	if err := news.PublishSync(ctx, courier.Message{Key: "k"}); !isCode(err, wire.CodeUnauthorized) {
		t.Fatalf("publish without write: %v", err)
	}
	// Connect stays trusted, whatever users exist.
	tr, _ := n.Connect().PubSub(ctx, "news.eu")
	if err := tr.PublishSync(ctx, courier.Message{Key: "k"}); err != nil {
		t.Fatal(err)
	}
}

func isCode(err error, code wire.Code) bool {
	var we *wire.Error
	return errors.As(err, &we) && we.Code == code
}

// TestReloadKeepsConnections: a reload (SIGHUP) brings new permissions to
// connections already open, on their next operation, without dropping
// them; an attachment whose permission went is detached.
func TestReloadKeepsConnections(t *testing.T) {
	n, dir := startWithAdmin(t)
	ctx := testutil.Context(t, 10*time.Second)
	if _, err := n.Connect().PubSub(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	p := auth.Permissions{Read: auth.Patterns{"orders"}}
	if _, err := n.users.PutUser("bob", auth.UserChange{Password: "bobpw", Permissions: &p}); err != nil {
		t.Fatal(err)
	}
	bob, err := client.Dial(ctx, "courier://bob:bobpw@"+n.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	orders, err := bob.PubSub(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := orders.Subscribe(ctx, "#", func(*courier.Delivery) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := orders.PublishSync(ctx, courier.Message{Key: "k"}); !isCode(err, wire.CodeUnauthorized) {
		t.Fatalf("publish before the grant: %v", err)
	}

	// An operator's edit of users.json (here: a second store on the same
	// file) counts only after Reload.
	edit := func(p auth.Permissions) {
		t.Helper()
		st, err := auth.Open(auth.Config{Dir: dir, Log: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SetPermissions("bob", p); err != nil {
			t.Fatal(err)
		}
	}
	edit(auth.Permissions{Read: auth.Patterns{"orders"}, Write: auth.Patterns{"orders"}})
	if err := orders.PublishSync(ctx, courier.Message{Key: "k"}); !isCode(err, wire.CodeUnauthorized) {
		t.Fatalf("publish after the edit, before reload: %v", err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := orders.PublishSync(ctx, courier.Message{Key: "k"}); err != nil {
		t.Fatalf("publish after reload: %v", err)
	}

	// Revoke read: the subscription ends, the connection stays.
	edit(auth.Permissions{Write: auth.Patterns{"orders"}})
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.Done():
	case <-ctx.Done():
		t.Fatal("the subscription outlived the revoked read permission")
	}
	if err := sub.Err(); err == nil || !strings.Contains(err.Error(), "permission revoked") {
		t.Fatalf("subscription ended with %v", err)
	}
	if err := orders.PublishSync(ctx, courier.Message{Key: "k"}); err != nil {
		t.Fatalf("the connection did not survive the reload: %v", err)
	}
	if _, err := orders.Subscribe(ctx, "#", func(*courier.Delivery) {}); !isCode(err, wire.CodeUnauthorized) {
		t.Fatalf("subscribe after the revoke: %v", err)
	}

	// A broken file is refused; what was loaded stays.
	if err := writeFileForTest(dir, "not json"); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); !errors.Is(err, auth.ErrBadFile) {
		t.Fatalf("reload of a broken file: %v", err)
	}
	if err := orders.PublishSync(ctx, courier.Message{Key: "k"}); err != nil {
		t.Fatalf("publish after a failed reload: %v", err)
	}
}

func TestReloadTLS(t *testing.T) {
	ca := testutil.NewCA(t)
	first := ca.Server()
	n, err := Start(Config{
		DataDir: t.TempDir(), Log: quiet, Listen: "127.0.0.1:0",
		TLS: TLSFiles{CertFile: first.CertFile, KeyFile: first.KeyFile},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(first.CertFile, "garbage"); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err == nil {
		t.Fatal("a reload with a broken certificate succeeded")
	}
	// The certificate loaded before still serves.
	c, err := client.Dial(testutil.Context(t, 5*time.Second), n.URL(), client.Options{TLS: &tls.Config{RootCAs: ca.Pool}})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func writeFileForTest(dir, content string) error {
	return writeFile(filepath.Join(dir, auth.FileName), content)
}

func writeFile(path, content string) error {
	return os.WriteFile(path, []byte(content), 0o600)
}

// TestCertValidityWarnings: each state of a certificate's validity gets
// its own warning, and a valid one none.
func TestCertValidityWarnings(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		from, to time.Time
		want     string
	}{
		{now.Add(-time.Hour), now.Add(365 * 24 * time.Hour), ""},
		{now.Add(-48 * time.Hour), now.Add(-time.Hour), "has expired"},
		{now.Add(time.Hour), now.Add(48 * time.Hour), "not valid yet"},
		{now.Add(-time.Hour), now.Add(13 * 24 * time.Hour), "expires soon"},
	} {
		msg, _ := certValidity(&x509.Certificate{NotBefore: tc.from, NotAfter: tc.to}, now)
		if tc.want == "" && msg != "" || !strings.Contains(msg, tc.want) {
			t.Errorf("valid %v to %v: %q, want %q", tc.from, tc.to, msg, tc.want)
		}
	}
}
