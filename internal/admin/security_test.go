package admin_test

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// secureAPI is a node with users and its management listener.
type secureAPI struct {
	t   *testing.T
	n   *node.Node
	url string
	hc  *http.Client
}

func startSecureAPI(t *testing.T, edit func(*node.Config)) *secureAPI {
	t.Helper()
	cfg := node.Config{
		DataDir: t.TempDir(), Log: quiet, Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0",
		AdminUser: "admin", AdminPassword: "adminpw",
	}
	if edit != nil {
		edit(&cfg)
	}
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	// Every request with a password checks an argon2id hash, which
	// takes seconds under the race detector on a loaded machine: the
	// timeout only catches a server that never answers.
	return &secureAPI{t: t, n: n, url: n.HTTPURL(), hc: &http.Client{Timeout: 60 * time.Second}}
}

// call sends a request as user (none when ""), and returns the status,
// headers and body.
func (a *secureAPI) call(user, pass, method, path, body string, hdr ...string) (int, http.Header, string) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func (a *secureAPI) want(status int, user, pass, method, path, body string, hdr ...string) string {
	a.t.Helper()
	got, _, b := a.call(user, pass, method, path, body, hdr...)
	if got != status {
		a.t.Fatalf("%s %s as %q: HTTP %d %s, want %d", method, path, user, got, b, status)
	}
	return b
}

func TestAPINeedsCredentials(t *testing.T) {
	a := startSecureAPI(t, nil)
	for _, path := range []string{"/api/overview", "/api/exchanges", "/api/users", "/", "/debug/pprof/"} {
		status, h, body := a.call("", "", "GET", path, "")
		if status != http.StatusUnauthorized || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("GET %s without credentials: %d %q, WWW-Authenticate %q", path, status, body, h.Get("WWW-Authenticate"))
		}
		if status, _, _ := a.call("admin", "wrong", "GET", path, ""); status != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong password: %d", path, status)
		}
		a.want(http.StatusOK, "admin", "adminpw", "GET", path, "")
	}
	if b := a.want(http.StatusUnauthorized, "", "", "GET", "/api/overview", ""); !strings.Contains(b, `"error":"unauthorized"`) {
		t.Errorf("401 body %s", b)
	}
	// /metrics stays open for scrapers unless MetricsAuth.
	a.want(http.StatusOK, "", "", "GET", "/metrics", "")
	closed := startSecureAPI(t, func(c *node.Config) { c.MetricsAuth = true })
	closed.want(http.StatusUnauthorized, "", "", "GET", "/metrics", "")
	closed.want(http.StatusOK, "admin", "adminpw", "GET", "/metrics", "")
	// whoami
	var me struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	json.Unmarshal([]byte(a.want(http.StatusOK, "admin", "adminpw", "GET", "/api/whoami", "")), &me)
	if me.Name != "admin" || len(me.Tags) != 1 || me.Tags[0] != "administrator" {
		t.Errorf("whoami: %+v", me)
	}
}

func TestAPIWithoutUsersIsOpen(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Log: quiet, HTTP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	a := &secureAPI{t: t, n: n, url: n.HTTPURL(), hc: http.DefaultClient}
	a.want(http.StatusOK, "", "", "GET", "/api/overview", "")
	if b := a.want(http.StatusOK, "", "", "GET", "/api/whoami", ""); !strings.Contains(b, `"anonymous":true`) {
		t.Errorf("whoami without users: %s", b)
	}
	// The first user can be made through the open API; from then on it
	// needs credentials.
	a.want(http.StatusCreated, "", "", "PUT", "/api/users/root", `{"password":"rootpw","tags":"administrator"}`)
	a.want(http.StatusUnauthorized, "", "", "GET", "/api/overview", "")
	a.want(http.StatusOK, "root", "rootpw", "GET", "/api/overview", "")
}

