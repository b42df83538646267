package meta

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
	"github.com/hashicorp/raft"
)

// cmdVersion is the version of the command encoding. A node refuses
// commands of a later version (an upgrade must finish before new
// commands are used); see docs/cluster.md. Version 2 added client
// sessions (session.go): a command made in a session is of version 2,
// the others still of version 1.
const (
	cmdVersion        = 2
	cmdVersionSession = 2
	cmdVersionPlain   = 1
)

// snapVersion is the version of the snapshot encoding: 2 holds the
// session table beside the state; 1 (no "snapshot_version" key) is the
// state alone, and still loads.
const snapVersion = 2

// Operations of commands.
const (
	opDeclare    = "declare"
	opDelete     = "delete"
	opPutUser    = "put-user"
	opDeleteUser = "delete-user"
	opSetPerms   = "set-permissions"
	opClearPerms = "clear-permissions"
	opRenew      = "renew"
	opBump       = "bump-epoch"
	opRehome     = "rehome"
	opForget     = "forget"
	opUnforget   = "unforget"
	opNoop       = "noop"
	// opQueueLeader is in queues.go.
	// opOpenSession opens the client session named by Session.
	opOpenSession = "open-session"
	// maxCommandLen bounds a command, leaving room in a forwarding
	// frame for the request around it.
	maxCommandLen = maxFrame - 4096
)

// command is one entry of the log, in JSON.
type command struct {
	V  int    `json:"v"`
	Op string `json:"op"`
	// Name is the exchange, user or node the command is about.
	Name string `json:"name,omitempty"`

	// declare
	Config *wire.ExchangeConfig `json:"config,omitempty"`
	// Match, if set, is the declaration as its client made it, judged
	// against an existing exchange (fields left out match anything);
	// Config, with the proposing node's defaults filled in, is what a
	// new one is created with. Unset: Config is judged.
	Match   *wire.ExchangeConfig `json:"match,omitempty"`
	By      string               `json:"by,omitempty"`
	Home    string               `json:"home,omitempty"`
	Passive bool                 `json:"passive,omitempty"`

	// put-user, set-permissions
	PasswordHash string            `json:"password_hash,omitempty"`
	Tags         []string          `json:"tags,omitempty"`
	SetTags      bool              `json:"set_tags,omitempty"`
	Permissions  *auth.Permissions `json:"permissions,omitempty"`
	MustExist    bool              `json:"must_exist,omitempty"`
	MustNotExist bool              `json:"must_not_exist,omitempty"`

	// queue-leader: the group, and its term in Epoch
	Group uint64 `json:"group,omitempty"`
	// queue-move, queue-member, queue-member-done: the node moved to,
	// added or (Remove) removed
	Member string `json:"member,omitempty"`
	Remove bool   `json:"remove,omitempty"`

	// renew, bump-epoch
	Epoch   uint64 `json:"epoch,omitempty"`
	Renewed uint64 `json:"renewed,omitempty"`

	// Session, Seq and Done place a catalog command in its node's
	// client session (session.go): a second copy of (Session, Seq) is
	// not applied again. Done: every Seq below it has an outcome.
	Session string `json:"session,omitempty"`
	Seq     uint64 `json:"seq,omitempty"`
	Done    uint64 `json:"done,omitempty"`

	// tries counts the attempts to make it, on the node that makes it.
	tries int
}

// version is the encoding version c needs: sessions came with 2.
func (c *command) version() int {
	if c.Session != "" || c.Op == opOpenSession {
		return cmdVersionSession
	}
	return cmdVersionPlain
}

// result is what applying a command returns: the ApplyFuture's response
// on the leader, and the body of a forwarded request's answer.
type result struct {
	Exchange *Exchange `json:"exchange,omitempty"`
	Created  bool      `json:"created,omitempty"`
	Epoch    uint64    `json:"epoch,omitempty"`
	Moved    int       `json:"moved,omitempty"`
	Err      error     `json:"-"`
}

// fsm is the replicated state machine. raft calls Apply, Snapshot and
// Restore from one goroutine; readers take mu.
type fsm struct {
	obs Observer
	// onRenew, if set, runs when a renewal is applied (the leader's
	// liveness monitor notes when it saw each node).
	onRenew func(node string)
	// onRestore, if set, runs when a snapshot was restored (renewals
	// in it were applied without onRenew).
	onRestore func()
	maxSnap   int64

	mu       sync.RWMutex
	st       State
	sessions sessions
	applied  chan struct{} // closed and replaced when st.Index moves
}

