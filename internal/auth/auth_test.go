package auth

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestHashPassword(t *testing.T) {
	h, err := HashPassword("s3cret")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h, "$argon2id$v=19$m=19456,t=2,p=1$") {
		t.Fatalf("hash %q: not argon2id PHC with the default parameters", h)
	}
	ph, err := parseHash(h)
	if err != nil {
		t.Fatal(err)
	}
	if !ph.verify("s3cret") || ph.verify("s3cret ") || ph.verify("") {
		t.Fatal("verify accepts a wrong password or refuses the right one")
	}
	h2, _ := HashPassword("s3cret")
	if h2 == h {
		t.Fatal("two hashes of one password are equal: no salt")
	}
	if _, err := HashPassword(""); !errors.Is(err, ErrBadPassword) {
		t.Fatalf("empty password: %v, want ErrBadPassword", err)
	}
}

func TestParseHashBounds(t *testing.T) {
	for _, bad := range []string{
		"", "plain", "$argon2i$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",
		"$argon2id$v=18$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",
		"$argon2id$v=19$m=9999999,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",
		"$argon2id$v=19$m=19456,t=99,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",
		"$argon2id$v=19$m=19456,t=2,p=1$!!$aGFzaGhhc2hoYXNoaGFzaA",
		"$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$",
	} {
		if err := CheckHash(bad); !errors.Is(err, ErrBadHash) {
			t.Errorf("CheckHash(%q) = %v, want ErrBadHash", bad, err)
		}
	}
}

