// Package auth keeps Courier's users: names, argon2id password hashes,
// tags for the management API, and per-user permissions on exchange-name
// patterns (configure, write, read), stored in one JSON file in the data
// directory and replaced atomically on every change.
//
// A [Store] with no users is open: every login succeeds anonymously and
// every permission is granted, which the node allows on loopback
// listeners only. Once a user exists, logins need a valid user name and
// password and each user has only the permissions granted to it.
//
// Reads ([Store.Perms], [Store.Version]) take no lock: the store publishes
// an immutable snapshot after each change, and sessions cache what they
// asked, keyed by [Store.Version].
package auth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// FileName is the users file in the data directory.
const FileName = "users.json"

// User tags, which open the management API.
const (
	// TagAdministrator may use the whole management API, users and
	// permissions included.
	TagAdministrator = "administrator"
	// TagMonitoring may read the management API (GET), except users and
	// permissions.
	TagMonitoring = "monitoring"
)

// Tags lists the tags Courier knows.
var Tags = []string{TagAdministrator, TagMonitoring}

// User is one user as the users file stores it.
type User struct {
	Name         string      `json:"name"`
	PasswordHash string      `json:"password_hash"`
	Tags         []string    `json:"tags,omitempty"`
	Permissions  Permissions `json:"permissions"`
}

// Info is a user as the management API shows it: no password hash.
type Info struct {
	Name        string      `json:"name"`
	Tags        []string    `json:"tags"`
	Permissions Permissions `json:"permissions"`
}

// Policy answers what a user may do. [Store] implements it; the broker
// asks it only when a session's cache misses.
type Policy interface {
	// Version changes whenever any user or permission changes.
	Version() uint64
	// Perms returns what user may do on exchange.
	Perms(user, exchange string) Perm
}

var _ Policy = (*Store)(nil)

// Config configures a Store.
type Config struct {
	// Dir is the data directory; the users live in Dir/users.json.
	// Required.
	Dir string
	// RequireUsers refuses any change or reload that would leave no user:
	// set when the node listens beyond loopback. Default: false.
	RequireUsers bool
	// Log receives structured logs. Default: slog.Default().
	Log *slog.Logger
}

// Store holds the users of one node. It is safe for concurrent use.
type Store struct {
	path string
	log  *slog.Logger

	mu       sync.Mutex // serializes changes and reloads; guards onChange, require
	require  bool
	onChange []func()

	state atomic.Pointer[state]

	// hashing bounds the argon2 computations in progress: each takes
	// about 19 MiB, and a storm of logins must not take the node's memory.
	hashing chan struct{}
	// dummy is verified against for unknown users, so that a login takes
	// as long whether the user exists or not.
	dummy     argonHash
	dummyOnce sync.Once

	// verified remembers, per user, an HMAC of the hash and the password
	// of the last successful login, so that reconnects and the dashboard's
	// polling do not pay argon2 each time.
	macKey   [32]byte
	vmu      sync.Mutex // guards verified
	verified map[string][32]byte
}

// state is an immutable snapshot of the users.
type state struct {
	version uint64
	users   map[string]*entry
}

type entry struct {
	User
	hash  argonHash
	perms compiled
}

// Open loads the users of cfg.Dir. A missing file means no users.
func Open(cfg Config) (*Store, error) {
	if cfg.Dir == "" {
		return nil, errors.New("auth: no data directory")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Store{
		path: filepath.Join(cfg.Dir, FileName), require: cfg.RequireUsers, log: cfg.Log,
		hashing:  make(chan struct{}, max(1, runtime.GOMAXPROCS(0))),
		verified: make(map[string][32]byte),
	}
	if _, err := rand.Read(s.macKey[:]); err != nil {
		return nil, fmt.Errorf("auth: key: %w", err)
	}
	users, err := readFile(s.path)
	if err != nil {
		return nil, err
	}
	if s.require && len(users) == 0 {
		return nil, fmt.Errorf("%w: %s has no users", ErrNoUsers, s.path)
	}
	s.state.Store(&state{version: 1, users: users})
	return s, nil
}

// Require makes the store refuse any change or reload that would leave no
// user, as [Config.RequireUsers] does; it fails if there is none now.
func (s *Store) Require() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.state.Load().users) == 0 {
		return fmt.Errorf("%w: %s has no users", ErrNoUsers, s.path)
	}
	s.require = true
	return nil
}

// Path returns the users file.
func (s *Store) Path() string { return s.path }

// OnChange registers fn to run after every change and reload, in order,
// under the store's lock: fn must not change the store.
func (s *Store) OnChange(fn func()) {
	s.mu.Lock()
	s.onChange = append(s.onChange, fn)
	s.mu.Unlock()
}

// Version returns the version of the users and permissions: it moves on
// with every change and reload.
func (s *Store) Version() uint64 { return s.state.Load().version }

