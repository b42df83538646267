package auth

import (
	"errors"
	"reflect"
	"testing"
)

// TestImport: an import applies all its users or none; a user without a
// hash only changes permissions, and must exist; importing what Export
// wrote into another store gives the same users, and importing it again
// changes nothing.
func TestImport(t *testing.T) {
	src := openStore(t, t.TempDir(), false)
	full := FullAccess()
	if _, err := src.PutUser("admin", UserChange{Password: "adminpw", Tags: []string{TagAdministrator}, Permissions: &full}); err != nil {
		t.Fatal(err)
	}
	some := Permissions{Configure: Patterns{}, Write: Patterns{"orders.#"}, Read: Patterns{"orders.*"}}
	if _, err := src.PutUser("bob", UserChange{Password: "bobpw", Permissions: &some}); err != nil {
		t.Fatal(err)
	}
	var in []Imported
	for _, u := range src.Export() {
		p := u.Permissions
		in = append(in, Imported{Name: u.Name, PasswordHash: u.PasswordHash, Tags: u.Tags, Permissions: &p})
	}

	dst := openStore(t, t.TempDir(), false)
	bad := append(append([]Imported(nil), in...), Imported{Name: "eve", PasswordHash: "plain"})
	if _, err := dst.Import(bad); !errors.Is(err, ErrBadHash) {
		t.Fatalf("import with a bad hash: %v, want ErrBadHash", err)
	}
	if _, err := dst.Import(append(append([]Imported(nil), in...), Imported{Name: "carol", Permissions: &some})); !errors.Is(err, ErrNoUser) {
		t.Fatalf("permissions of a missing user: %v, want ErrNoUser", err)
	}
	if dst.HasUsers() {
		t.Fatal("a refused import left users")
	}
	if n, err := dst.Import(in); err != nil || n != 2 {
		t.Fatalf("import: %d created, %v", n, err)
	}
	if n, err := dst.Import(in); err != nil || n != 0 {
		t.Fatalf("second import: %d created, %v", n, err)
	}
	if !reflect.DeepEqual(dst.Export(), src.Export()) {
		t.Fatalf("imported users differ:\n%+v\nnot\n%+v", dst.Export(), src.Export())
	}
	if _, err := dst.Authenticate("bob", "bobpw"); err != nil {
		t.Fatalf("bob's password after the import: %v", err)
	}
	none := Permissions{Configure: Patterns{}, Write: Patterns{}, Read: Patterns{}}
	if _, err := dst.Import([]Imported{{Name: "bob", Permissions: &none}}); err != nil {
		t.Fatal(err)
	}
	if u, _ := dst.User("bob"); len(u.Permissions.Write) != 0 {
		t.Fatalf("bob's permissions after a permissions-only import: %+v", u.Permissions)
	}
	if _, err := dst.Authenticate("bob", "bobpw"); err != nil {
		t.Fatalf("a permissions-only import changed bob's password: %v", err)
	}
}
