package main

import (
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
)

// secureServer runs `courier server` with a first administrator
// admin/adminpw (from the environment) and extra args, and returns the
// client and API addresses, the data dir and the process.
func secureServer(t *testing.T, extra ...string) (addr, api, dir string, srv *cliProc) {
	t.Helper()
	addr, httpAddr := "127.0.0.1:"+cliFreePort(t), "127.0.0.1:"+cliFreePort(t)
	dir = t.TempDir()
	args := append([]string{"server", "--listen", addr, "--http", httpAddr, "--data", dir}, extra...)
	srv = cliStart(t, "", []string{"COURIER_ADMIN_USER=admin", "COURIER_ADMIN_PASSWORD=adminpw"}, args...)
	cliAccepting(t, srv, httpAddr)
	srv.waitStderr(t, "courier server started")
	return addr, "http://" + httpAddr, dir, srv
}

func TestCLIUsers(t *testing.T) {
	addr, api, _, srv := secureServer(t)
	if !strings.Contains(srv.stderr.String(), "administrator created") {
		t.Errorf("server log lacks the first administrator:\n%s", srv.stderr.String())
	}
	as := func(args ...string) []string {
		return append(args, "--api", api, "--user", "admin", "--password", "adminpw")
	}

	cliFails(t, exitRefused, []string{"users", "list", "--api", api}, "credentials required", "--user")
	cliFails(t, exitRefused, []string{"users", "list", "--api", api, "--user", "admin", "--password", "nope"}, "bad user name or password")
	if out := cliOK(t, as("users", "list")...); !strings.Contains(out, "admin  administrator  #") {
		t.Errorf("users list:\n%s", out)
	}
	if r := cliRunIn(t, "bobpw\n", nil, as("users", "add", "bob")...); r.code != 0 || r.stdout != "user bob added\n" {
		t.Fatalf("users add: %+v", r)
	}
	if r := cliRunIn(t, "x\n", nil, as("users", "add", "bob")...); r.code != 1 || !strings.Contains(r.stderr, "user exists") {
		t.Fatalf("users add twice: %+v", r)
	}
	if r := cliRunIn(t, "", nil, as("users", "add", "carol")...); r.code != exitUsage || !strings.Contains(r.stderr, "no password") {
		t.Fatalf("users add without a password: %+v", r)
	}
	cliFails(t, exitUsage, as("users", "grant", "bob"), "give --configure, --write or --read")
	if out := cliOK(t, as("users", "grant", "bob", "--write", "orders.#", "--read", "orders.#")...); out != "bob may configure nothing, write orders.#, read orders.#\n" {
		t.Errorf("grant printed %q", out)
	}
	// Flags not given keep their patterns.
	if out := cliOK(t, as("users", "grant", "bob", "--configure", "orders.*")...); out != "bob may configure orders.*, write orders.#, read orders.#\n" {
		t.Errorf("second grant printed %q", out)
	}
	cliFails(t, exitFailure, as("users", "grant", "bob", "--write", "a..b"), "invalid permission pattern")

	// bob on the wire: what he may, and a clear error for what he may not.
	bob := "courier://bob:bobpw@" + addr
	cliOK(t, "exchanges", "create", "orders.eu", "--pattern", "pubsub", "--url", bob)
	cliOK(t, "pub", "orders.eu", "k", "hi", "--url", bob)
	cliFails(t, exitRefused, []string{"exchanges", "create", "payments", "--pattern", "pubsub", "--url", bob}, "unauthorized", "configure", "payments")
	cliFails(t, exitRefused, []string{"pub", "orders.eu", "k", "hi", "--url", "courier://bob:wrong@" + addr}, "unauthorized", "bad user name or password")
	cliFails(t, exitRefused, []string{"pub", "orders.eu", "k", "hi", "--url", "courier://" + addr}, "requires a user name and password")
	// Credentials from the environment.
	if r := cliRunIn(t, "", []string{"COURIER_USER=bob", "COURIER_PASSWORD=bobpw"}, "pub", "orders.eu", "k", "hi", "--url", "courier://"+addr); r.code != 0 {
		t.Fatalf("pub with COURIER_USER: %+v", r)
	}
	// bob has no tag: the API is closed to him.
	cliFails(t, exitRefused, []string{"overview", "--api", api, "--user", "bob", "--password", "bobpw"}, "administrator tag")

	cliRunIn(t, "newpw\n", nil, as("users", "passwd", "bob")...)
	cliFails(t, exitRefused, []string{"pub", "orders.eu", "k", "hi", "--url", bob}, "bad user name or password")
	cliOK(t, "pub", "orders.eu", "k", "hi", "--url", "courier://bob:newpw@"+addr)
	if out := cliOK(t, as("users", "grant", "bob", "--none")...); out != "bob has no permissions\n" {
		t.Errorf("grant --none printed %q", out)
	}
	cliFails(t, exitRefused, []string{"pub", "orders.eu", "k", "hi", "--url", "courier://bob:newpw@" + addr}, "unauthorized")
	cliOK(t, as("users", "delete", "bob")...)
	cliFails(t, exitFailure, as("users", "delete", "admin"), "last administrator")

	if r := cliRunIn(t, "pw\n", nil, "users", "hash-password"); r.code != 0 || auth.CheckHash(strings.TrimSpace(r.stdout)) != nil {
		t.Fatalf("hash-password: %+v", r)
	}
}