// HasUsers reports whether any user exists: logins then need credentials.
func (s *Store) HasUsers() bool { return len(s.state.Load().users) > 0 }

// Perms returns what user may do on exchange: everything while the store
// has no users, nothing for an unknown user.
func (s *Store) Perms(user, exchange string) Perm {
	st := s.state.Load()
	if len(st.users) == 0 {
		return All
	}
	e := st.users[user]
	if e == nil {
		return 0
	}
	return e.perms.perms(exchange)
}

// HasTag reports whether user exists and has tag.
func (s *Store) HasTag(user, tag string) bool {
	e := s.state.Load().users[user]
	return e != nil && slices.Contains(e.Tags, tag)
}

// Authenticate checks a login and returns the user's name. While the
// store has no users every login succeeds, as the anonymous user "". It
// fails with [ErrNoCredentials] without a user name, and with
// [ErrBadCredentials] for an unknown user or a wrong password. It may
// take tens of milliseconds (argon2id) and wait for other logins.
func (s *Store) Authenticate(user, password string) (string, error) {
	st := s.state.Load()
	if len(st.users) == 0 {
		return "", nil
	}
	if user == "" {
		return "", ErrNoCredentials
	}
	e := st.users[user]
	if e == nil {
		s.dummyOnce.Do(func() {
			h, _ := HashPassword("courier-dummy-password")
			s.dummy, _ = parseHash(h)
		})
		s.slowVerify(s.dummy, password)
		return "", ErrBadCredentials
	}
	mac := s.mac(e, password)
	s.vmu.Lock()
	known, ok := s.verified[user]
	s.vmu.Unlock()
	if ok && hmac.Equal(known[:], mac[:]) {
		return user, nil
	}
	if len(password) > MaxPassword || !s.slowVerify(e.hash, password) {
		return "", ErrBadCredentials
	}
	s.vmu.Lock()
	s.verified[user] = mac
	s.vmu.Unlock()
	return user, nil
}

func (s *Store) slowVerify(h argonHash, password string) bool {
	s.hashing <- struct{}{}
	defer func() { <-s.hashing }()
	return h.verify(password)
}

func (s *Store) mac(e *entry, password string) [32]byte {
	m := hmac.New(sha256.New, s.macKey[:])
	m.Write([]byte(e.PasswordHash))
	m.Write([]byte{0})
	m.Write([]byte(password))
	var out [32]byte
	m.Sum(out[:0])
	return out
}