func TestAPIUsersAndPermissions(t *testing.T) {
	a := startSecureAPI(t, nil)
	as := func(status int, method, path, body string, hdr ...string) string {
		t.Helper()
		return a.want(status, "admin", "adminpw", method, path, body, hdr...)
	}
	as(http.StatusCreated, "PUT", "/api/users/mon", `{"password":"monpw","tags":["monitoring"]}`, "If-None-Match", "*")
	if b := as(http.StatusConflict, "PUT", "/api/users/mon", `{"password":"x"}`, "If-None-Match", "*"); !strings.Contains(b, "user_exists") {
		t.Errorf("add twice: %s", b)
	}
	as(http.StatusNotFound, "PUT", "/api/users/ghost", `{"password":"x"}`, "If-Match", "*")
	as(http.StatusCreated, "PUT", "/api/users/bob", `{"password":"bobpw"}`)
	as(http.StatusBadRequest, "PUT", "/api/users/carol", `{}`)
	as(http.StatusBadRequest, "PUT", "/api/users/bad%20name", `{"password":"x"}`)
	as(http.StatusBadRequest, "PUT", "/api/users/dave", `{"password":"x","tags":["wizard"]}`)
	as(http.StatusBadRequest, "PUT", "/api/users/dave", `{"password":"x","nonsense":1}`)

	// Permissions: none at first, then granted, shown, and enforced on
	// the wire.
	var p struct {
		User                   string
		Configure, Write, Read []string
	}
	json.Unmarshal([]byte(as(http.StatusOK, "GET", "/api/permissions/bob", "")), &p)
	if p.User != "bob" || len(p.Configure)+len(p.Write)+len(p.Read) != 0 {
		t.Fatalf("a new user's permissions: %+v", p)
	}
	as(http.StatusNoContent, "PUT", "/api/permissions/bob", `{"configure":"","write":"orders.#","read":["orders.#"]}`)
	as(http.StatusBadRequest, "PUT", "/api/permissions/bob", `{"write":["a..b"]}`)
	as(http.StatusNotFound, "PUT", "/api/permissions/ghost", `{"write":"#"}`)
	json.Unmarshal([]byte(as(http.StatusOK, "GET", "/api/permissions/bob", "")), &p)
	if len(p.Write) != 1 || p.Write[0] != "orders.#" || len(p.Configure) != 0 {
		t.Fatalf("bob's permissions: %+v", p)
	}
	var list []struct{ User string }
	json.Unmarshal([]byte(as(http.StatusOK, "GET", "/api/permissions", "")), &list)
	if len(list) != 3 {
		t.Fatalf("permissions list: %+v", list)
	}
	ctx := testutil.Context(t, 10*time.Second)
	if _, err := a.n.Connect().PubSub(ctx, "orders.eu"); err != nil {
		t.Fatal(err)
	}
	bob, err := client.Dial(ctx, "courier://bob:bobpw@"+a.n.Addr().String(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	if _, err := bob.PubSub(ctx, "orders.eu"); err != nil {
		t.Fatalf("bob opens orders.eu: %v", err)
	}
	if _, err := bob.PubSub(ctx, "payments"); err == nil {
		t.Fatal("bob opened payments without permission")
	}

	// Tags: monitoring reads but changes nothing; bob has no API access.
	a.want(http.StatusOK, "mon", "monpw", "GET", "/api/overview", "")
	a.want(http.StatusOK, "mon", "monpw", "GET", "/api/exchanges", "")
	a.want(http.StatusForbidden, "mon", "monpw", "PUT", "/api/exchanges/x", `{"pattern":"pubsub"}`)
	a.want(http.StatusForbidden, "mon", "monpw", "GET", "/api/users", "")
	a.want(http.StatusForbidden, "mon", "monpw", "GET", "/debug/pprof/", "")
	a.want(http.StatusForbidden, "bob", "bobpw", "GET", "/api/overview", "")
	a.want(http.StatusOK, "bob", "bobpw", "GET", "/api/whoami", "")

	// Users list without hashes; passwd; delete; the last admin stays.
	users := as(http.StatusOK, "GET", "/api/users", "")
	if strings.Contains(users, "argon2") || !strings.Contains(users, `"name":"bob"`) {
		t.Fatalf("users list: %s", users)
	}
	as(http.StatusNoContent, "PUT", "/api/users/bob", `{"password":"newpw"}`, "If-Match", "*")
	a.want(http.StatusForbidden, "bob", "newpw", "GET", "/api/overview", "")
	a.want(http.StatusUnauthorized, "bob", "bobpw", "GET", "/api/whoami", "")
	as(http.StatusNoContent, "DELETE", "/api/permissions/bob", "")
	as(http.StatusNoContent, "DELETE", "/api/users/bob", "")
	as(http.StatusNotFound, "DELETE", "/api/users/bob", "")
	if b := as(http.StatusConflict, "DELETE", "/api/users/admin", ""); !strings.Contains(b, "last administrator") {
		t.Fatalf("delete the last admin: %s", b)
	}
}

func TestAPIOverHTTPS(t *testing.T) {
	ca := testutil.NewCA(t)
	sc := ca.Server()
	a := startSecureAPI(t, func(c *node.Config) { c.HTTPTLS = node.TLSFiles{CertFile: sc.CertFile, KeyFile: sc.KeyFile} })
	if !strings.HasPrefix(a.url, "https://") {
		t.Fatalf("HTTPURL %q", a.url)
	}
	a.hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}
	a.want(http.StatusOK, "admin", "adminpw", "GET", "/api/overview", "")
	a.want(http.StatusUnauthorized, "", "", "GET", "/api/overview", "")
	// Plain HTTP to the HTTPS port fails.
	resp, err := http.Get("http://" + a.n.HTTPAddr().String() + "/api/overview")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP on the HTTPS port: %d", resp.StatusCode)
		}
	}
}

