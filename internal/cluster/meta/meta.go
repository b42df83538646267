// Package meta is the cluster's metadata group: one Raft group (hashicorp
// raft) over every node that holds the exchanges with their home node,
// the users and their permissions, and the node liveness table.
//
// Any node may write: a follower forwards the command to the leader,
// which applies it, and the call returns once the command is applied on
// the node that made the call, so a client reads its own writes there.
// [Meta.Get] is linearizable; the other reads are local and may lag the
// group by the replication delay. An [Observer] sees every change in log
// order on every node. See docs/cluster.md, "Metadata group".
package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/courier-mq/courier/wire"
	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Config configures a Meta.
type Config struct {
	// NodeID names this node, unique in the cluster. Required.
	NodeID string
	// Dir is where the group keeps its log, its stable state and its
	// snapshots (created if missing). Required.
	Dir string
	// Advertise is the Raft address other nodes reach this one at, as
	// Stream's Dial understands it. Required.
	Advertise string
	// Stream carries Raft between nodes. Required. The fabric provides
	// authenticated streams: Raft's own messages are decoded without
	// the bounds this package puts on forwarding frames, so only nodes
	// that proved their membership may reach it.
	Stream raft.StreamLayer
	// Forward carries forwarded commands and reads between nodes.
	// Required.
	Forward ForwardLayer
	// BootstrapExpect is the number of nodes the first cluster forms
	// with, as Consul's bootstrap_expect: a node without Raft state
	// bootstraps once [Meta.Reconcile] lists that many members and none
	// of them has state. 0 never bootstraps: the node waits to be added
	// by the leader of a formed cluster.
	BootstrapExpect int
	// Observer follows the state on this node (nil: none).
	Observer Observer
	// CheckExchange, if set, checks a declaration on the node that makes
	// it, before it is proposed: the broker's checks of strategies,
	// expressions and task options. The state machine itself checks the
	// name, the numbers, the pattern, and the match with an existing
	// exchange.
	CheckExchange func(name string, cfg wire.ExchangeConfig) error
	// Log receives structured logs. Default: slog.Default().
	Log *slog.Logger

	// HeartbeatTimeout, ElectionTimeout and LeaderLeaseTimeout are
	// Raft's (defaults 500 ms, 1 s, 500 ms: a LAN).
	HeartbeatTimeout, ElectionTimeout, LeaderLeaseTimeout time.Duration
	// CommitTimeout is how long the leader waits, without new entries,
	// before it sends the followers the commit index again (default
	// 500 ms; Raft's own is 50 ms). No write waits for it: the leader
	// nudges the followers with a barrier entry once any write is
	// applied (see nudgeLoop), so at rest it only costs an empty
	// AppendEntries to each follower every 0.5–1 s. It has no part in
	// failure detection (HeartbeatTimeout) or elections.
	CommitTimeout time.Duration
	// RenewInterval, LeaseDuration and LeaseMargin time the liveness
	// leases (defaults 200 ms, 1.2 s, 0.4 s): a node sends the leader a
	// heartbeat every RenewInterval (not through the log), and marks it
	// on every voter; the leader expires a record LeaseDuration after it
	// received the last one, or, if none came in its term, after the
	// latest receipt a majority of voters reported when its term started
	// (after the term's start if they knew none); the node itself stops
	// trusting its lease LeaseDuration-LeaseMargin after it sent the
	// last heartbeat the leader answered and a majority marked.
	RenewInterval, LeaseDuration, LeaseMargin time.Duration
	// SnapshotThreshold and SnapshotInterval: a snapshot is taken when
	// this many entries were written since the last one, checked every
	// interval (defaults 1024 and 30 s). TrailingLogs entries are kept
	// after a snapshot for followers that lag (default 1024).
	SnapshotThreshold, TrailingLogs uint64
	SnapshotInterval                time.Duration
	// MaxSnapshotBytes bounds a snapshot read back or received (default
	// 64 MiB).
	MaxSnapshotBytes int64
	// OpTimeout bounds a write or linearizable read whose context has no
	// deadline (default 10 s).
	OpTimeout time.Duration
	// NoLeaderTimeout fails a write or linearizable read at once with
	// ErrNoQuorum, rather than at its deadline, when this node has
	// known no leader for that long (default 3 s: three election
	// timeouts, beyond any election of a healthy majority).
	NoLeaderTimeout time.Duration
}