// Users returns every user, sorted by name.
func (s *Store) Users() []Info {
	st := s.state.Load()
	out := make([]Info, 0, len(st.users))
	for _, e := range st.users {
		out = append(out, e.info())
	}
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// User returns one user.
func (s *Store) User(name string) (Info, bool) {
	e := s.state.Load().users[name]
	if e == nil {
		return Info{}, false
	}
	return e.info(), true
}

func (e *entry) info() Info {
	orEmpty := func(l []string) []string {
		if l == nil {
			return []string{}
		}
		return l
	}
	p := e.Permissions
	p.Configure, p.Write, p.Read = orEmpty(p.Configure), orEmpty(p.Write), orEmpty(p.Read)
	return Info{Name: e.Name, Tags: orEmpty(e.Tags), Permissions: p}
}

// UserChange describes a user to create or update with [Store.PutUser].
type UserChange struct {
	// Password sets the password; "" keeps it (required to create,
	// unless PasswordHash is given).
	Password string
	// PasswordHash sets an argon2id hash made elsewhere instead.
	PasswordHash string
	// Tags replaces the tags when not nil.
	Tags []string
	// Permissions replaces the permissions when not nil.
	Permissions *Permissions
	// MustExist fails with ErrNoUser if the user does not exist;
	// MustNotExist fails with ErrUserExists if it does.
	MustExist, MustNotExist bool
}

// PutUser creates or updates a user. A new user has no permissions
// unless the change gives some.
func (s *Store) PutUser(name string, ch UserChange) (created bool, err error) {
	if err := CheckName(name); err != nil {
		return false, err
	}
	hash := ch.PasswordHash
	if hash != "" {
		if err := CheckHash(hash); err != nil {
			return false, err
		}
	} else if ch.Password != "" {
		// Hash before taking the lock: it is the slow part.
		if hash, err = HashPassword(ch.Password); err != nil {
			return false, err
		}
	}
	if err := checkTags(ch.Tags); err != nil {
		return false, err
	}
	if ch.Permissions != nil {
		if err := ch.Permissions.Check(); err != nil {
			return false, err
		}
	}
	err = s.change(func(users map[string]*User) error {
		u := users[name]
		switch {
		case u == nil && ch.MustExist:
			return fmt.Errorf("%w: %q", ErrNoUser, name)
		case u != nil && ch.MustNotExist:
			return fmt.Errorf("%w: %q", ErrUserExists, name)
		case u == nil && hash == "":
			return fmt.Errorf("%w: a new user needs a password", ErrBadPassword)
		case u == nil:
			u = &User{Name: name, Permissions: Permissions{Configure: Patterns{}, Write: Patterns{}, Read: Patterns{}}}
			users[name] = u
			created = true
		}
		if hash != "" {
			u.PasswordHash = hash
		}
		if ch.Tags != nil {
			u.Tags = slices.Clone(ch.Tags)
		}
		if ch.Permissions != nil {
			u.Permissions = *ch.Permissions
		}
		return nil
	})
	return created, err
}

// Bootstrap creates name as an administrator with every permission if
// the store has no users yet; it reports whether it did.
func (s *Store) Bootstrap(name, password string) (bool, error) {
	if s.HasUsers() {
		return false, nil
	}
	p := FullAccess()
	created, err := s.PutUser(name, UserChange{Password: password, Tags: []string{TagAdministrator}, Permissions: &p, MustNotExist: true})
	if err != nil && errors.Is(err, ErrUserExists) {
		return false, nil
	}
	return created, err
}

// SetPermissions replaces the permissions of user.
func (s *Store) SetPermissions(user string, p Permissions) error {
	_, err := s.PutUser(user, UserChange{Permissions: &p, MustExist: true})
	return err
}

// DeleteUser deletes a user.
func (s *Store) DeleteUser(name string) error {
	return s.change(func(users map[string]*User) error {
		if users[name] == nil {
			return fmt.Errorf("%w: %q", ErrNoUser, name)
		}
		delete(users, name)
		return nil
	})
}

// change applies fn to a copy of the users, checks the result, writes it
// to the file and publishes it.
func (s *Store) change(fn func(map[string]*User) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.state.Load()
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
	if err := writeFile(s.path, next); err != nil {
		return err
	}
	s.publish(old, next)
	return nil
}

// guard refuses to leave no administrator where there was one (deleting
// the last user would also open the node to anonymous clients), or no
// user at all where users are required.
func (s *Store) guard(old, next map[string]*entry) error {
	if s.require && len(next) == 0 {
		return ErrNoUsers
	}
	if hasAdmin(old) && !hasAdmin(next) {
		return ErrLastAdmin
	}
	return nil
}

func hasAdmin(users map[string]*entry) bool {
	for _, e := range users {
		if slices.Contains(e.Tags, TagAdministrator) {
			return true
		}
	}
	return false
}

// publish makes next the current users and tells the listeners. s.mu is
// held.
func (s *Store) publish(old *state, next map[string]*entry) {
	s.state.Store(&state{version: old.version + 1, users: next})
	// A remembered login binds the hash it was checked against, so one
	// whose password changed no longer matches; only deleted users go.
	s.vmu.Lock()
	for user := range s.verified {
		if next[user] == nil {
			delete(s.verified, user)
		}
	}
	s.vmu.Unlock()
	for _, fn := range s.onChange {
		fn()
	}
}

// Reload reads the users file again, as after SIGHUP. On an error the
// users stay as they were.
func (s *Store) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	users, err := readFile(s.path)
	if err != nil {
		return err
	}
	if s.require && len(users) == 0 {
		return fmt.Errorf("%w: %s has no users; keeping the %d loaded", ErrNoUsers, s.path, len(s.state.Load().users))
	}
	s.publish(s.state.Load(), users)
	s.log.Info("users reloaded", "file", s.path, "users", len(users))
	return nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.@+\-]{0,63}$`)

// CheckName validates a user name: 1 to 64 letters, digits and _ . @ + -,
// starting with a letter or digit.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: %q: use 1 to 64 letters, digits and _ . @ + -, starting with a letter or digit", ErrBadName, name)
	}
	return nil
}

func checkTags(tags []string) error {
	for _, t := range tags {
		if !slices.Contains(Tags, t) {
			return fmt.Errorf("%w: %q (known: %s)", ErrBadTag, t, strings.Join(Tags, ", "))
		}
	}
	return nil
}

// compileUsers validates users and builds their entries.
func compileUsers(users []*User) (map[string]*entry, error) {
	out := make(map[string]*entry, len(users))
	for _, u := range users {
		if err := CheckName(u.Name); err != nil {
			return nil, err
		}
		if _, dup := out[u.Name]; dup {
			return nil, fmt.Errorf("%w: %q appears twice", ErrUserExists, u.Name)
		}
		h, err := parseHash(u.PasswordHash)
		if err != nil {
			return nil, fmt.Errorf("user %q: %w", u.Name, err)
		}
		if err := checkTags(u.Tags); err != nil {
			return nil, fmt.Errorf("user %q: %w", u.Name, err)
		}
		if err := u.Permissions.Check(); err != nil {
			return nil, fmt.Errorf("user %q: %w", u.Name, err)
		}
		out[u.Name] = &entry{User: *u, hash: h, perms: compile(u.Permissions)}
	}
	return out, nil
}