func TestPatterns(t *testing.T) {
	cases := []struct {
		pattern, name string
		want          bool
	}{
		{"#", "orders", true},
		{"#", "a.b.c", true},
		{"orders", "orders", true},
		{"orders", "orders.eu", false},
		{"orders.*", "orders.eu", true},
		{"orders.*", "orders", false},
		{"orders.*", "orders.eu.fr", false},
		{"orders.#", "orders", true},
		{"orders.#", "orders.eu.fr", true},
		{"orders.#", "ordersx", false},
		{"*.eu", "prices.eu", true},
		{"*.eu", "eu", false},
		{"#.eu", "eu", true},
		{"#.eu", "a.b.eu", true},
		{"#.eu", "a.b.eu.x", false},
		{"a.#.z", "a.z", true},
		{"a.#.z", "a.b.c.z", true},
		{"a.#.z", "a.b.c", false},
	}
	for _, c := range cases {
		cp := compile(Permissions{Read: Patterns{c.pattern}})
		if got := cp.perms(c.name)&Read != 0; got != c.want {
			t.Errorf("%q on %q = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
	for _, bad := range []string{"", "a..b", "a*", "#x", strings.Repeat("a.", 40) + "a", "#.#.#.#.#"} {
		if err := (Permissions{Write: Patterns{bad}}).Check(); !errors.Is(err, ErrBadPattern) {
			t.Errorf("pattern %q: %v, want ErrBadPattern", bad, err)
		}
	}
}

func TestPatternsJSON(t *testing.T) {
	var p Permissions
	if err := json.Unmarshal([]byte(`{"configure":"","write":"orders.#","read":["a","b.*"]}`), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Configure) != 0 || len(p.Write) != 1 || p.Write[0] != "orders.#" || len(p.Read) != 2 {
		t.Fatalf("decoded %+v", p)
	}
	if err := json.Unmarshal([]byte(`{"read":5}`), &p); err == nil {
		t.Fatal("a number decoded as patterns")
	}
}

func TestPermString(t *testing.T) {
	if s := (Configure | Read).String(); s != "configure+read" {
		t.Fatalf("String = %q", s)
	}
	if s := Perm(0).String(); s != "none" {
		t.Fatalf("String = %q", s)
	}
}

func openStore(t *testing.T, dir string, require bool) *Store {
	t.Helper()
	s, err := Open(Config{Dir: dir, RequireUsers: require})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStoreOpenWithoutUsers(t *testing.T) {
	s := openStore(t, t.TempDir(), false)
	if s.HasUsers() {
		t.Fatal("a new store has users")
	}
	if p := s.Perms("", "anything"); p != All {
		t.Fatalf("open store grants %v, want all", p)
	}
	if u, err := s.Authenticate("", ""); err != nil || u != "" {
		t.Fatalf("anonymous login on an open store: %q, %v", u, err)
	}
	if u, err := s.Authenticate("bob", "x"); err != nil || u != "" {
		t.Fatalf("login on an open store: %q, %v; want anonymous", u, err)
	}
	if _, err := Open(Config{Dir: t.TempDir(), RequireUsers: true}); !errors.Is(err, ErrNoUsers) {
		t.Fatalf("open with RequireUsers and no users: %v, want ErrNoUsers", err)
	}
}

func TestStoreUsers(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, false)
	changes := 0
	s.OnChange(func() { changes++ })
	v0 := s.Version()
	if ok, err := s.Bootstrap("admin", "adminpw"); !ok || err != nil {
		t.Fatalf("Bootstrap = %v, %v", ok, err)
	}
	if ok, err := s.Bootstrap("other", "pw"); ok || err != nil {
		t.Fatalf("second Bootstrap = %v, %v; want no-op", ok, err)
	}
	if s.Version() == v0 || changes != 1 {
		t.Fatalf("version %d → %d, %d changes: a change must move the version", v0, s.Version(), changes)
	}
	if u, err := s.Authenticate("admin", "adminpw"); err != nil || u != "admin" {
		t.Fatalf("admin login: %q, %v", u, err)
	}
	// Second time through the verified cache.
	if u, err := s.Authenticate("admin", "adminpw"); err != nil || u != "admin" {
		t.Fatalf("admin login again: %q, %v", u, err)
	}
	for _, c := range []struct{ user, pw string }{{"admin", "wrong"}, {"nobody", "adminpw"}, {"admin", ""}} {
		if _, err := s.Authenticate(c.user, c.pw); !errors.Is(err, ErrBadCredentials) {
			t.Errorf("login %q/%q: %v, want ErrBadCredentials", c.user, c.pw, err)
		}
	}
	if _, err := s.Authenticate("", ""); !errors.Is(err, ErrNoCredentials) {
		t.Errorf("login without a name: %v, want ErrNoCredentials", err)
	}
	if s.Perms("admin", "x.y") != All || !s.HasTag("admin", TagAdministrator) {
		t.Fatal("bootstrap admin lacks permissions or tag")
	}

	// A new user has no permissions until granted.
	if created, err := s.PutUser("bob", UserChange{Password: "bobpw", MustNotExist: true}); !created || err != nil {
		t.Fatalf("add bob: %v, %v", created, err)
	}
	if _, err := s.PutUser("bob", UserChange{Password: "x", MustNotExist: true}); !errors.Is(err, ErrUserExists) {
		t.Fatalf("add bob twice: %v", err)
	}
	if _, err := s.PutUser("carol", UserChange{Password: "x", MustExist: true}); !errors.Is(err, ErrNoUser) {
		t.Fatalf("update a missing user: %v", err)
	}
	if s.Perms("bob", "orders") != 0 || s.Perms("nobody", "orders") != 0 {
		t.Fatal("a user without grants has permissions")
	}
	if err := s.SetPermissions("bob", Permissions{Write: Patterns{"orders.#"}, Read: Patterns{"replies.*"}}); err != nil {
		t.Fatal(err)
	}
	if p := s.Perms("bob", "orders.eu"); p != Write {
		t.Fatalf("bob on orders.eu: %v, want write", p)
	}
	if p := s.Perms("bob", "replies.bob"); p != Read {
		t.Fatalf("bob on replies.bob: %v, want read", p)
	}
	if err := s.SetPermissions("bob", Permissions{Write: Patterns{"a..b"}}); !errors.Is(err, ErrBadPattern) {
		t.Fatalf("bad pattern: %v", err)
	}
	if _, err := s.PutUser("bob", UserChange{Tags: []string{"wizard"}}); !errors.Is(err, ErrBadTag) {
		t.Fatalf("bad tag: %v", err)
	}
	if _, err := s.PutUser("bad name", UserChange{Password: "x"}); !errors.Is(err, ErrBadName) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := s.PutUser("bob", UserChange{Password: "newpw", MustExist: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate("bob", "bobpw"); !errors.Is(err, ErrBadCredentials) {
		t.Fatalf("old password after passwd: %v", err)
	}
	if _, err := s.Authenticate("bob", "newpw"); err != nil {
		t.Fatalf("new password: %v", err)
	}

	// The last administrator stays.
	if err := s.DeleteUser("admin"); !errors.Is(err, ErrLastAdmin) {
		t.Fatalf("delete the last admin: %v", err)
	}
	if _, err := s.PutUser("admin", UserChange{Tags: []string{}}); !errors.Is(err, ErrLastAdmin) {
		t.Fatalf("untag the last admin: %v", err)
	}
	if err := s.DeleteUser("bob"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteUser("bob"); !errors.Is(err, ErrNoUser) {
		t.Fatalf("delete twice: %v", err)
	}

	// Everything is in the file, readable by its owner only.
	fi, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("users file mode %v, want 0600", fi.Mode().Perm())
	}
	s2 := openStore(t, dir, true)
	if u, err := s2.Authenticate("admin", "adminpw"); err != nil || u != "admin" {
		t.Fatalf("admin login after reopen: %q, %v", u, err)
	}
	if len(s2.Users()) != 1 {
		t.Fatalf("users after reopen: %+v", s2.Users())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("data dir holds %d files, want only %s (temporary files left?)", len(entries), FileName)
	}
}

func TestStoreRequireUsers(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, false)
	if _, err := s.PutUser("solo", UserChange{Password: "pw"}); err != nil {
		t.Fatal(err)
	}
	r := openStore(t, dir, true)
	if err := r.DeleteUser("solo"); !errors.Is(err, ErrNoUsers) {
		t.Fatalf("delete the only user where users are required: %v", err)
	}
	// Without the requirement, deleting the only user opens the store.
	if err := s.DeleteUser("solo"); err != nil {
		t.Fatal(err)
	}
	if s.HasUsers() || s.Perms("", "x") != All {
		t.Fatal("a store whose last user went is not open")
	}
	// A reload to an empty file keeps the users where they are required.
	if err := r.Reload(); !errors.Is(err, ErrNoUsers) {
		t.Fatalf("reload to no users: %v, want ErrNoUsers", err)
	}
	if !r.HasUsers() {
		t.Fatal("a failed reload dropped the users")
	}
}

func TestStoreReload(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir, false)
	if _, err := s.Bootstrap("admin", "pw"); err != nil {
		t.Fatal(err)
	}
	// Another writer (an operator's editor, a second store) changes the
	// file; the store sees it on Reload only.
	other := openStore(t, dir, false)
	if _, err := other.PutUser("eve", UserChange{Password: "evepw", Permissions: &Permissions{Read: Patterns{"news.#"}}}); err != nil {
		t.Fatal(err)
	}
	if s.Perms("eve", "news.today") != 0 {
		t.Fatal("the store saw a change before reloading")
	}
	v := s.Version()
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if s.Version() == v || s.Perms("eve", "news.today") != Read {
		t.Fatal("reload did not bring the new user")
	}
	// A broken file is refused and the users stay.
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte(`{"version":1,"users":[{"name":"x","password_hash":"nope"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); !errors.Is(err, ErrBadFile) || !errors.Is(err, ErrBadHash) {
		t.Fatalf("reload of a bad file: %v", err)
	}
	if s.Perms("eve", "news.today") != Read {
		t.Fatal("a failed reload changed the users")
	}
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte(`{"version":1,"users":[],"extra":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); !errors.Is(err, ErrBadFile) {
		t.Fatalf("reload of a file with an unknown field: %v", err)
	}
}

func TestAuthenticateConcurrent(t *testing.T) {
	s := openStore(t, t.TempDir(), false)
	if _, err := s.Bootstrap("admin", "pw"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := range 6 {
		wg.Go(func() {
			pw := "pw"
			if i%2 == 1 {
				pw = "bad"
			}
			_, err := s.Authenticate("admin", pw)
			if (err == nil) != (i%2 == 0) {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent login: %v", err)
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7400": true, "127.3.2.1:1": true, "[::1]:7400": true, "localhost:7400": true,
		":7400": false, "0.0.0.0:7400": false, "10.0.0.1:7400": false, "example.com:7400": false,
	} {
		got, err := Loopback(addr)
		if err != nil || got != want {
			t.Errorf("Loopback(%q) = %v, %v; want %v", addr, got, err, want)
		}
	}
	if _, err := Loopback("nonsense"); err == nil {
		t.Error("Loopback accepted an address without a port")
	}
}