func (c *Config) defaults() error {
	switch {
	case c.NodeID == "":
		return errors.New("meta: no node id")
	case c.Dir == "":
		return errors.New("meta: no data directory")
	case c.Advertise == "":
		return errors.New("meta: no advertised address")
	case c.Stream == nil || c.Forward == nil:
		return errors.New("meta: no stream or forward layer")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.HeartbeatTimeout, 500*time.Millisecond)
	def(&c.ElectionTimeout, time.Second)
	def(&c.LeaderLeaseTimeout, 500*time.Millisecond)
	def(&c.CommitTimeout, 500*time.Millisecond)
	def(&c.RenewInterval, 200*time.Millisecond)
	def(&c.LeaseDuration, 1200*time.Millisecond)
	def(&c.LeaseMargin, 400*time.Millisecond)
	def(&c.SnapshotInterval, 30*time.Second)
	def(&c.OpTimeout, 10*time.Second)
	def(&c.NoLeaderTimeout, 3*time.Second)
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 1024
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = 1024
	}
	if c.MaxSnapshotBytes <= 0 {
		c.MaxSnapshotBytes = 64 << 20
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.LeaseMargin >= c.LeaseDuration || c.RenewInterval >= c.LeaseDuration-c.LeaseMargin {
		return fmt.Errorf("meta: renew interval %v and margin %v must fit in the lease %v", c.RenewInterval, c.LeaseMargin, c.LeaseDuration)
	}
	return nil
}

// Meta is one node's member of the metadata group. It is safe for
// concurrent use.
type Meta struct {
	cfg    Config
	log    *slog.Logger
	raft   *raft.Raft
	trans  *raft.NetworkTransport
	stream *closingStream // trans's, closed before store (stream.go)
	store  *boltStore
	fsm    *fsm

	ctx    context.Context // ends at Shutdown
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	pool forwardPool

	cmu   sync.Mutex // guards conns
	conns map[net.Conn]struct{}

	lmu        sync.Mutex // guards epoch, validUntil
	epoch      uint64
	validUntil time.Time

	// dmu is held by each round of the leader's liveness duties
	// (leaderLoop): tests hold it to run them by hand.
	dmu          sync.Mutex
	smu          sync.Mutex // guards seen, expiring, readyTerm, startingTerm, termStart
	seen         map[string]time.Time
	expiring     map[string]bool
	readyTerm    uint64    // the term this node leads and has started, or 0
	startingTerm uint64    // the last term startTerm began
	termStart    time.Time // when startTerm began startingTerm

	// rmu guards this node's record as a voter of the heartbeats it
	// received (receipts), the highest term whose fencing round it
	// answered (fence), when it applied each node's last renewal
	// (renewedAt, or restoredAt for a snapshot), and the configuration
	// index of the last leader answer this node had (beatConfig).
	rmu        sync.Mutex
	receipts   map[string]receipt
	fence      uint64
	renewedAt  map[string]time.Time
	restoredAt time.Time
	beatConfig uint64

	mmu     sync.Mutex // guards members
	members []Member

	started time.Time
	nudge   chan struct{}

	// session is this node's client session; inFlight bounds the
	// catalog commands in flight (maxInFlight).
	session  clientSession
	inFlight chan struct{}

	// staleReads makes Get read the local state without asking the
	// leader: tests use it to check that the linearizability checker
	// catches stale reads.
	staleReads bool
}