// TestPerObjectMetricsNeedCredentials: once the node has users,
// /metrics/per-object, which names every exchange and queue, needs a user
// with the monitoring or administrator tag; the node-wide /metrics stays
// open for scrapers.
func TestPerObjectMetricsNeedCredentials(t *testing.T) {
	a := startSecureAPI(t, nil)
	if _, err := a.n.Connect().PubSub(testutil.Context(t, 10*time.Second), "payroll.secret"); err != nil {
		t.Fatal(err)
	}
	a.want(http.StatusCreated, "admin", "adminpw", "PUT", "/api/users/mon", `{"password":"monpw","tags":["monitoring"]}`)
	a.want(http.StatusCreated, "admin", "adminpw", "PUT", "/api/users/bob", `{"password":"bobpw"}`)
	status, h, body := a.call("", "", "GET", "/metrics/per-object", "")
	if status != http.StatusUnauthorized || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Basic ") || strings.Contains(body, "payroll") {
		t.Fatalf("per-object metrics without credentials: %d %q", status, body)
	}
	a.want(http.StatusUnauthorized, "mon", "wrong", "GET", "/metrics/per-object", "")
	a.want(http.StatusForbidden, "bob", "bobpw", "GET", "/metrics/per-object", "")
	for _, u := range [][2]string{{"admin", "adminpw"}, {"mon", "monpw"}} {
		if b := a.want(http.StatusOK, u[0], u[1], "GET", "/metrics/per-object", ""); !strings.Contains(b, "payroll.secret") {
			t.Errorf("per-object metrics as %s lack the exchange:\n%s", u[0], b)
		}
	}
	if b := a.want(http.StatusOK, "", "", "GET", "/metrics", ""); strings.Contains(b, "payroll") {
		t.Errorf("the open /metrics names an exchange")
	}
}

// TestSecurityHeaders: every response of the management listener (the
// dashboard, the API, the metrics, refusals) tells browsers not to run
// inline or outside content, not to sniff types and not to frame it.
func TestSecurityHeaders(t *testing.T) {
	want := map[string]string{
		"X-Frame-Options":        "DENY",
		"X-Content-Type-Options": "nosniff",
	}
	check := func(what string, h http.Header) {
		t.Helper()
		for k, v := range want {
			if h.Get(k) != v {
				t.Errorf("%s: %s %q, want %q", what, k, h.Get(k), v)
			}
		}
		csp := h.Get("Content-Security-Policy")
		for _, d := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, d) {
				t.Errorf("%s: Content-Security-Policy %q lacks %q", what, csp, d)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("%s: Content-Security-Policy %q allows inline code", what, csp)
		}
	}
	a := startSecureAPI(t, nil)
	for _, path := range []string{"/", "/app.js", "/style.css", "/api/overview", "/metrics", "/metrics/per-object", "/debug/pprof/", "/api/nope"} {
		_, h, _ := a.call("admin", "adminpw", "GET", path, "")
		check("GET "+path, h)
	}
	_, h, _ := a.call("", "", "GET", "/api/overview", "")
	check("a 401", h)
	_, h, _ = a.call("", "", "GET", "/metrics", "")
	check("open /metrics", h)

	n, err := node.Start(node.Config{DataDir: t.TempDir(), Log: quiet, HTTP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	open := &secureAPI{t: t, n: n, url: n.HTTPURL(), hc: http.DefaultClient}
	_, h, _ = open.call("", "", "GET", "/", "")
	check("the dashboard of a node without users", h)
}
