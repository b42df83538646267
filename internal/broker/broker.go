// Package broker routes frames between sessions: it holds the exchanges,
// their attachments and groups, picks handlers by strategy, matches topics,
// appoints leaders and tracks requests in flight.
//
// The broker speaks only in [wire.Frame]s. A session is one client, remote
// (the server turns its socket into frames) or embedded (the node hands
// frames over in-process), and the broker cannot tell them apart: every
// attachment has an address, its session's [Sink], that could as well lead
// to another node.
//
// Lock order: Broker.mu → Exchange.mu → Exchange.subMu → Session.mu, and
// inflight.deliver → the requester's request shard. No lock is held while
// a data frame is sent to a sink, except a broadcast's inflight.deliver,
// which only the responders of that one request share; control frames
// (EVENT, OK, ERROR) may be sent under Exchange.mu, which is why sinks
// never block on them.
package broker

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/wire"
)

// Config configures a Broker.
type Config struct {
	// Node names this broker in connection and member ids and logs; see
	// [ValidNodeName]. Default: a fresh name from [NewNodeName], which a
	// node keeps in its data directory.
	Node string
	// Boot is the node's start count on its data directory, 1 for the
	// first: from 2 on it qualifies connection ids ("n2/c3-7"), so that a
	// node never gives out an id it gave out before a restart. Default: 1.
	Boot uint64
	// Log receives structured logs. Default: slog.Default().
	Log *slog.Logger
	// MaxInflight bounds the requests one session may have in flight as a
	// requester; one more fails with [wire.CodeTooManyInflight].
	// Default: 65536.
	MaxInflight int
	// MaxAttachments bounds the attachments of one session; one more
	// fails with [wire.CodeTooManyAttachments]. Default: 4096.
	MaxAttachments int
	// MaxPatternsPerAttachment bounds the distinct subscription patterns
	// of one subscriber, a durable subscription's included; a SUBSCRIBE
	// or ATTACH past it fails as a whole with [wire.CodeTooManyPatterns].
	// Default: 1000.
	MaxPatternsPerAttachment int
	// MaxPatternsPerConnection bounds the subscription patterns of one
	// session's subscribers together, those asked of a controller and
	// not yet decided included; past it as above. Default: 10000.
	MaxPatternsPerConnection int
	// MaxDurableSubscriptions bounds the durable subscriptions of the
	// broker, those of every pub-sub exchange together; an ATTACH that
	// would create one more fails with [wire.CodeLimit]. Those brought
	// back from the store count but are never refused. Default: 10000.
	MaxDurableSubscriptions int
	// MaxPatternsPerPeer bounds the subscription patterns another node of
	// the cluster may have installed here for one exchange (its
	// aggregated interest). Past it, that node's interest in the exchange
	// becomes '#': every publication of the exchange goes to it, and it
	// fans out to its own subscribers only, until its link comes up
	// again (docs/cluster.md). Default: 65536.
	MaxPatternsPerPeer int
	// MaxDeadline bounds a request's deadline. A request asking for more
	// fails with [wire.CodeDeadlineTooLong]; one with no deadline gets
	// this one. Default: 0, no maximum.
	MaxDeadline time.Duration
	// ExprCost bounds the cost of one evaluation of a key or route
	// expression, in CEL's cost units; past it the request fails with
	// [wire.CodeExprLimit], and an expression whose estimated cost is
	// over it is refused at declare. It bounds what an evaluation
	// allocates too: at most about 25 bytes per unit (measured, see
	// expr.go), so about 1 MiB at the default. Default: 40,000
	// ([DefaultExprCost]).
	ExprCost uint64
	// ExprTime bounds the time of one evaluation of an expression with
	// comprehensions (and never past the request's deadline); past it the
	// request fails with [wire.CodeExprLimit]. Default: 10ms.
	ExprTime time.Duration
	// ExprSlots bounds the costly evaluations (loops, patterns) running at
	// once in the node; one more waits for a slot, at most 1s or its
	// request's deadline, then fails with [wire.CodeExprLimit]. The wait
	// is fair between users (sessions without a user count as one each):
	// at most ExprSlots evaluations of one user hold a slot or wait in
	// line for one, its others wait behind them. Default: GOMAXPROCS - 1,
	// at least 1, which leaves a core to everything else.
	ExprSlots int
	// Supervised, when set, makes New start no goroutine: the caller runs
	// [Broker.Sweep] itself, under a supervisor. Default: false.
	Supervised bool
	// Memory is the node's memory budget, shared by its queues: they page
	// out to disk as it fills, and their publishers are slowed past it.
	// Default: nil, no budget (everything stays in RAM).
	Memory *queue.Memory
	// Policy answers, after a restart, what the declarers of durable task
	// exchanges may do: their dead letters go to their dead_letter
	// exchange only while the declarer may write to it (see [Declarer]).
	// The node's users. Default: nil, under which the dead letters of a
	// task exchange declared by a user, brought back from the store, are
	// dropped; those of trusted declarers are not checked.
	Policy auth.Policy
	// Home names, in a cluster, the home node of a request-response
	// exchange, which owns its member list and appoints its leader, and
	// that assignment's epoch, which must grow each time the exchange's
	// home changes (docs/cluster.md). The metadata group answers it.
	// Default: this node, epoch 0, for every exchange.
	Home func(exchange string) (node string, epoch uint64)
	// LeaseValid reports whether this node's liveness lease holds; while
	// it does not, the node treats no leader as valid and appoints none.
	// Default: always true.
	LeaseValid func() bool
}

