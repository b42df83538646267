package auth

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// memUsersCatalog is the users' record of a cluster in one process: a
// version and the users, applied to every node's store on each change.
type memUsersCatalog struct {
	mu      sync.Mutex
	version uint64
	stores  []*Store
	stale   int // ErrStale answers given
}

func (c *memUsersCatalog) replicate(_ context.Context, base uint64, users []User) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if base != c.version {
		c.stale++
		return ErrStale
	}
	c.version++
	for _, s := range c.stores {
		if err := s.ApplyReplicated(users, c.version); err != nil {
			return err
		}
	}
	return nil
}

func newUsersCluster(t *testing.T, n int) ([]*Store, *memUsersCatalog) {
	c := &memUsersCatalog{}
	for range n {
		s := openStore(t, t.TempDir(), false)
		s.SetReplicator(c.replicate, 0)
		c.stores = append(c.stores, s)
	}
	return c.stores, c
}

func TestReplicatedUsersEverywhere(t *testing.T) {
	stores, _ := newUsersCluster(t, 3)
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
	}
	// The last administrator cannot be deleted from any node.
	if err := stores[1].DeleteUser("admin"); !errors.Is(err, ErrLastAdmin) {
		t.Errorf("deleting the last admin on node 1: %v, want ErrLastAdmin", err)
	}
}

// Changes made at once on different nodes all land: a change computed
// from a stale version is computed again.
func TestReplicatedUsersConcurrent(t *testing.T) {
	stores, c := newUsersCluster(t, 3)
	hash := testHash(t)
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := stores[i%3].PutUser(fmt.Sprintf("u%d", i), UserChange{PasswordHash: hash})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	for i, s := range stores {
		if got := len(s.Users()); got != 12 {
			t.Errorf("node %d has %d users, want 12", i, got)
		}
	}
	t.Logf("%d stale answers", c.stale)
}

// testHash returns a password hash made once per test.
func testHash(t *testing.T) string {
	t.Helper()
	h, err := HashPassword("secret-password")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestReplicatedNoReload(t *testing.T) {
	stores, _ := newUsersCluster(t, 1)
	if err := stores[0].Reload(); !errors.Is(err, ErrReplicated) {
		t.Errorf("Reload in a cluster: %v, want ErrReplicated", err)
	}
}
