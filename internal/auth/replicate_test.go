package auth

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// memRemote is a cluster's users in one process: an authoritative store
// (the metadata group's state) whose every change is then applied to
// each node's store, in one order.
type memRemote struct {
	mu     sync.Mutex
	truth  *Store
	stores []*Store
}

func (r *memRemote) PutUser(_ context.Context, name string, ch UserChange) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	created, err := r.truth.PutUser(name, ch)
	if err != nil {
		return false, err
	}
	return created, r.spread()
}

func (r *memRemote) DeleteUser(_ context.Context, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.truth.DeleteUser(name); err != nil {
		return err
	}
	return r.spread()
}

func (r *memRemote) spread() error {
	all := r.truth.Export()
	for _, s := range r.stores {
		if err := s.ApplyUsers(all); err != nil {
			return err
		}
	}
	return nil
}

func newUsersCluster(t *testing.T, n int) []*Store {
	r := &memRemote{truth: openStore(t, t.TempDir(), false)}
	for range n {
		s := openStore(t, t.TempDir(), false)
		s.SetRemote(r)
		r.stores = append(r.stores, s)
	}
	return r.stores
}

func TestRemoteUsersEverywhere(t *testing.T) {
	stores := newUsersCluster(t, 3)
	p := FullAccess()
	if _, err := stores[0].PutUser("admin", UserChange{PasswordHash: testHash(t), Tags: []string{TagAdministrator}, Permissions: &p}); err != nil {
		t.Fatal(err)
	}
	if err := stores[2].SetPermissions("admin", Permissions{Configure: Patterns{"x"}, Write: Patterns{}, Read: Patterns{}}); err != nil {
		t.Fatal(err)
	}
	for i, s := range stores {
		if s.Perms("admin", "x")&Configure == 0 || s.Perms("admin", "y") != 0 {
			t.Errorf("node %d: admin's permissions were not replicated: x=%v y=%v", i, s.Perms("admin", "x"), s.Perms("admin", "y"))
		}
		// Each node's file is its copy: a node restarted alone has them.
		again := openStore(t, s.path[:len(s.path)-len(FileName)-1], false)
		if again.Perms("admin", "x")&Configure == 0 {
			t.Errorf("node %d's users file does not hold the change", i)
		}
	}
	if err := stores[1].DeleteUser("admin"); !errors.Is(err, ErrLastAdmin) {
		t.Errorf("deleting the last admin on node 1: %v, want ErrLastAdmin", err)
	}
	n, err := stores[1].Import([]Imported{{Name: "bob", PasswordHash: testHash(t)}, {Name: "carol", PasswordHash: testHash(t)}})
	if err != nil || n != 2 {
		t.Fatalf("import on node 1: %d created, %v", n, err)
	}
	if err := stores[0].DeleteUser("bob"); err != nil {
		t.Fatal(err)
	}
	for i, s := range stores {
		if _, ok := s.User("bob"); ok {
			t.Errorf("node %d still has bob", i)
		}
		if _, ok := s.User("carol"); !ok {
			t.Errorf("node %d lacks carol", i)
		}
	}
}

func TestRemoteUsersConcurrent(t *testing.T) {
	stores := newUsersCluster(t, 3)
	hash := testHash(t)
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := stores[i%3].PutUser(fmt.Sprintf("u%d", i), UserChange{PasswordHash: hash}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i, s := range stores {
		if got := len(s.Users()); got != 12 {
			t.Errorf("node %d has %d users, want 12", i, got)
		}
	}
}

func TestRemoteNoReload(t *testing.T) {
	stores := newUsersCluster(t, 1)
	if err := stores[0].Reload(); !errors.Is(err, ErrReplicated) {
		t.Errorf("Reload in a cluster: %v, want ErrReplicated", err)
	}
}

// testHash returns a password hash.
func testHash(t *testing.T) string {
	t.Helper()
	h, err := HashPassword("secret-password")
	if err != nil {
		t.Fatal(err)
	}
	return h
}
