package server_test

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
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

// startSecure starts a node with an administrator "admin" (password
// "adminpw") and the given TLS, serving on a loopback port.
func startSecure(t *testing.T, files node.TLSFiles) *node.Node {
	t.Helper()
	n, err := node.Start(node.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", TLS: files,
		AdminUser: "admin", AdminPassword: "adminpw",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// addUser writes a user into the node's users file, as an operator's
// tool would, and reloads the node, as SIGHUP does.
func addUser(t *testing.T, n *node.Node, dataDir, name, password string, p auth.Permissions) {
	t.Helper()
	st, err := auth.Open(auth.Config{Dir: dataDir, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutUser(name, auth.UserChange{Password: password, Permissions: &p}); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
}

func wantWireCode(t *testing.T, err error, code wire.Code) *wire.Error {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != code {
		t.Fatalf("error %v, want code %d (%s)", err, code, code)
	}
	return we
}

func dialURL(t *testing.T, url string, opts client.Options) (*courier.Conn, error) {
	t.Helper()
	c, err := client.Dial(testutil.Context(t, 10*time.Second), url, opts)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

func TestAuthRefusesBadCredentials(t *testing.T) {
	n := startSecure(t, node.TLSFiles{})
	addr := n.Addr().String()

	_, err := dialURL(t, "courier://admin:wrong-secret@"+addr, client.Options{})
	we := wantWireCode(t, err, wire.CodeUnauthorized)
	if !we.Fatal || !strings.Contains(we.Msg, "bad user name or password") {
		t.Fatalf("wrong password: %+v", we)
	}
	if strings.Contains(err.Error(), "wrong-secret") {
		t.Fatalf("the error shows the password: %v", err)
	}
	_, err = dialURL(t, "courier://nobody:adminpw@"+addr, client.Options{})
	wantWireCode(t, err, wire.CodeUnauthorized)
	_, err = dialURL(t, "courier://"+addr, client.Options{})
	if we := wantWireCode(t, err, wire.CodeUnauthorized); !strings.Contains(we.Msg, "requires a user name and password") {
		t.Fatalf("no credentials: %q", we.Msg)
	}

	// On the wire: a fatal ERROR code 17, then the server closes.
	rc := dialRaw(t, n)
	hello, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, User: "admin", Password: "nope"})
	rc.send(&wire.Frame{Type: wire.TypeHello, Body: hello})
	f := rc.next()
	if f == nil || f.Type != wire.TypeError || f.Flags&wire.FlagFatal == 0 || wire.Code(f.Aux) != wire.CodeUnauthorized {
		t.Fatalf("bad credentials answered with %+v, want a fatal ERROR code 17", f)
	}
	if f := rc.next(); f != nil {
		t.Fatalf("after a refused HELLO the server sent %s; want the connection closed", f.Type)
	}

	// The right ones work, from the URL or the options.
	c, err := dialURL(t, "courier://admin:adminpw@"+addr, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PubSub(testutil.Context(t, 5*time.Second), "news"); err != nil {
		t.Fatal(err)
	}
	if _, err := dialURL(t, "courier://"+addr, client.Options{User: "admin", Password: "adminpw"}); err != nil {
		t.Fatal(err)
	}
}

// TestPermissionDeniedKeepsConnection: an operation without permission
// fails alone; the connection, its attachments and its allowed operations
// go on.
func TestPermissionDeniedKeepsConnection(t *testing.T) {
	n, dir := startWithUsers(t, false)
	ctx := testutil.Context(t, 10*time.Second)
	trusted := n.Connect()
	for _, name := range []string{"news", "secret"} {
		if _, err := trusted.PubSub(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := trusted.ReqResp(ctx, "svc", courier.RoundRobin); err != nil {
		t.Fatal(err)
	}
	addUser(t, n, dir, "bob", "bobpw", auth.Permissions{
		Write: auth.Patterns{"news"}, Read: auth.Patterns{"news", "svc"},
	})

	bob, err := dialURL(t, "courier://bob:bobpw@"+n.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	news, err := bob.PubSub(ctx, "news")
	if err != nil {
		t.Fatalf("open an exchange with read and write but not configure: %v", err)
	}
	got := make(chan string, 16)
	if _, err := news.Subscribe(ctx, "#", func(m *courier.Delivery) { got <- string(m.Body) }); err != nil {
		t.Fatal(err)
	}

	// Denied: open (declare) secret, publish to it, request svc, declare
	// a new exchange.
	_, err = bob.PubSub(ctx, "secret")
	if we := wantWireCode(t, err, wire.CodeUnauthorized); we.Fatal || !strings.Contains(we.Msg, `"secret"`) {
		t.Fatalf("declare secret: %+v", we)
	}
	secret, err := bob.PubSub(ctx, "secret", courier.Passive())
	wantWireCode(t, err, wire.CodeUnauthorized)
	_ = secret
	svc, err := bob.ReqResp(ctx, "svc")
	if err != nil {
		t.Fatalf("open svc with read: %v", err)
	}
	_, err = svc.Request(ctx, courier.Message{Body: []byte("q")})
	wantWireCode(t, err, wire.CodeUnauthorized)
	_, err = bob.PubSub(ctx, "brand-new")
	wantWireCode(t, err, wire.CodeUnauthorized)

	// A handler on svc is allowed, and so is publishing to news: the
	// subscription made before the denials still receives.
	if _, err := svc.Handle(ctx, func(r *courier.Request) { r.Reply([]byte("a")) }); err != nil {
		t.Fatal(err)
	}
	if err := news.PublishSync(ctx, courier.Message{Key: "k", Body: []byte("still here")}); err != nil {
		t.Fatal(err)
	}
	if m := testutil.Recv(t, got, 5*time.Second); m != "still here" {
		t.Fatalf("got %q", m)
	}
	if err := bob.Err(); err != nil {
		t.Fatalf("the connection closed after denials: %v", err)
	}

	// The trusted embedded conn publishing to secret is untouched.
	sec, _ := trusted.PubSub(ctx, "secret")
	if err := sec.PublishSync(ctx, courier.Message{Key: "k", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
}

func TestTLS(t *testing.T) {
	ca := testutil.NewCA(t)
	sc := ca.Server()
	n := startSecure(t, node.TLSFiles{CertFile: sc.CertFile, KeyFile: sc.KeyFile})
	addr := n.Addr().String()
	if !strings.HasPrefix(n.URL(), "courier+tls://") {
		t.Fatalf("URL %q of a TLS node", n.URL())
	}
	roots := &tls.Config{RootCAs: ca.Pool}

	for _, scheme := range []string{"courier+tls", "tls"} {
		c, err := dialURL(t, scheme+"://admin:adminpw@"+addr, client.Options{TLS: roots})
		if err != nil {
			t.Fatalf("%s: %v", scheme, err)
		}
		if _, err := c.PubSub(testutil.Context(t, 5*time.Second), "over-tls"); err != nil {
			t.Fatal(err)
		}
	}
	// Options.TLS turns TLS on with a courier:// URL.
	if _, err := dialURL(t, "courier://admin:adminpw@"+addr, client.Options{TLS: roots}); err != nil {
		t.Fatal(err)
	}

	// Plain TCP to the TLS port: a clear error, from the server itself.
	_, err := dialURL(t, "courier://admin:adminpw@"+addr, client.Options{})
	if we := wantWireCode(t, err, wire.CodeProtocol); !strings.Contains(we.Msg, "courier+tls://") {
		t.Fatalf("plain client on the TLS port: %q", we.Msg)
	}
	// A CA the client does not trust.
	if _, err := dialURL(t, "courier+tls://admin:adminpw@"+addr, client.Options{}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("untrusted server certificate: %v", err)
	}
	// TLS to a plain port.
	plain := startNode(t, time.Second)
	_, err = dialURL(t, "courier+tls://"+plain.Addr().String(), client.Options{TLS: roots})
	if err == nil || !strings.Contains(err.Error(), "did not answer in TLS") {
		t.Fatalf("TLS client on a plain port: %v", err)
	}
	// The plain server cut only that connection.
	if _, err := dialURL(t, plain.URL(), client.Options{}); err != nil {
		t.Fatal(err)
	}
}

func TestTLSClientCertificates(t *testing.T) {
	ca := testutil.NewCA(t)
	sc := ca.Server()
	n := startSecure(t, node.TLSFiles{CertFile: sc.CertFile, KeyFile: sc.KeyFile, ClientCAFile: ca.File})
	url := "courier+tls://admin:adminpw@" + n.Addr().String()

	if _, err := dialURL(t, url, client.Options{TLS: &tls.Config{RootCAs: ca.Pool}}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("no client certificate: %v", err)
	}
	other := testutil.NewCA(t).Client("mallory")
	if _, err := dialURL(t, url, client.Options{TLS: &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{other.TLS}}}); err == nil {
		t.Fatal("a client certificate from another CA was accepted")
	}
	good := ca.Client("alice")
	c, err := dialURL(t, url, client.Options{TLS: &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{good.TLS}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PubSub(testutil.Context(t, 5*time.Second), "certified"); err != nil {
		t.Fatal(err)
	}
	// A client certificate does not replace the password.
	_, err = dialURL(t, "courier+tls://"+n.Addr().String(), client.Options{TLS: &tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{good.TLS}}})
	wantWireCode(t, err, wire.CodeUnauthorized)
}