func (c *Config) setDefaults() {
	if c.Node == "" {
		c.Node = NewNodeName()
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.MaxInflight <= 0 {
		c.MaxInflight = 65536
	}
	if c.MaxAttachments <= 0 {
		c.MaxAttachments = 4096
	}
	if c.MaxPatternsPerAttachment <= 0 {
		c.MaxPatternsPerAttachment = 1000
	}
	if c.MaxPatternsPerConnection <= 0 {
		c.MaxPatternsPerConnection = 10000
	}
	if c.MaxDurableSubscriptions <= 0 {
		c.MaxDurableSubscriptions = 10000
	}
	if c.MaxPatternsPerPeer <= 0 {
		c.MaxPatternsPerPeer = 65536
	}
	if c.MaxDeadline < 0 {
		c.MaxDeadline = 0
	}
	if c.ExprCost == 0 {
		c.ExprCost = DefaultExprCost
	}
	if c.ExprTime <= 0 {
		c.ExprTime = DefaultExprTime
	}
	if c.ExprSlots <= 0 {
		c.ExprSlots = max(1, runtime.GOMAXPROCS(0)-1)
	}
}

// maxSlotWait bounds the wait of a costly evaluation for a slot.
const maxSlotWait = time.Second

// slotOwner is who a costly evaluation counts against in the fair share
// of the evaluation slots: its session's user, or, for a session without
// one (a node without users, an embedded client), the session itself.
type slotOwner struct {
	user    string
	session uint64
}

// slotOwner returns the owner of the session's evaluations.
func (s *Session) slotOwner() slotOwner {
	if s.user != "" {
		return slotOwner{user: s.user}
	}
	return slotOwner{session: s.n}
}

// slotShare is one owner's share of the evaluation slots: a token per
// evaluation of its that holds a slot or waits for one, at most
// ExprSlots. Its other evaluations wait for a token, in turn, so that
// they queue behind each other rather than in front of other owners'.
type slotShare struct {
	tokens chan struct{}
	refs   int // evaluations holding or waiting for a token; Broker.shareMu
}

// share returns owner's share of the slots, counting one more user of it.
func (b *Broker) share(owner slotOwner) *slotShare {
	b.shareMu.Lock()
	defer b.shareMu.Unlock()
	sh := b.shares[owner]
	if sh == nil {
		sh = &slotShare{tokens: make(chan struct{}, b.cfg.ExprSlots)}
		b.shares[owner] = sh
	}
	sh.refs++
	return sh
}

// unshare counts one user of owner's share less, and forgets the share
// once it has none, so that the map holds only owners with evaluations
// running or waiting.
func (b *Broker) unshare(owner slotOwner, sh *slotShare) {
	b.shareMu.Lock()
	defer b.shareMu.Unlock()
	if sh.refs--; sh.refs == 0 {
		delete(b.shares, owner)
	}
}

// takeSlot takes an evaluation slot for a costly expression of owner,
// waiting at most left (the request's deadline; 0: none) or maxSlotWait
// in all. It first takes a token of owner's share, then a slot: slots
// and tokens are taken in turn (a goroutine blocked on a channel send
// waits in line), and an owner's evaluations in line for a slot are never
// more than the slots, so that another owner's evaluation waits behind at
// most one per slot of each owner. It returns the share to give back.
func (b *Broker) takeSlot(owner slotOwner, left time.Duration) (*slotShare, *exprLimitError) {
	wait := b.slotWait
	if left != 0 && left < wait {
		wait = left
	}
	var timer *time.Timer // made on the first wait
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	take := func(ch chan struct{}) bool {
		select {
		case ch <- struct{}{}:
			return true
		default:
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		b.slotWaiters.Add(1)
		defer b.slotWaiters.Add(-1)
		select {
		case ch <- struct{}{}:
			return true
		case <-timer.C:
			return false
		}
	}
	sh := b.share(owner)
	if take(sh.tokens) {
		if take(b.exprSlots) {
			if testHookSlotTaken != nil {
				testHookSlotTaken(owner)
			}
			return sh, nil
		}
		<-sh.tokens
	}
	b.unshare(owner, sh)
	return nil, &exprLimitError{fmt.Sprintf("found no evaluation slot free within %s: the node is busy with other costly expressions", wait.Round(time.Millisecond))}
}

// giveSlot gives back a slot, and the token of sh, takeSlot took.
func (b *Broker) giveSlot(owner slotOwner, sh *slotShare) {
	<-b.exprSlots
	<-sh.tokens
	b.unshare(owner, sh)
}

// testHookSlotTaken, set only by tests, runs once an evaluation of owner
// holds a slot.
var testHookSlotTaken func(owner slotOwner)

// exprLimits returns the budgets of an expression's evaluation.
func (b *Broker) exprLimits() exprLimits {
	return exprLimits{cost: b.cfg.ExprCost, time: b.cfg.ExprTime}
}

// Sink delivers frames to a session's peer. Deliver takes ownership of f.
// It is called from many goroutines. It must not block for EVENT,
// SUBREQUEST, OK and ERROR frames, and may block only briefly (bounded
// backpressure) for data frames. After the session closes, it drops frames.
type Sink interface {
	Deliver(f *wire.Frame)
}

// Broker is the routing core of one node. It is safe for concurrent use.
type Broker struct {
	cfg Config
	log *slog.Logger

	// exchanges maps names to *Exchange; reads take no lock, writes hold mu.
	exchanges sync.Map
	// exVersion moves on with every exchange declared or deleted, so that
	// a reader can tell its snapshot of the set is still whole.
	exVersion atomic.Uint64
	// exCount is the last count of exchanges and the exVersion it is of
	// (count.go).
	exCount atomic.Pointer[exchangeCount]

	mu       sync.RWMutex           // guards members, sessions, and exchange writes
	members  map[string]*Attachment // by member id
	sessions map[uint64]*Session

	// queues maps queue names to *taskQueue; qmu serializes their
	// creation and deletion.
	queues sync.Map
	qmu    sync.Mutex
	// durableSubs counts the durable subscriptions among queues.
	durableSubs atomic.Int64
	// qVersion moves on after every queue added to or removed from
	// queues (see [Broker.QueueVersion]).
	qVersion atomic.Uint64
	sched    *queue.Scheduler
	dur      *durability // nil without a store

	// patterns, patternNodes, patternMapped and patternText count the
	// subscription patterns of every exchange, their topic trees' nodes,
	// those of the nodes in maps, and the bytes of the patterns' text
	// (see PatternStats).
	patterns, patternNodes, patternMapped, patternText atomic.Int64

	nextSession atomic.Uint64
	nextSubReq  atomic.Uint64
	// ps is pub-sub across nodes (see peer_pubsub.go).
	ps pubsubCluster
	// draining is set by [Broker.Drain]: new requests are refused.
	draining atomic.Bool
	// maxDeadlineMS is Config.MaxDeadline in ms; 0 for none.
	maxDeadlineMS uint64
	// exprSlots holds a token per costly evaluation running.
	exprSlots chan struct{}
	// shares are the owners' shares of the slots (see takeSlot).
	shareMu sync.Mutex
	shares  map[slotOwner]*slotShare
	// slotWaiters counts the evaluations waiting for a token or a slot.
	slotWaiters atomic.Int64
	// slotWait is maxSlotWait; tests lengthen it.
	slotWait time.Duration

	// peers are the other nodes of the cluster whose links are up, and
	// peerLinks the links to them (see peer.go); both empty on a node
	// alone.
	peers     peerTable
	peerLinks atomic.Pointer[Peers]
	// fwd holds the submits forwarded to other nodes (forward.go).
	fwd forwardTable
	// linkWorkers holds the workers forwarded to other nodes
	// (forward_worker.go), by link id.
	linkWorkers linkWorkers
	// cat is the cluster's catalog of declarations; nil alone.
	cat atomic.Pointer[Catalog]
	// repl answers where the cluster's replicated queues are served;
	// nil alone (replicated.go).
	repl atomic.Pointer[Replicated]
	// rr is the state of request-response across nodes (peer_view.go).
	rr rrCluster

	closeOnce sync.Once
	stop      chan struct{}
	stopped   chan struct{}
}

// New returns a broker with no exchanges.
func New(cfg Config) *Broker {
	cfg.setDefaults()
	b := &Broker{
		cfg:           cfg,
		log:           cfg.Log,
		members:       make(map[string]*Attachment),
		sessions:      make(map[uint64]*Session),
		maxDeadlineMS: uint64(cfg.MaxDeadline / time.Millisecond),
		exprSlots:     make(chan struct{}, cfg.ExprSlots),
		shares:        make(map[slotOwner]*slotShare),
		slotWait:      maxSlotWait,
		stop:          make(chan struct{}),
		stopped:       make(chan struct{}),
		sched:         queue.NewScheduler(queue.SchedulerOptions{}),
	}
	if cfg.Supervised {
		close(b.stopped)
	} else {
		go func() {
			defer close(b.stopped)
			b.Sweep(context.Background())
		}()
	}
	return b
}

// sweepEvery is how often requests past their deadline are expired.
const sweepEvery = 100 * time.Millisecond

// Sweep expires requests whose deadline passed, until ctx ends or the
// broker closes; it then returns nil. New runs it unless
// Config.Supervised is set.
func (b *Broker) Sweep(ctx context.Context) error {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	var list []*Session
	for {
		select {
		case <-b.stop:
			return nil
		case <-ctx.Done():
			return nil
		case <-t.C:
			now := monoNow()
			b.mu.RLock()
			list = list[:0]
			for _, s := range b.sessions {
				if s.Inflight() > 0 {
					list = append(list, s)
				}
			}
			b.mu.RUnlock()
			for _, s := range list {
				s.expire(now)
			}
			b.checkLease()
		}
	}
}

// Drain makes the broker refuse new requests, from every session, with
// [wire.CodeShutdown]; requests already in flight go on. See
// [Broker.Busy].
func (b *Broker) Drain() { b.draining.Store(true) }

// Busy returns the number of requests in flight in the broker: those
// registered and not yet answered, and answers taken from the table but
// not yet handed to the requester's sink. After [Broker.Drain], once Busy
// returns 0 every answer is with its requester's transport.
func (b *Broker) Busy() int64 {
	b.mu.RLock()
	defer b.mu.RUnlock()
	// Requests first, answers in delivery second: an answer is counted in
	// delivery before its request leaves the table, so one missed by the
	// first pass is seen by the second.
	var n int64
	for _, s := range b.sessions {
		n += s.Inflight()
	}
	for _, s := range b.sessions {
		n += s.answering.Load()
	}
	return n
}

// Close stops the broker's background work, takes a last checkpoint of
// the durable queues and closes the store. Sessions stay usable, but task
// queues stop.
func (b *Broker) Close() error {
	var err error
	b.closeOnce.Do(func() {
		close(b.stop)
		<-b.stopped
		b.StopQueues()
		b.sched.Close()
		if b.dur != nil {
			err = b.dur.close()
		}
	})
	return err
}

// StopQueues stops every task queue: no more deliveries, timers or
// settles. A node shutting down calls it before it closes its
// connections, so that the tasks its workers hold are kept as they were
// (ready again at restart) rather than failed by their workers going
// away.
func (b *Broker) StopQueues() {
	b.queues.Range(func(_, v any) bool {
		v.(*taskQueue).q.Close()
		return true
	})
}

// Memory returns the node's memory budget, or nil.
func (b *Broker) Memory() *queue.Memory { return b.cfg.Memory }

// Node returns the node name.
func (b *Broker) Node() string { return b.cfg.Node }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_\-:]+(\.[A-Za-z0-9_\-:]+)*$`)

// ValidName reports whether name can name an exchange: dot-separated words
// of letters, digits, '_', '-' and ':', at most 255 bytes.
func ValidName(name string) bool {
	return len(name) <= 255 && nameRE.MatchString(name)
}

// Spec is an exchange's full configuration: the wire config plus, for
// embedded use, Go functions in place of expressions.
type Spec = courier.ExchangeSpec

// Declare creates the exchange name, or checks that the existing one
// matches spec. Fields left empty in spec match anything. The declarer
// is trusted; see [Broker.DeclareAs].
func (b *Broker) Declare(name string, spec Spec) (*Exchange, error) {
	return b.declare(name, spec, Trusted(), nil, nil)
}

// DeclareAs is [Broker.Declare] on behalf of by: a task exchange with a
// dead_letter is created only if by may write to that exchange, and
// keeps by as its declarer (see [Declarer]). The management API declares
// as the user of the request.
func (b *Broker) DeclareAs(name string, spec Spec, by Declarer) (*Exchange, error) {
	return b.declare(name, spec, by, nil, nil)
}

// declare is DeclareAs; rq, if not nil, is a task exchange's queue being
// brought back from the store at restart, whose declarer its definition
// holds; vet, if not nil, may refuse a new exchange before it is added.
// In a cluster, a new exchange is declared through the catalog, which
// declares it on every node (see catalog.go).
func (b *Broker) declare(name string, spec Spec, by Declarer, rq *recoveredQueue, vet func(*Exchange) error) (*Exchange, error) {
	if c := b.catalog(); c != nil && rq == nil {
		return b.declareCluster(c, name, spec, by, vet)
	}
	if rq == nil && spec.Pattern == wire.PatternTasks {
		// A node alone holds every queue on itself: one replica, which
		// is what the queue's Replicas 0 means here.
		if spec.Replicas > 1 {
			return nil, wire.Errorf(wire.CodeBadOptions, "exchange %q: replicas %d needs a cluster of at least %d nodes; this node is alone", name, spec.Replicas, spec.Replicas)
		}
		spec.Replicas = 0
	}
	return b.declareHere(name, spec, by, rq, vet)
}

// declareHere declares the exchange in this broker only.
func (b *Broker) declareHere(name string, spec Spec, by Declarer, rq *recoveredQueue, vet func(*Exchange) error) (*Exchange, error) {
	if !ValidName(name) {
		return nil, wire.Errorf(wire.CodeBadOptions, "invalid exchange name %q: use dot-separated words of letters, digits, '_', '-', ':'", name)
	}
	if rq == nil {
		// Definitions brought back were checked when they were declared,
		// by the version of the day; their durations are capped instead
		// (queueConfig), so that a store stays readable.
		if err := spec.ExchangeConfig.Check(); err != nil {
			return nil, wire.Errorf(wire.CodeBadOptions, "exchange %q: %v", name, err)
		}
	}
	if ex := b.Exchange(name); ex != nil {
		err := ex.matches(spec)
		if err == nil && rq == nil {
			ex.adopt(spec, by)
		}
		return ex, err
	}
	if spec.Passive {
		return nil, wire.Errorf(wire.CodeNotFound, "exchange %q not found", name)
	}
	ex, err := newExchange(b, name, spec)
	if err != nil {
		return nil, err
	}
	if vet != nil {
		if err := vet(ex); err != nil {
			return nil, err
		}
	}
	if ex.cfg.Pattern == wire.PatternTasks {
		if rq == nil {
			if err := b.checkDeadLetter(name, ex.cfg, by); err != nil {
				return nil, err
			}
		}
		return b.declareTasks(ex, spec, by, rq)
	}
	return b.declareRouter(ex, spec, by, rq)
}

// declareRouter adds a request-response or pub-sub exchange, its
// definition stored first unless it is transient or the broker has no
// store; rq, if not nil, is its definition brought back at restart.
// b.qmu orders it with the other declarations, so that a definition is
// recorded only for the exchange that is added.
func (b *Broker) declareRouter(ex *Exchange, spec Spec, by Declarer, rq *recoveredQueue) (*Exchange, error) {
	b.qmu.Lock()
	if old := b.Exchange(ex.name); old != nil {
		b.qmu.Unlock()
		return old, old.matches(spec)
	}
	stored := false
	store := func() {
		b.declareHeld(ex, func() bool { // peer_pubsub.go
			b.mu.Lock()
			defer b.mu.Unlock()
			if _, loaded := b.exchanges.LoadOrStore(ex.name, ex); loaded {
				return false
			}
			b.exVersion.Add(1)
			stored = true
			return true
		})
	}
	wait := func() error { return nil }
	switch {
	case rq != nil:
		ex.def = rq.def
		store()
	case b.catalog() != nil:
		// The cluster's catalog keeps the definition.
		store()
	case b.dur != nil && !ex.cfg.Transient:
		ex.def = queueDef{ID: b.dur.newID(), Name: ex.name, Exchange: ex.name, Config: ex.cfg,
			DeclaredBy: by.User, Trusted: by.Policy == nil, ExchangeOnly: true}
		wait = b.defineQueue(ex.def, store)
	default:
		store()
	}
	b.qmu.Unlock()
	err := wait()
	if !stored {
		if ex.def.ID != 0 && err == nil {
			b.undefineQueue(ex.def.ID, func() {})
		}
		if old := b.Exchange(ex.name); old != nil && err == nil {
			return old, old.matches(spec)
		}
		return nil, err
	}
	if err != nil {
		return ex, err
	}
	if rq == nil {
		b.log.Info("exchange declared", "exchange", ex.name, "pattern", ex.cfg.Pattern, "strategy", ex.cfg.Strategy, "durable", ex.def.ID != 0)
	}
	b.pubsubDeclared(ex) // peer_pubsub.go
	b.clusterDeclared(ex)
	return ex, nil
}

// Exchange returns the exchange name, or nil.
func (b *Broker) Exchange(name string) *Exchange {
	if ex, ok := b.exchanges.Load(name); ok {
		return ex.(*Exchange)
	}
	return nil
}

func (b *Broker) lookup(name string) (*Exchange, error) {
	if ex := b.Exchange(name); ex != nil {
		return ex, nil
	}
	if err := b.notServedHere(name); err != nil {
		return nil, err
	}
	return nil, wire.Errorf(wire.CodeNotFound, "exchange %q not found", name)
}

// Delete removes an exchange; its attachments receive EVENT detached. In
// a cluster, it is deleted through the catalog, on every node.
func (b *Broker) Delete(name string) error {
	if c := b.catalog(); c != nil {
		return b.deleteCluster(c, name)
	}
	return b.deleteHere(name)
}

// deleteHere removes the exchange from this broker only.
func (b *Broker) deleteHere(name string) error {
	b.mu.Lock()
	v, ok := b.exchanges.LoadAndDelete(name)
	if ok {
		b.exVersion.Add(1)
	}
	b.mu.Unlock()
	if !ok {
		return wire.Errorf(wire.CodeNotFound, "exchange %q not found", name)
	}
	ex := v.(*Exchange)
	if ex.def.ID != 0 {
		// Out of the broker's exchanges first: a checkpoint taken before
		// the record below no longer holds the definition.
		b.undefineQueue(ex.def.ID, func() {})
	}
	ex.close()
	if ex.tq != nil {
		b.dropQueue(ex.tq, fmt.Sprintf("exchange %q was deleted", name))
	}
	if ex.subs != nil {
		b.dropSubscriptions(ex)
	}
	b.log.Info("exchange deleted", "exchange", name)
	return nil
}

// Exchanges returns a snapshot of every exchange, sorted by name.
func (b *Broker) Exchanges() []wire.ExchangeInfo {
	var list []*Exchange
	b.exchanges.Range(func(_, v any) bool {
		list = append(list, v.(*Exchange))
		return true
	})
	infos := make([]wire.ExchangeInfo, len(list))
	for i, ex := range list {
		infos[i] = ex.Info()
	}
	slices.SortFunc(infos, func(a, b wire.ExchangeInfo) int { return cmp.Compare(a.Name, b.Name) })
	return infos
}

// SessionCount returns the number of open sessions of clients (other
// nodes' sessions left out).
func (b *Broker) SessionCount() int {
	b.mu.RLock()
	n := len(b.sessions)
	b.mu.RUnlock()
	// Other nodes' sessions are not clients.
	b.peers.mu.RLock()
	n -= len(b.peers.nodes)
	b.peers.mu.RUnlock()
	return max(n, 0)
}

func (b *Broker) member(id string) *Attachment {
	b.mu.RLock()
	a := b.members[id]
	b.mu.RUnlock()
	return a
}

// Open starts a session whose frames go to sink. name appears in logs; the
// session's id (such as "n1/c7", see [NodeOf]) prefixes the member ids of
// its attachments ("n1/c7.2").
//
// The session may do anything; see [Broker.OpenAs] for a user's session.
func (b *Broker) Open(sink Sink, name string) *Session {
	s := b.open(sink, name)
	b.register(s)
	return s
}

func (b *Broker) open(sink Sink, name string) *Session {
	n := b.nextSession.Add(1)
	return &Session{
		b:           b,
		n:           n,
		id:          connID(b.cfg.Node, b.cfg.Boot, n),
		name:        name,
		sink:        sink,
		attachments: make(map[uint32]*Attachment),
	}
}

// register makes s visible to the broker's listings and sweeps.
func (b *Broker) register(s *Session) {
	b.mu.Lock()
	b.sessions[s.n] = s
	b.mu.Unlock()
}

func jsonBody(v any) []byte {
	p, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("broker: marshal %T: %v", v, err))
	}
	return p
}
