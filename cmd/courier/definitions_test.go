package main

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestCLIDefinitions exports the definitions of a server with an exchange
// of every kind, a durable subscription and users, imports them into an
// empty server, and finds the same definitions there: the two exports
// are the same bytes, and a user of the first logs in to the second with
// its password. A second import changes nothing. Only an administrator
// may export or import; a file with one bad entry changes nothing.
func TestCLIDefinitions(t *testing.T) {
	ctx := testutil.Context(t, time.Minute)
	addrA, apiA, _, _ := secureServer(t)
	addrB, apiB, _, _ := secureServer(t)
	as := func(api string, args ...string) []string {
		return append(args, "--api", api, "--user", "admin", "--password", "adminpw")
	}
	conn, err := client.Dial(ctx, "courier://admin:adminpw@"+addrA, client.Options{Name: "defs"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	declaredKinds(ctx, t, conn)
	if r := cliRunIn(t, "bobpw\n", nil, as(apiA, "users", "add", "bob")...); r.code != 0 {
		t.Fatalf("users add: %+v", r)
	}
	cliOK(t, as(apiA, "users", "grant", "bob", "--write", "ps.#", "--read", "ps.#")...)
	if r := cliRunIn(t, "monpw\n", nil, as(apiA, "users", "add", "mon", "--tag", "monitoring")...); r.code != 0 {
		t.Fatalf("users add mon: %+v", r)
	}

	dir := t.TempDir()
	fileA, fileB := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	if out := cliOK(t, as(apiA, "definitions", "export", fileA)...); !strings.Contains(out, "16 exchanges, 3 queues, 1 durable subscriptions, 3 users") {
		t.Errorf("export printed %q", out)
	}
	a, err := os.ReadFile(fileA)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(a, []byte("bobpw")) || !bytes.Contains(a, []byte(`"password_hash": "$argon2id$`)) {
		t.Errorf("the export holds a password, or no hash:\n%s", a)
	}
	if r := cliRun(t, "definitions", "export", "-", "--api", apiA, "--user", "mon", "--password", "monpw"); r.code == 0 || !strings.Contains(r.stderr, "administrator") {
		t.Errorf("a monitoring user exported the definitions: %+v", r)
	}
	if r := cliRun(t, "definitions", "import", fileA, "--api", apiB, "--user", "mon", "--password", "monpw"); r.code == 0 {
		t.Errorf("a user of another server imported definitions: %+v", r)
	}

	if out := cliOK(t, as(apiB, "definitions", "import", fileA)...); out != "imported 16 exchanges (16 new), 1 durable subscriptions, 3 users (2 new), 3 permissions\n" {
		t.Errorf("import printed %q", out)
	}
	same := func(how string) {
		t.Helper()
		cliOK(t, as(apiB, "definitions", "export", fileB)...)
		b, err := os.ReadFile(fileB)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s: the second server's definitions differ from the first's:\n%s\nnot\n%s", how, b, a)
		}
	}
	same("after the import")
	if out := cliOK(t, as(apiB, "definitions", "import", fileA)...); !strings.Contains(out, "(0 new)") || strings.Contains(out, "(1") {
		t.Errorf("second import printed %q", out)
	}
	same("after a second import")
	cliOK(t, "pub", "ps.plain", "a.b", "hi", "--url", "courier://bob:bobpw@"+addrB)

	// A hostile or broken file changes nothing: every entry is checked
	// first, as a DECLARE would check it.
	for name, body := range map[string]string{
		"bad name":       `{"courier_definitions":1,"exchanges":[{"name":"new.one","pattern":"pubsub"},{"name":"a..b","pattern":"pubsub"}]}`,
		"bad expression": `{"courier_definitions":1,"exchanges":[{"name":"new.one","pattern":"pubsub"},{"name":"x","pattern":"reqresp","strategy":"fun","route_expr":"nope("}]}`,
		"clash":          `{"courier_definitions":1,"exchanges":[{"name":"new.one","pattern":"pubsub"},{"name":"rr.leader","pattern":"reqresp","strategy":"sticky"}]}`,
		"task option":    `{"courier_definitions":1,"exchanges":[{"name":"new.one","pattern":"pubsub"},{"name":"x","pattern":"pubsub","max_attempts":3}]}`,
		"bad hash":       `{"courier_definitions":1,"exchanges":[{"name":"new.one","pattern":"pubsub"}],"users":[{"name":"eve","password_hash":"plain","tags":[]}]}`,
		"password":       `{"courier_definitions":1,"users":[{"name":"eve","password":"x"}]}`,
		"bad pattern":    `{"courier_definitions":1,"exchanges":[{"name":"new.one","pattern":"pubsub"}],"subscriptions":[{"exchange":"new.one","name":"s","patterns":["a.#.#x"]}]}`,
		"no version":     `{"exchanges":[{"name":"new.one","pattern":"pubsub"}]}`,
	} {
		f := filepath.Join(dir, "bad.json")
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if r := cliRun(t, as(apiB, "definitions", "import", f)...); r.code == 0 {
			t.Errorf("%s: imported: %+v", name, r)
		} else {
			t.Logf("%s: %s", name, strings.TrimSpace(r.stderr))
		}
	}
	same("after the refused imports")

	// The server bounds what it reads.
	big := bytes.Repeat([]byte(" "), 16<<20+1)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, apiB+"/api/definitions", bytes.NewReader(big))
	req.SetBasicAuth("admin", "adminpw")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a 16 MiB + 1 body: HTTP %d, want 413", resp.StatusCode)
	}
}