// New opens the group's state in cfg.Dir and starts the node's member of
// the group. A node that has state rejoins its cluster; one without
// waits for [Meta.Reconcile] to bootstrap it or for a leader to add it.
func New(cfg Config) (*Meta, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("meta: %w", err)
	}
	m := &Meta{cfg: cfg, log: cfg.Log, done: make(chan struct{}), conns: map[net.Conn]struct{}{}, seen: map[string]time.Time{}, receipts: map[string]receipt{}, renewedAt: map[string]time.Time{}, expiring: map[string]bool{}, started: time.Now(), nudge: make(chan struct{}, 1), inFlight: make(chan struct{}, maxInFlight)}
	m.session.expired("", cfg.NodeID) // a new session id
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.pool.m = m
	hl := hclog.New(&hclog.LoggerOptions{Name: "meta-raft", Level: hclog.Warn, Output: slogWriter{cfg.Log}, DisableTime: true})
	store, err := openBoltStore(filepath.Join(cfg.Dir, "raft.db"))
	if err != nil {
		return nil, err
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, hl)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("meta: snapshots: %w", err)
	}
	m.store = store
	m.fsm = newFSM(cfg.Observer, cfg.MaxSnapshotBytes)
	m.fsm.onRenew = m.sawRenewal
	m.fsm.onRestore = m.sawRestore
	m.stream = newClosingStream(cfg.Stream)
	m.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: m.stream, MaxPool: 3, Timeout: 5 * time.Second, Logger: hl,
	})
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	// Proposals queue for the leader's group commit (up to
	// MaxAppendEntries, 64, per disk write and append) rather than
	// hand over one by one; Apply's enqueue timeout then no longer
	// holds, which callers do not rely on (they wait with a context).
	rc.BatchApplyCh = true
	rc.Logger = hl
	r, err := raft.NewRaft(rc, m.fsm, store, store, snaps, m.trans)
	if err != nil {
		m.trans.Close()
		store.Close()
		return nil, fmt.Errorf("meta: start raft: %w", err)
	}
	m.raft = r
	m.wg.Add(5)
	go m.nudgeLoop()
	go m.serveForward()
	go m.renewLoop()
	go m.leaderLoop()
	go m.memberLoop()
	return m, nil
}

// Shutdown stops this node's member of the group without leaving it:
// the others see it as failed, and it rejoins when started again from
// its directory. It closes the listeners of both layers.
// HandOver transfers the metadata group's leadership to the most
// up-to-date other voter, if this node leads, and waits for the transfer
// (at most an election timeout, or until ctx ends): a node that stops
// gracefully calls it first, so that the group does not wait for an
// election timeout without a leader. It is a no-op on a follower.
func (m *Meta) HandOver(ctx context.Context) error {
	if !m.IsLeader() {
		return nil
	}
	return wait(ctx, m.raft.LeadershipTransfer())
}

func (m *Meta) Shutdown() error {
	var err error
	m.once.Do(func() {
		close(m.done)
		m.cancel()
		err = m.raft.Shutdown().Error()
		m.trans.Close()
		m.stream.closeAccepted()
		m.cfg.Forward.Close()
		m.cmu.Lock()
		for c := range m.conns {
			c.Close()
		}
		m.cmu.Unlock()
		m.pool.closeAll()
		m.wg.Wait()
		if cerr := m.store.Close(); err == nil {
			err = cerr
		}
	})
	return err
}

// trackConn records a served connection, for Shutdown to close; one
// that starts once Shutdown began is closed at once (Shutdown closes
// done before it closes the recorded ones).
func (m *Meta) trackConn(c net.Conn, add bool) {
	m.cmu.Lock()
	defer m.cmu.Unlock()
	if !add {
		delete(m.conns, c)
		return
	}
	select {
	case <-m.done:
		c.Close()
	default:
		m.conns[c] = struct{}{}
	}
}

// NodeID returns this node's id.
func (m *Meta) NodeID() string { return m.cfg.NodeID }

// Leader returns the id of the leader this node knows, or "".
func (m *Meta) Leader() string {
	_, id := m.raft.LeaderWithID()
	return string(id)
}

// IsLeader reports whether this node is the leader.
func (m *Meta) IsLeader() bool { return m.raft.State() == raft.Leader }

// Server is one member of the Raft configuration.
type Server struct {
	ID    string `json:"id"`
	Addr  string `json:"addr"`
	Voter bool   `json:"voter"`
}

// Servers returns the Raft configuration as this node knows it.
func (m *Meta) Servers() ([]Server, error) {
	f := m.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, mapRaftErr(err)
	}
	var out []Server
	for _, s := range f.Configuration().Servers {
		out = append(out, Server{ID: string(s.ID), Addr: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return out, nil
}

// opContext bounds ctx by OpTimeout when it has no deadline, and by the
// node's shutdown.
func (m *Meta) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); !ok {
		var c1 context.CancelFunc
		ctx, c1 = context.WithTimeout(ctx, m.cfg.OpTimeout)
		ctx, c2 := mergeDone(ctx, m.ctx)
		return ctx, func() { c2(); c1() }
	}
	return mergeDone(ctx, m.ctx)
}

// mergeDone returns ctx also cancelled when other ends.
func mergeDone(ctx, other context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(other, cancel)
	return ctx, func() { stop(); cancel() }
}