func newFSM(obs Observer, maxSnap int64) *fsm {
	return &fsm{obs: obs, maxSnap: maxSnap, st: newState(), sessions: sessions{}, applied: make(chan struct{})}
}

// Apply applies one command.
func (f *fsm) Apply(l *raft.Log) any {
	var c command
	var res result
	var changes []Change
	if err := decodeCommand(l.Data, &c); err != nil {
		res.Err = err
	} else {
		f.mu.Lock()
		res, changes = f.applySession(l.Index, &c)
		f.mu.Unlock()
	}
	if f.obs != nil {
		for _, ch := range changes {
			f.obs.Apply(ch)
		}
	}
	if c.Op == opRenew && res.Err == nil && f.onRenew != nil {
		f.onRenew(c.Name)
	}
	f.advance(l.Index)
	return &res
}

// advance records that every command up to index is applied (and seen
// by the observer) and wakes the waiters.
func (f *fsm) advance(index uint64) {
	f.mu.Lock()
	if index > f.st.Index {
		f.st.Index = index
	}
	close(f.applied)
	f.applied = make(chan struct{})
	f.mu.Unlock()
}

// index returns the last applied index and a channel closed when it
// moves.
func (f *fsm) index() (uint64, <-chan struct{}) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.st.Index, f.applied
}

func decodeCommand(b []byte, c *command) error {
	if len(b) > maxCommandLen {
		return fmt.Errorf("%w: %d bytes", ErrBadCommand, len(b))
	}
	if err := json.Unmarshal(b, c); err != nil {
		return fmt.Errorf("%w: %v", ErrBadCommand, err)
	}
	if c.V < 1 || c.V > cmdVersion {
		return fmt.Errorf("%w: version %d (this node reads up to %d)", ErrBadCommand, c.V, cmdVersion)
	}
	return nil
}

// applySession applies c in its client session: a command applied
// before returns its stored result and changes nothing. f.mu is held.
func (f *fsm) applySession(index uint64, c *command) (result, []Change) {
	switch {
	case c.Op == opOpenSession:
		if c.Session == "" || len(c.Session) > 255 {
			return result{Err: fmt.Errorf("%w: bad session id", ErrBadCommand)}, nil
		}
		f.sessions.open(c.Session, index)
		return result{}, nil
	case c.Session == "":
		return f.apply(index, c)
	case !catalogOps[c.Op]:
		return result{Err: fmt.Errorf("%w: %q is not made in a session", ErrBadCommand, c.Op)}, nil
	}
	if res, ok := f.sessions.lookup(index, c); ok {
		return res, nil
	}
	res, changes := f.apply(index, c)
	f.sessions.record(c, res)
	return res, changes
}

// apply runs c at index against the state; f.mu is held. It returns the
// result and the changes made, for the observer.
func (f *fsm) apply(index uint64, c *command) (result, []Change) {
	st := &f.st
	switch c.Op {
	case opDeclare:
		return applyDeclare(st, index, c)
	case opDelete:
		ex, ok := st.Exchanges[c.Name]
		if !ok {
			return result{Err: wire.Errorf(wire.CodeNotFound, "exchange %q not found", c.Name)}, nil
		}
		delete(st.Exchanges, c.Name)
		return result{Exchange: &ex}, []Change{{Index: index, Kind: ExchangeDeleted, Exchange: ex}}
	case opPutUser, opSetPerms, opClearPerms:
		return applyPutUser(st, index, c)
	case opDeleteUser:
		u, ok := st.Users[c.Name]
		if !ok {
			return result{Err: fmt.Errorf("%w: %q", auth.ErrNoUser, c.Name)}, nil
		}
		if slices.Contains(u.Tags, auth.TagAdministrator) && admins(st.Users) == 1 {
			return result{Err: auth.ErrLastAdmin}, nil
		}
		if len(st.Users) == 1 {
			// No user would open every node to anonymous clients, which
			// a node listening beyond loopback refuses (auth's
			// RequireUsers): the group refuses it everywhere.
			return result{Err: fmt.Errorf("%w: %q is the last user", auth.ErrNoUsers, c.Name)}, nil
		}
		delete(st.Users, c.Name)
		return result{}, []Change{{Index: index, Kind: UserDeleted, User: auth.User{Name: c.Name}}}
	case opRenew:
		return applyRenew(st, index, c)
	case opBump:
		return applyBump(st, index, c)
	case opRehome:
		n, ok := st.Nodes[c.Name]
		if ok && !n.Expired {
			return result{Err: fmt.Errorf("%w: node %q is live", ErrStale, c.Name)}, nil
		}
		return rehome(st, index, c.Name)
	case opForget:
		n, ok := st.Nodes[c.Name]
		delete(st.Nodes, c.Name)
		res, changes := rehome(st, index, c.Name)
		st.Removed[c.Name] = index
		if ok {
			changes = append(changes, Change{Index: index, Kind: NodeChanged, Node: n, Removed: true})
		}
		return res, changes
	case opUnforget:
		delete(st.Removed, c.Name)
		return result{}, nil
	case opQueueLeader:
		return applyQueueLeader(st, index, c)
	case opQueueMove:
		return applyQueueMove(st, index, c)
	case opQueueMember:
		return applyQueueMember(st, index, c)
	case opQueueMemberDone:
		return applyQueueMemberDone(st, index, c)
	case opNoop:
		return result{}, nil
	}
	return result{Err: fmt.Errorf("%w: unknown operation %q", ErrBadCommand, c.Op)}, nil
}

