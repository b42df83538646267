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
	"context"
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
	"time"
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

	mu       sync.Mutex // serializes changes and reloads; guards onChange, require, remote
	require  bool
	onChange []func()
	// remote, when set, makes every change in the cluster's metadata
	// group instead of here (see replicate.go).
	remote Remote

	state atomic.Pointer[state]

	// pool bounds the password checks in progress and the logins
	// waiting for one: each check takes about 19 MiB and tens of
	// milliseconds of a core, and a storm of logins must take neither the
	// node's memory nor all its cores.
	pool *hashPool
	// throttle delays the answers to repeated failures and keeps their
	// log short.
	throttle *throttle
	// dummy is checked against for unknown users (and oversized
	// passwords), so that every failed login costs one password check and
	// takes as long whether the user exists or not.
	dummy argonHash
	// wait waits out a failure's delay (sleep); onHash, when set, runs
	// before each password check. Tests replace them.
	wait   func(context.Context, time.Duration)
	onHash func()

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
	slots := HashSlots()
	s := &Store{
		path: filepath.Join(cfg.Dir, FileName), require: cfg.RequireUsers, log: cfg.Log,
		pool: newHashPool(slots, hashWaitPerSlot*slots), throttle: newThrottle(cfg.Log), wait: sleep,
		verified: make(map[string][32]byte),
	}
	if _, err := rand.Read(s.macKey[:]); err != nil {
		return nil, fmt.Errorf("auth: key: %w", err)
	}
	s.dummy = argonHash{memory: argonMemory, time: argonTime, threads: argonThreads, salt: make([]byte, argonSaltLen), key: make([]byte, argonKeyLen)}
	if _, err := rand.Read(s.dummy.salt); err != nil {
		return nil, fmt.Errorf("auth: salt: %w", err)
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

// hashWaitPerSlot is how many logins may wait for a password check per
// slot of the pool; past that a login fails at once with [ErrBusy].
const hashWaitPerSlot = 32

// HashSlots is how many password checks run at once: half the
// processors Go uses (GOMAXPROCS), at least one, so that a flood of
// logins leaves the other half to the clients that are logged in.
func HashSlots() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// Attempt is one login.
type Attempt struct {
	// User and Password are the credentials given.
	User, Password string
	// Peer is where the login comes from, "host:port" ("" in-process):
	// failures are counted and answered late per source address (see
	// [Source]) and per user name.
	Peer string
	// Via names the listener for the log: "client", "management", ...
	Via string
}

// Authenticate checks an in-process login; see [Store.Login].
func (s *Store) Authenticate(user, password string) (string, error) {
	return s.Login(context.Background(), Attempt{User: user, Password: password, Via: "embedded"})
}

// Login checks a login and returns the user's name. While the store has
// no users every login succeeds, as the anonymous user "". It fails with
// [ErrNoCredentials] without a user name, with [ErrBadCredentials] for an
// unknown user or a wrong password, and with [ErrBusy] when no password
// check is free before ctx ends or too many logins wait for one.
//
// A user's last good password is remembered (an HMAC), so its next login
// costs no password check. Every other login waits for one of
// [HashSlots] checks, behind the logins of sources without recent
// failures; an unknown user is checked against a dummy hash, so it takes
// as long as a wrong password. Past a few recent failures from the source
// or for the user name, a failure is answered late (up to 2 s, or until
// ctx ends); failures are logged in full once per source per 10 s, and
// the rest of those 10 s in one line.
func (s *Store) Login(ctx context.Context, a Attempt) (string, error) {
	st := s.state.Load()
	if len(st.users) == 0 {
		return "", nil
	}
	if a.User == "" {
		s.wait(ctx, s.throttle.fail(Source(a.Peer), a.Peer, "", a.Via, ErrNoCredentials))
		return "", ErrNoCredentials
	}
	e := st.users[a.User]
	var mac [32]byte
	if e != nil {
		mac = s.mac(e, a.Password)
		s.vmu.Lock()
		known, ok := s.verified[a.User]
		s.vmu.Unlock()
		if ok && hmac.Equal(known[:], mac[:]) {
			return a.User, nil
		}
	}
	source := Source(a.Peer)
	lane := laneHigh
	if s.throttle.suspect(source) {
		lane = laneLow
	}
	if err := s.pool.acquire(ctx, lane); err != nil {
		return "", err
	}
	h, password := s.dummy, a.Password
	if e != nil && len(a.Password) <= MaxPassword {
		h = e.hash
	} else if len(password) > MaxPassword {
		password = ""
	}
	if s.onHash != nil {
		s.onHash()
	}
	ok := h.verify(password) && e != nil
	s.pool.release()
	if !ok {
		s.wait(ctx, s.throttle.fail(source, a.Peer, a.User, a.Via, ErrBadCredentials))
		return "", ErrBadCredentials
	}
	s.vmu.Lock()
	s.verified[a.User] = mac
	s.vmu.Unlock()
	return a.User, nil
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
	if r := s.getRemote(); r != nil {
		return s.putRemote(r, name, ch)
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
	if r := s.getRemote(); r != nil {
		ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
		defer cancel()
		return r.DeleteUser(ctx, name)
	}
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
// users stay as they were. In a cluster the file is this node's copy of
// the cluster's users, and Reload fails with [ErrReplicated].
func (s *Store) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.remote != nil {
		return ErrReplicated
	}
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