// noQuorum is the error of a call whose context ended while it waited
// for the group.
func (m *Meta) noQuorum(ctx context.Context, what string, last error) error {
	select {
	case <-m.done:
		return ErrClosed
	default:
	}
	if ctx.Err() == nil {
		return fmt.Errorf("%w: %s: no leader known for %v", ErrNoQuorum, what, m.leaderless().Round(time.Millisecond))
	}
	if last != nil && !errors.Is(last, ErrNotLeader) {
		return fmt.Errorf("%w: %s: %w (%w)", ErrNoQuorum, what, ctx.Err(), last)
	}
	return fmt.Errorf("%w: %s: no leader answered: %w", ErrNoQuorum, what, ctx.Err())
}

// mapRaftErr turns raft's errors into this package's.
func mapRaftErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader):
		return fmt.Errorf("%w: %v", ErrNotLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrClosed
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress),
		errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrAbortedByRestore):
		return fmt.Errorf("%w: %v", ErrNoQuorum, err)
	}
	return err
}

// barrier commits a barrier entry, giving up when this node shuts down;
// enqueue bounds the wait for room in Raft's apply queue. The future's
// own Error would not do: with BatchApplyCh, a future still queued when
// Raft shuts down is never answered (hashicorp/raft#498), and Shutdown
// would wait for its caller forever.
func (m *Meta) barrier(enqueue time.Duration) error {
	return wait(m.ctx, m.raft.Barrier(enqueue))
}

// wait waits for f within ctx. A future that is never answered leaves
// its waiting goroutine behind; that happens only to futures queued when
// Raft shuts down.
func wait(ctx context.Context, f raft.Future) error {
	ch := make(chan error, 1)
	go func() { ch <- f.Error() }()
	select {
	case err := <-ch:
		return mapRaftErr(err)
	case <-ctx.Done():
		return fmt.Errorf("%w: waiting for the group: %w", ErrNoQuorum, ctx.Err())
	}
}

func timeLeft(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return maxRequestTime
}

// forwardable lists the operations a peer may send to the leader; the
// others (epochs, re-homing, removal) the leader makes itself.
var forwardable = map[string]bool{opDeclare: true, opDelete: true, opPutUser: true, opDeleteUser: true,
	opSetPerms: true, opClearPerms: true, opRenew: true, opQueueLeader: true, opOpenSession: true,
	opQueueMove: true, opQueueMember: true, opQueueMemberDone: true}

// applyLeader applies c on this node, which must be the leader, and
// returns its index and the state machine's result.
func (m *Meta) applyLeader(ctx context.Context, c *command) (uint64, *result, error) {
	if m.raft.State() != raft.Leader {
		return 0, nil, ErrNotLeader
	}
	c.V = c.version()
	b, err := json.Marshal(c)
	if err != nil {
		return 0, nil, err
	}
	if len(b) > maxCommandLen {
		return 0, nil, tooLarge(len(b))
	}
	f := m.raft.Apply(b, timeLeft(ctx))
	if err := wait(ctx, f); err != nil {
		return 0, nil, err
	}
	res, ok := f.Response().(*result)
	if !ok {
		return 0, nil, fmt.Errorf("meta: unexpected response %T", f.Response())
	}
	return f.Index(), res, nil
}

// checkSize refuses a command too large to replicate before it is sent.
func checkSize(c *command) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if len(b) > maxCommandLen {
		return tooLarge(len(b))
	}
	return nil
}

func tooLarge(n int) error {
	return wire.Errorf(wire.CodeBadOptions, "metadata change of %d bytes, at most %d", n, maxCommandLen)
}

// nudgeLoop appends a barrier entry each time a forwarded write, or a
// write made on the leader, was applied on this leader: the entry goes to
// the followers at once with the commit index that covers the write, so
// every node applies it within about one round trip, and the follower
// that forwarded it returns then, not after
// CommitTimeout (78 ms at the median with Raft's 50 ms, 3.5 ms with the
// nudge, in BenchmarkDeclareOnFollower). Nudges asked for while one is
// in flight are served by the next one.
func (m *Meta) nudgeLoop() {
	defer m.wg.Done()
	for {
		select {
		case <-m.done:
			return
		case <-m.nudge:
		}
		if m.raft.State() == raft.Leader {
			m.barrier(m.cfg.CommitTimeout)
		}
	}
}