// nameRE is broker.ValidName's pattern (the test checks they agree):
// the state machine cannot import the broker.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_\-:]+(\.[A-Za-z0-9_\-:]+)*$`)

func validName(name string) bool { return len(name) <= 255 && nameRE.MatchString(name) }

// applyDeclare creates the exchange or checks the existing one matches,
// with the semantics of broker.Declare: fields left empty match anything.
func applyDeclare(st *State, index uint64, c *command) (result, []Change) {
	if c.Config == nil {
		return result{Err: fmt.Errorf("%w: declare without config", ErrBadCommand)}, nil
	}
	cfg := *c.Config
	if !validName(c.Name) {
		return result{Err: wire.Errorf(wire.CodeBadOptions, "invalid exchange name %q: use dot-separated words of letters, digits, '_', '-', ':'", c.Name)}, nil
	}
	if err := cfg.Check(); err != nil {
		return result{Err: wire.Errorf(wire.CodeBadOptions, "exchange %q: %v", c.Name, err)}, nil
	}
	if ex, ok := st.Exchanges[c.Name]; ok {
		judged := cfg
		if c.Match != nil {
			judged = *c.Match
		}
		if err := matches(ex, judged); err != nil {
			return result{Err: err}, nil
		}
		return result{Exchange: &ex}, nil
	}
	if c.Passive {
		return result{Err: wire.Errorf(wire.CodeNotFound, "exchange %q not found", c.Name)}, nil
	}
	if err := normalize(c.Name, &cfg); err != nil {
		return result{Err: err}, nil
	}
	ex := Exchange{Name: c.Name, Config: cfg, DeclaredBy: c.By, Home: c.Home, Index: index, Homed: index}
	if cfg.Pattern == wire.PatternTasks && !cfg.Transient {
		replicas, err := place(st, c.Home, &ex.Config)
		if err != nil {
			return result{Err: err}, nil
		}
		ex.Replicas, ex.Group = strings.Join(replicas, ","), index
		// The home is the leader's node: until the group elects one
		// and its node records itself, the preferred leader.
		ex.Home = replicas[0]
	}
	st.Exchanges[c.Name] = ex
	return result{Exchange: &ex, Created: true}, []Change{{Index: index, Kind: ExchangeDeclared, Exchange: ex}}
}

// normalize checks the pattern and fills in the default strategy, as
// the broker does when it creates an exchange, so that a later
// declaration naming the default matches and one naming another clashes.
// The node that proposes a declaration checks the rest first (strategy
// names, expressions, task options: [Config.CheckExchange]).
func normalize(name string, cfg *wire.ExchangeConfig) error {
	switch cfg.Pattern {
	case wire.PatternReqResp:
		if cfg.Strategy == "" {
			cfg.Strategy = string(courier.Broadcast)
		}
	case wire.PatternTasks:
		if cfg.Strategy == "" {
			cfg.Strategy = wire.StrategyCompeting
		}
	case wire.PatternPubSub:
		if cfg.Strategy != "" {
			return wire.Errorf(wire.CodeBadOptions, "exchange %q: pubsub exchanges take no strategy (got %q)", name, cfg.Strategy)
		}
	case "":
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: pattern missing (reqresp, pubsub or tasks)", name)
	default:
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: unknown pattern %q (reqresp, pubsub or tasks)", name, cfg.Pattern)
	}
	return nil
}

