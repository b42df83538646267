package auth

import (
	"fmt"
	"slices"
	"strings"
)

// Export returns every user with its password hash (never a password:
// the store has none), tags and permissions, sorted by name: what a
// definitions file keeps.
func (s *Store) Export() []User {
	st := s.state.Load()
	out := make([]User, 0, len(st.users))
	for _, e := range st.users {
		u := e.info()
		out = append(out, User{Name: u.Name, PasswordHash: e.PasswordHash, Tags: u.Tags, Permissions: u.Permissions})
	}
	slices.SortFunc(out, func(a, b User) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Imported is a user of a definitions file to import: with a hash, it
// is created or its hash and tags replaced; without, it must exist (or be
// created by another entry) and only its permissions change. Permissions,
// when not nil, replace the user's.
type Imported struct {
	Name         string
	PasswordHash string
	Tags         []string
	Permissions  *Permissions
}

// CheckImport checks users to import as [Store.Import] would, without
// changing anything: names, hashes, tags and patterns.
func CheckImport(users []Imported) error {
	for _, u := range users {
		if err := CheckName(u.Name); err != nil {
			return err
		}
		if u.PasswordHash != "" {
			if err := CheckHash(u.PasswordHash); err != nil {
				return fmt.Errorf("user %q: %w", u.Name, err)
			}
		}
		if err := checkTags(u.Tags); err != nil {
			return fmt.Errorf("user %q: %w", u.Name, err)
		}
		if u.Permissions != nil {
			if err := u.Permissions.Check(); err != nil {
				return fmt.Errorf("user %q: %w", u.Name, err)
			}
		}
	}
	return nil
}

// Import creates or updates users, all in one change of the users file:
// either every entry is applied or none. Users not listed are left as
// they are. Importing the same users again changes nothing. In a cluster
// (see [Store.SetRemote]) each user is one change of the cluster's
// users, in order, and a failure keeps those before it.
func (s *Store) Import(users []Imported) (created int, err error) {
	if err := CheckImport(users); err != nil {
		return 0, err
	}
	if r := s.getRemote(); r != nil {
		return s.importRemote(r, users)
	}
	err = s.change(func(all map[string]*User) error {
		created = 0
		for _, in := range users {
			u := all[in.Name]
			if u == nil {
				if in.PasswordHash == "" {
					return fmt.Errorf("%w: %q (a new user needs a password_hash)", ErrNoUser, in.Name)
				}
				u = &User{Name: in.Name, Permissions: Permissions{Configure: Patterns{}, Write: Patterns{}, Read: Patterns{}}}
				all[in.Name] = u
				created++
			}
			if in.PasswordHash != "" {
				u.PasswordHash = in.PasswordHash
				u.Tags = slices.Clone(in.Tags)
			}
			if in.Permissions != nil {
				u.Permissions = *in.Permissions
			}
		}
		return nil
	})
	return created, err
}
