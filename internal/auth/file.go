package auth

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// fileVersion is the format version of the users file.
const fileVersion = 1

// usersFile is the users file's JSON:
//
//	{"version": 1, "users": [{"name": "admin", "password_hash": "$argon2id$...",
//	  "tags": ["administrator"],
//	  "permissions": {"configure": ["#"], "write": ["#"], "read": ["#"]}}]}
type usersFile struct {
	Version int     `json:"version"`
	Users   []*User `json:"users"`
}

// readFile loads and validates the users file; a missing file has no
// users.
func readFile(path string) (map[string]*entry, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]*entry{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	var f usersFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadFile, path, err)
	}
	if f.Version != fileVersion {
		return nil, fmt.Errorf("%w: %s: version %d, want %d", ErrBadFile, path, f.Version, fileVersion)
	}
	users, err := compileUsers(slices.DeleteFunc(f.Users, func(u *User) bool { return u == nil }))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadFile, path, err)
	}
	return users, nil
}

// writeFile replaces the users file atomically: a temporary file in the
// same directory, fsync, rename over the old one, fsync of the directory.
// The file is readable by its owner only.
func writeFile(path string, users map[string]*entry) error {
	f := usersFile{Version: fileVersion, Users: make([]*User, 0, len(users))}
	for _, e := range users {
		u := e.User
		f.Users = append(f.Users, &u)
	}
	slices.SortFunc(f.Users, func(a, b *User) int { return strings.Compare(a.Name, b.Name) })
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("auth: encode users: %w", err)
	}
	b = append(b, '\n')
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("auth: write users: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("auth: write users: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		return fmt.Errorf("auth: write users: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("auth: write users: fsync: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("auth: write users: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("auth: write users: %w", err)
	}
	done = true
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("auth: write users: fsync %s: %w", dir, err)
		}
	}
	return nil
}