// matches judges a declaration against the stored configuration, as
// every node's broker does ([wire.ExchangeConfig.Clash]).
func matches(ex Exchange, c wire.ExchangeConfig) error {
	return ex.Config.Clash(ex.Name, c)
}

func admins(users map[string]auth.User) int {
	n := 0
	for _, u := range users {
		if slices.Contains(u.Tags, auth.TagAdministrator) {
			n++
		}
	}
	return n
}

// applyPutUser creates or changes a user as auth.Store.PutUser does,
// with a password hash made by the proposing node.
func applyPutUser(st *State, index uint64, c *command) (result, []Change) {
	if err := checkUserCommand(c); err != nil {
		return result{Err: err}, nil
	}
	old, exists := st.Users[c.Name]
	switch {
	case !exists && c.MustExist:
		return result{Err: fmt.Errorf("%w: %q", auth.ErrNoUser, c.Name)}, nil
	case exists && c.MustNotExist:
		return result{Err: fmt.Errorf("%w: %q", auth.ErrUserExists, c.Name)}, nil
	case !exists && c.PasswordHash == "":
		return result{Err: fmt.Errorf("%w: a new user needs a password", auth.ErrBadPassword)}, nil
	}
	u := cloneUser(old)
	if !exists {
		u = auth.User{Name: c.Name, Permissions: auth.Permissions{Configure: auth.Patterns{}, Write: auth.Patterns{}, Read: auth.Patterns{}}}
	}
	if c.PasswordHash != "" {
		u.PasswordHash = c.PasswordHash
	}
	if c.SetTags {
		u.Tags = slices.Clone(c.Tags)
	}
	switch {
	case c.Op == opClearPerms:
		u.Permissions = auth.Permissions{Configure: auth.Patterns{}, Write: auth.Patterns{}, Read: auth.Patterns{}}
	case c.Permissions != nil:
		u.Permissions = cloneUser(auth.User{Permissions: *c.Permissions}).Permissions
	}
	wasAdmin, isAdmin := slices.Contains(old.Tags, auth.TagAdministrator), slices.Contains(u.Tags, auth.TagAdministrator)
	if exists && wasAdmin && !isAdmin && admins(st.Users) == 1 {
		return result{Err: auth.ErrLastAdmin}, nil
	}
	st.Users[c.Name] = u
	kind := UserPut
	if exists && old.PasswordHash == u.PasswordHash && slices.Equal(old.Tags, u.Tags) {
		kind = PermissionsChanged
	}
	return result{Created: !exists}, []Change{{Index: index, Kind: kind, User: cloneUser(u)}}
}

// checkUserCommand validates a user command as auth does: name, hash,
// tags and patterns.
func checkUserCommand(c *command) error {
	if err := auth.CheckName(c.Name); err != nil {
		return err
	}
	if c.PasswordHash != "" {
		if err := auth.CheckHash(c.PasswordHash); err != nil {
			return err
		}
	}
	for _, t := range c.Tags {
		if !slices.Contains(auth.Tags, t) {
			return fmt.Errorf("%w: %q", auth.ErrBadTag, t)
		}
	}
	if c.Permissions != nil {
		return c.Permissions.Check()
	}
	if c.Op == opSetPerms {
		return fmt.Errorf("%w: set-permissions without permissions", ErrBadCommand)
	}
	return nil
}

// applyRenew renews a node's record, creating it at epoch 1. A renewal
// that names an older epoch than the record's (the node was expired and
// bumped) renews the record in its current epoch and returns it: the
// node then knows that what it did under the old epoch is fenced off.
func applyRenew(st *State, index uint64, c *command) (result, []Change) {
	if c.Name == "" {
		return result{Err: fmt.Errorf("%w: renewal without a node", ErrBadCommand)}, nil
	}
	if _, gone := st.Removed[c.Name]; gone {
		return result{Err: fmt.Errorf("%w: %q", ErrRemoved, c.Name)}, nil
	}
	n, ok := st.Nodes[c.Name]
	changed := !ok || n.Expired
	if !ok {
		n = Liveness{Node: c.Name, Epoch: 1}
	}
	n.Expired = false
	n.Renewed = index
	st.Nodes[c.Name] = n
	var changes []Change
	if changed {
		changes = []Change{{Index: index, Kind: NodeChanged, Node: n}}
	}
	return result{Epoch: n.Epoch}, changes
}