// TestCLIReloadOnSIGHUP: users written to the data dir count once the
// server gets SIGHUP, and connections open across the reload stay.
func TestCLIReloadOnSIGHUP(t *testing.T) {
	addr, _, dir, srv := secureServer(t)
	admin := "courier://admin:adminpw@" + addr
	cliOK(t, "exchanges", "create", "news", "--pattern", "pubsub", "--url", admin)
	sub := cliStart(t, "", nil, "sub", "news", "#", "--url", admin)
	sub.waitStderr(t, "subscribed to")

	// An operator adds a user by editing users.json (here through the
	// same code the server uses), then reloads.
	st, err := auth.Open(auth.Config{Dir: dir, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p := auth.Permissions{Write: auth.Patterns{"news"}}
	if _, err := st.PutUser("carol", auth.UserChange{Password: "carolpw", Permissions: &p}); err != nil {
		t.Fatal(err)
	}
	carol := "courier://carol:carolpw@" + addr
	cliFails(t, exitRefused, []string{"pub", "news", "k", "before", "--url", carol}, "bad user name or password")

	if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	srv.waitStderr(t, "reloaded on SIGHUP")
	cliOK(t, "pub", "news", "k", "after", "--url", carol)
	testutil.WaitForf(t, cliWait, func() bool { return strings.Contains(sub.stdout.String(), "after") },
		"the subscriber connected before the reload gets the message; stdout %q", sub.stdout.String())
	if sub.exited() {
		t.Fatalf("the subscriber's connection ended across the reload:\n%s", sub.stderr.String())
	}

	// A broken file: the reload fails, the server keeps what it had.
	if err := writeUsersFile(dir, "{broken"); err != nil {
		t.Fatal(err)
	}
	srv.cmd.Process.Signal(syscall.SIGHUP)
	srv.waitStderr(t, "reload on SIGHUP failed")
	cliOK(t, "pub", "news", "k", "still", "--url", carol)
	if srv.exited() {
		t.Fatal("the server exited after a failed reload")
	}
}

func TestCLITLS(t *testing.T) {
	ca := testutil.NewCA(t)
	sc := ca.Server()
	addr, api, _, _ := secureServer(t, "--tls-cert", sc.CertFile, "--tls-key", sc.KeyFile,
		"--http-tls-cert", sc.CertFile, "--http-tls-key", sc.KeyFile)
	api = strings.Replace(api, "http://", "https://", 1)
	tlsURL := "courier+tls://admin:adminpw@" + addr
	cliOK(t, "exchanges", "create", "secure", "--pattern", "pubsub", "--url", tlsURL, "--tls-ca", ca.File)
	cliOK(t, "pub", "secure", "k", "hi", "--url", tlsURL, "--tls-ca", ca.File)
	cliFails(t, exitConnect, []string{"pub", "secure", "k", "hi", "--url", tlsURL}, "certificate")
	cliFails(t, exitConnect, []string{"pub", "secure", "k", "hi", "--url", "courier://admin:adminpw@" + addr}, "courier+tls://")
	cliFails(t, exitUsage, []string{"pub", "secure", "k", "hi", "--url", tlsURL, "--tls-ca", sc.KeyFile}, "--tls-ca")
	if out := cliOK(t, "overview", "--api", api, "--tls-ca", ca.File, "--user", "admin", "--password", "adminpw"); !strings.Contains(out, "courier+tls") {
		t.Errorf("overview over HTTPS:\n%s", out)
	}
	resp, err := http.Get(strings.Replace(api, "https://", "http://", 1) + "/api/overview")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP served on the HTTPS listener")
		}
	}
}