// applyLeaderNudged is applyLeader for the leader's own writes (an
// expiry, a re-homing, a node forgotten): once one is applied, a nudge
// carries its commit to the followers at once, as for a declare, rather
// than at Raft's next idle replication (CommitTimeout, 0.5–1 s).
func (m *Meta) applyLeaderNudged(ctx context.Context, c *command) (uint64, *result, error) {
	idx, res, err := m.applyLeader(ctx, c)
	if err == nil {
		m.askNudge()
	}
	return idx, res, err
}

// askNudge asks nudgeLoop for a barrier.
func (m *Meta) askNudge() {
	select {
	case m.nudge <- struct{}{}:
	default:
	}
}

// apply makes c from any node: applied here if this node leads, else
// forwarded to the leader, retried while no leader is known or the one
// asked no longer leads; then waits for this node to apply it. A catalog
// command is made in this node's client session (session.go), so that it
// is retried too when its outcome is unknown (the leader lost its
// leadership as it committed it, or its answer did not come back): the
// group applies it at most once and returns its true outcome.
func (m *Meta) apply(ctx context.Context, c *command) (*result, error) {
	c.V = c.version()
	if err := checkSize(c); err != nil {
		return nil, err
	}
	ctx, cancel := m.opContext(ctx)
	defer cancel()
	if !catalogOps[c.Op] {
		return m.applyRetry(ctx, c, false)
	}
	select {
	case m.inFlight <- struct{}{}:
		defer func() { <-m.inFlight }()
	case <-ctx.Done():
		return nil, m.noQuorum(ctx, c.Op, nil)
	}
	for attempt := 0; ; attempt++ {
		if err := m.openSession(ctx); err != nil {
			return nil, err
		}
		m.session.begin(c)
		c.V, c.tries = c.version(), 0
		res, err := m.applyRetry(ctx, c, true)
		m.session.end(c)
		if !errors.Is(err, ErrSessionExpired) {
			return res, err
		}
		// The group dropped the session (it holds maxSessions): a
		// command sent once only was not applied, and is made again in
		// a new session; a retried one has an unknown outcome.
		m.session.expired(c.Session, m.cfg.NodeID)
		if c.tries > 1 || attempt > 0 {
			return nil, fmt.Errorf("%w: %s: outcome unknown: %w", ErrNoQuorum, c.Op, err)
		}
	}
}

// openSession opens this node's client session in the group, once.
func (m *Meta) openSession(ctx context.Context) error {
	if _, opened := m.session.state(); opened {
		return nil
	}
	select {
	case m.session.opening <- struct{}{}:
		defer func() { <-m.session.opening }()
	case <-ctx.Done():
		return m.noQuorum(ctx, opOpenSession, nil)
	}
	id, opened := m.session.state()
	if opened {
		return nil
	}
	// Opening is idempotent: it is retried whatever its outcome.
	if _, err := m.applyRetry(ctx, &command{V: cmdVersionSession, Op: opOpenSession, Session: id}, true); err != nil {
		return fmt.Errorf("meta: open session: %w", err)
	}
	m.session.setOpened(id)
	return nil
}

// applyRetry makes c, retrying while the attempts surely did nothing
// or, with unknown set (c is safe to apply twice), while their outcome
// is unknown. A result that the state machine returned comes back with
// its error.
func (m *Meta) applyRetry(ctx context.Context, c *command, unknown bool) (*result, error) {
	var last error
	for {
		c.tries++
		idx, res, err := m.applyOnce(ctx, c)
		if err == nil {
			if err := m.waitApplied(ctx, idx); err != nil {
				return nil, err
			}
			return res, res.Err
		}
		if !retryable(err) && !(unknown && unknownOutcome(err)) {
			return nil, err
		}
		last = err
		if !m.pause(ctx) {
			return nil, m.noQuorum(ctx, c.Op, last)
		}
		if c.Session != "" {
			m.session.refresh(c)
		}
	}
}

// unknownOutcome reports whether a failed attempt may or may not have
// been applied: the leader lost its leadership while committing it, or
// its answer did not come back.
func unknownOutcome(err error) bool {
	return errors.Is(err, ErrNoQuorum) && !errors.Is(err, ErrClosed)
}