// applyBump expires a node whose renewal the leader found overdue,
// unless it renewed since the leader looked (Renewed moved) or was
// already bumped (Epoch moved).
func applyBump(st *State, index uint64, c *command) (result, []Change) {
	n, ok := st.Nodes[c.Name]
	switch {
	case !ok:
		return result{Err: fmt.Errorf("%w: %q", ErrUnknownNode, c.Name)}, nil
	case n.Epoch != c.Epoch || n.Renewed != c.Renewed || n.Expired:
		return result{Epoch: n.Epoch, Err: fmt.Errorf("%w: node %q is at epoch %d, renewed at %d", ErrStale, c.Name, n.Epoch, n.Renewed)}, nil
	}
	n.Epoch++
	n.Expired = true
	st.Nodes[c.Name] = n
	return result{Epoch: n.Epoch}, []Change{{Index: index, Kind: NodeChanged, Node: n}}
}

// rehome moves every exchange homed on from to a live node: each in
// turn, by name, to the live node with the fewest exchanges (ties by node
// name), so that every replica computes the same placement. With no live
// node the exchanges stay where they are.
func rehome(st *State, index uint64, from string) (result, []Change) {
	load := map[string]int{}
	for name, n := range st.Nodes {
		if !n.Expired && name != from {
			load[name] = 0
		}
	}
	if len(load) == 0 {
		return result{}, nil
	}
	var moving []string
	for name, ex := range st.Exchanges {
		if ex.Replicated() {
			continue // homed where its group's leader is
		}
		if _, ok := load[ex.Home]; ok {
			load[ex.Home]++
		}
		if ex.Home == from {
			moving = append(moving, name)
		}
	}
	slices.Sort(moving)
	nodes := sortedKeys(load)
	var changes []Change
	for _, name := range moving {
		to := nodes[0]
		for _, n := range nodes[1:] {
			if load[n] < load[to] {
				to = n
			}
		}
		load[to]++
		ex := st.Exchanges[name]
		ex.Home, ex.Homed = to, index
		st.Exchanges[name] = ex
		changes = append(changes, Change{Index: index, Kind: ExchangeRehomed, Exchange: ex, From: from})
	}
	return result{Moved: len(moving)}, changes
}

// snapshotBody is a snapshot: the state's fields, with the version and
// the session table beside them (a version 1 snapshot has neither).
type snapshotBody struct {
	State
	Version  int      `json:"snapshot_version,omitempty"`
	Sessions sessions `json:"sessions,omitempty"`
}

// Snapshot captures the state: encoded now, on the apply goroutine, so
// that later commands do not change it.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	b, err := json.Marshal(snapshotBody{State: f.st, Version: snapVersion, Sessions: f.sessions})
	f.mu.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("meta: snapshot: %w", err)
	}
	return snapshot(b), nil
}

// Restore replaces the state with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, f.maxSnap+1))
	if err != nil {
		return fmt.Errorf("meta: restore: %w", err)
	}
	if int64(len(b)) > f.maxSnap {
		return fmt.Errorf("meta: restore: snapshot larger than %d bytes", f.maxSnap)
	}
	body := snapshotBody{State: newState()}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&body); err != nil {
		return fmt.Errorf("meta: restore: %w", err)
	}
	if body.Version > snapVersion {
		return fmt.Errorf("meta: restore: snapshot version %d (this node reads up to %d)", body.Version, snapVersion)
	}
	st := body.State.clone() // nil maps made empty
	f.mu.Lock()
	f.st = st
	f.sessions = body.Sessions.clone()
	f.mu.Unlock()
	if f.obs != nil {
		f.obs.Restore(st.clone())
	}
	if f.onRestore != nil {
		f.onRestore()
	}
	f.advance(st.Index)
	return nil
}

// read runs fn on the state under the read lock.
func (f *fsm) read(fn func(*State)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(&f.st)
}

type snapshot []byte

func (s snapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s snapshot) Release() {}