func writeUsersFile(dir, content string) error {
	return os.WriteFile(filepath.Join(dir, auth.FileName), []byte(content), 0o600)
}

func TestCLIServerRefusesOpenListener(t *testing.T) {
	cliFails(t, exitFailure, []string{"server", "--listen", "0.0.0.0:" + cliFreePort(t), "--http", "off", "--data", t.TempDir()}, "no users", "COURIER_ADMIN_USER")
	r := cliRunIn(t, "", []string{"COURIER_ADMIN_USER=admin"}, "server", "--listen", "127.0.0.1:"+cliFreePort(t), "--http", "off", "--data", t.TempDir())
	if r.code != exitUsage || !strings.Contains(r.stderr, "COURIER_ADMIN_PASSWORD") {
		t.Fatalf("an administrator without a password: %+v", r)
	}
}

// TestCLITLSCertificateValidity: a server started with an expired
// certificate says so in its log, and so does a reload that brings one
// expiring soon; a reload whose files do not parse is refused with the
// reason in the log, and the certificate loaded before still serves.
func TestCLITLSCertificateValidity(t *testing.T) {
	ca := testutil.NewCA(t)
	now := time.Now()
	expired := ca.ServerValid(now.Add(-48*time.Hour), now.Add(-time.Hour))
	soon := ca.ServerValid(now.Add(-time.Hour), now.Add(5*24*time.Hour))
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	install := func(c testutil.Cert) {
		t.Helper()
		for _, f := range [][2]string{{c.CertFile, certFile}, {c.KeyFile, keyFile}} {
			b, err := os.ReadFile(f[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f[1], b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(expired)
	addr, _, _, srv := secureServer(t, "--tls-cert", certFile, "--tls-key", keyFile)
	srv.waitStderr(t, "TLS certificate has expired")
	if !strings.Contains(srv.stderr.String(), "expired_for=") {
		t.Errorf("the warning does not say since when:\n%s", srv.stderr.String())
	}
	url := "courier+tls://admin:adminpw@" + addr
	cliFails(t, exitConnect, []string{"pub", "news", "k", "hi", "--url", url, "--tls-ca", ca.File}, "expired")

	install(soon)
	srv.cmd.Process.Signal(syscall.SIGHUP)
	srv.waitStderr(t, "TLS certificate expires soon")
	srv.waitStderr(t, "reloaded on SIGHUP")
	cliOK(t, "exchanges", "create", "news", "--pattern", "pubsub", "--url", url, "--tls-ca", ca.File)

	if err := os.WriteFile(certFile, []byte("-----BEGIN CERTIFICATE-----\ngarbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.cmd.Process.Signal(syscall.SIGHUP)
	srv.waitStderr(t, "reload on SIGHUP failed")
	if log := srv.stderr.String(); !strings.Contains(log, certFile) {
		t.Errorf("the refused reload does not name the file:\n%s", log)
	}
	cliOK(t, "pub", "news", "k", "still", "--url", url, "--tls-ca", ca.File)
}