func (m *Meta) applyOnce(ctx context.Context, c *command) (uint64, *result, error) {
	addr, id := m.raft.LeaderWithID()
	switch {
	case id == "":
		return 0, nil, ErrNotLeader
	case string(id) == m.cfg.NodeID:
		idx, res, err := m.applyLeader(ctx, c)
		if err == nil && c.Op != opRenew {
			// The other nodes learn of the commit at once too.
			m.askNudge()
		}
		return idx, res, err
	}
	var resp response
	if err := m.pool.pipelined(ctx, string(id), string(addr), typeApply, &request{Command: c}, &resp); err != nil {
		return 0, nil, err
	}
	if resp.Result == nil {
		err := resp.Err.err()
		if errors.Is(err, ErrClosed) {
			// The leader shut down as it committed: the outcome is
			// unknown (this node's own shutdown is ErrClosed itself).
			return 0, nil, fmt.Errorf("%w: the leader %s shut down: %w", ErrNoQuorum, id, err)
		}
		return 0, nil, err
	}
	resp.Result.Err = resp.Err.err()
	return resp.Index, resp.Result, nil
}

// retryable reports whether a failed attempt surely did nothing, so that
// it may be made again: no leader, or the request never reached one.
func retryable(err error) bool {
	var ne notSent
	return errors.Is(err, ErrNotLeader) || errors.As(err, &ne)
}

// pause waits a little before another attempt; false when ctx ended,
// or when this node has known no leader for NoLeaderTimeout.
func (m *Meta) pause(ctx context.Context) bool {
	if m.leaderless() >= m.cfg.NoLeaderTimeout {
		return false
	}
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// leaderless returns how long this node has known no leader: 0 while it
// knows one.
func (m *Meta) leaderless() time.Duration {
	if _, id := m.raft.LeaderWithID(); id != "" {
		return 0
	}
	last := m.raft.LastContact()
	if last.Before(m.started) {
		last = m.started
	}
	return time.Since(last)
}

// waitApplied waits until this node has applied index.
func (m *Meta) waitApplied(ctx context.Context, index uint64) error {
	for {
		cur, ch := m.fsm.index()
		if cur >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			select {
			case <-m.done:
				return ErrClosed
			default:
			}
			return fmt.Errorf("%w: index %d, applied %d: %w", ErrBehind, index, cur, ctx.Err())
		}
	}
}

// readIndexLeader returns an index that covers every write that
// completed before it was called: a barrier commits an entry in the
// leader's term (so it still leads with a quorum) and waits until the
// state machine applied everything before it.
func (m *Meta) readIndexLeader(ctx context.Context) (uint64, error) {
	if m.raft.State() != raft.Leader {
		return 0, ErrNotLeader
	}
	if err := wait(ctx, m.raft.Barrier(timeLeft(ctx))); err != nil {
		return 0, err
	}
	idx, _ := m.fsm.index()
	return idx, nil
}

// sync makes this node's state cover every write completed before it was
// called (a linearizable read follows).
func (m *Meta) sync(ctx context.Context) error {
	if m.staleReads {
		return nil
	}
	var last error
	for {
		idx, err := m.readIndex(ctx)
		if err == nil {
			return m.waitApplied(ctx, idx)
		}
		// A read changes nothing: whatever failed (the leader asked lost
		// its leadership, its answer did not come), it is asked again of
		// the current leader while time is left.
		if errors.Is(err, ErrClosed) {
			return err
		}
		last = err
		if !m.pause(ctx) {
			return m.noQuorum(ctx, "read", last)
		}
	}
}

func (m *Meta) readIndex(ctx context.Context) (uint64, error) {
	addr, id := m.raft.LeaderWithID()
	switch {
	case id == "":
		return 0, ErrNotLeader
	case string(id) == m.cfg.NodeID:
		return m.readIndexLeader(ctx)
	}
	var resp response
	if err := m.pool.pipelined(ctx, string(id), string(addr), typeRead, &request{}, &resp); err != nil {
		return 0, err
	}
	return resp.Index, resp.Err.err()
}

// status says whether this node has Raft state and which leader it
// knows.
func (m *Meta) status() Status {
	st := Status{Node: m.cfg.NodeID, Leader: m.Leader()}
	if f := m.raft.GetConfiguration(); f.Error() == nil {
		st.HasState = len(f.Configuration().Servers) > 0
	}
	return st
}

// slogWriter turns raft's log lines into warnings of the node's log.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Warn("meta: raft: " + strings.TrimSpace(string(p)))
	return len(p), nil
}

var _ io.Writer = slogWriter{}
