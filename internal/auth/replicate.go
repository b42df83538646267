package auth

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// In a cluster, the users are the same on every node. A change made on
// any node goes to the cluster's metadata group (a [Remote]), which checks
// it with the rules of this package (the last administrator, a new
// user's password, ...) and applies it on every node, in one order, with
// [Store.ApplyUser] and [Store.ApplyDeleteUser]; each node's users file is
// its copy.

// Remote records changes of the users in a cluster's metadata group. Each
// call returns once this node has applied the change, with this package's
// errors.
type Remote interface {
	PutUser(ctx context.Context, name string, ch UserChange) (created bool, err error)
	DeleteUser(ctx context.Context, name string) error
}

// ErrReplicated refuses to reload the users file of a node in a
// cluster: the file is a copy of the cluster's users, which change
// through the management API of any node.
var ErrReplicated = errors.New("auth: in a cluster, users change through the management API (courier users), not by editing users.json")

// remoteTimeout bounds a change's wait for the metadata group.
const remoteTimeout = 10 * time.Second

// SetRemote makes every later change of the users go through r.
func (s *Store) SetRemote(r Remote) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.remote = r
}

func (s *Store) getRemote() Remote {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.remote
}

// putRemote is PutUser through r.
func (s *Store) putRemote(r Remote, name string, ch UserChange) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
	defer cancel()
	return r.PutUser(ctx, name, ch)
}

// importRemote is Import through r: one change per user, in order. A
// failure stops it; the users imported before it stay.
func (s *Store) importRemote(r Remote, users []Imported) (created int, err error) {
	for _, in := range users {
		ch := UserChange{PasswordHash: in.PasswordHash, Permissions: in.Permissions}
		if in.PasswordHash != "" {
			ch.Tags = slices.Clone(in.Tags)
			if ch.Tags == nil {
				ch.Tags = []string{}
			}
		} else {
			ch.MustExist = true
		}
		made, err := s.putRemote(r, in.Name, ch)
		if err != nil {
			return created, fmt.Errorf("user %q: %w", in.Name, err)
		}
		if made {
			created++
		}
	}
	return created, nil
}

// ApplyUser makes u one of this node's users, as the cluster's metadata
// group applied it: it writes the users file and tells the listeners.
func (s *Store) ApplyUser(u User) error {
	return s.applyRemote(func(users map[string]*User) { users[u.Name] = &u })
}

// ApplyDeleteUser deletes user name on this node, as the cluster's
// metadata group applied it.
func (s *Store) ApplyDeleteUser(name string) error {
	return s.applyRemote(func(users map[string]*User) { delete(users, name) })
}

// ApplyUsers makes users this node's users, all of them: the metadata
// group's whole state, when a node loads it.
func (s *Store) ApplyUsers(users []User) error {
	return s.applyRemote(func(all map[string]*User) {
		clear(all)
		for i := range users {
			all[users[i].Name] = &users[i]
		}
	})
}

// applyRemote applies a change the metadata group checked already.
func (s *Store) applyRemote(fn func(map[string]*User)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.state.Load()
	users := make(map[string]*User, len(old.users)+1)
	for name, e := range old.users {
		u := e.User
		users[name] = &u
	}
	fn(users)
	next, err := compileUsers(slices.Collect(maps.Values(users)))
	if err != nil {
		return err
	}
	if err := writeFile(s.path, next); err != nil {
		return err
	}
	s.publish(old, next)
	return nil
}
