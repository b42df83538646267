package auth

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// In a cluster, the users are the same on every node: a change made on
// any node is recorded in the cluster's catalog (the metadata Raft
// group), which applies it on every node, in one order, with
// [Store.ApplyReplicated]; the users file is then each node's copy.
//
// A change is computed here, against this node's users, and recorded
// only if the catalog still holds the version of the users it was
// computed from (compare and swap): two nodes changing users at once
// never lose one of the changes; the later is computed again.

// Replicator records a whole set of users in the cluster's catalog if the
// catalog's version of the users is still base, and returns once this
// node has applied the record ([Store.ApplyReplicated]). It returns
// [ErrStale] when the catalog's version is not base, once this node has
// applied the catalog's newer version.
type Replicator func(ctx context.Context, base uint64, users []User) error

// ErrStale is a Replicator's answer when the users changed in the
// catalog since the version a change was computed from.
var ErrStale = errors.New("auth: the cluster's users changed meanwhile")

// ErrReplicated refuses to reload the users file of a node in a
// cluster: the file is a copy of the cluster's users, which change
// through the management API of any node.
var ErrReplicated = errors.New("auth: in a cluster, users change through the management API (courier users), not by editing users.json")

// replicateTimeout bounds a change's wait for the catalog, its tries
// again after [ErrStale] included; between tries it waits a random
// moment up to replicateBackoff, so that changes racing on many nodes
// spread out.
const (
	replicateTimeout = 10 * time.Second
	replicateBackoff = 20 * time.Millisecond
)

// SetReplicator makes every later change of the users go through r. base
// is the catalog's version of the users the store holds now (0: the
// catalog has none yet).
func (s *Store) SetReplicator(r Replicator, base uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repl, s.replBase = r, base
}

// changeReplicated is change through the catalog.
func (s *Store) changeReplicated(fn func(map[string]*User) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), replicateTimeout)
	defer cancel()
	for tries := 1; ; tries++ {
		s.mu.Lock()
		repl, base := s.repl, s.replBase
		old := s.state.Load()
		s.mu.Unlock()
		users := make(map[string]*User, len(old.users)+1)
		for name, e := range old.users {
			u := e.User
			users[name] = &u
		}
		if err := fn(users); err != nil {
			return err
		}
		next, err := compileUsers(slices.Collect(maps.Values(users)))
		if err != nil {
			return err
		}
		if err := s.guard(old.users, next); err != nil {
			return err
		}
		list := make([]User, 0, len(users))
		for _, u := range users {
			list = append(list, *u)
		}
		slices.SortFunc(list, func(a, b User) int { return strings.Compare(a.Name, b.Name) })
		err = repl(ctx, base, list)
		if !errors.Is(err, ErrStale) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w %d times within %s; try again", ErrStale, tries, replicateTimeout)
		case <-time.After(rand.N(replicateBackoff)):
		}
	}
}

// ApplyReplicated makes users, the catalog's version version of the
// cluster's users, this node's users: it writes the users file and tells
// the listeners, as a local change would. The catalog calls it on every
// node in the order of its records.
func (s *Store) ApplyReplicated(users []User, version uint64) error {
	ptrs := make([]*User, len(users))
	for i := range users {
		u := users[i]
		ptrs[i] = &u
	}
	next, err := compileUsers(ptrs)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := writeFile(s.path, next); err != nil {
		return err
	}
	s.replBase = version
	s.publish(s.state.Load(), next)
	return nil
}
