package broker

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"cel.dev/cel-go/common/types/ref"

	"github.com/courier-mq/courier/wire"
)

// Request-response strategies.
const (
	Broadcast        = "broadcast"
	RoundRobin       = "round-robin"
	Leader           = "leader"
	LeaderRoundRobin = "leader-round-robin"
	Sticky           = "sticky"
	StickyFun        = "sticky-fun"
	Fun              = "fun"
	LeastBusy        = "least-busy"
)

// Strategies lists every request-response strategy.
var Strategies = []string{Broadcast, RoundRobin, Leader, LeaderRoundRobin, Sticky, StickyFun, Fun, LeastBusy}

// Exchange is a named router with one pattern. Its routing state is an
// immutable view swapped atomically on membership changes, so routing a
// request takes no lock.
type Exchange struct {
	b     *Broker
	name  string
	cfg   wire.ExchangeConfig
	keyFn KeyFunc
	route RouteFunc
	// keyExpr and routeExpr are the compiled expressions of a network
	// declaration; keyFn and route are then nil.
	keyExpr, routeExpr *expr
	// limited counts the evaluations stopped by a limit; limitLogged is
	// when one was last logged (unix ns).
	limited, limitLogged atomic.Int64

	mu      sync.Mutex // guards members, closed, cl, and event order
	members []*Attachment
	closed  bool
	view    atomic.Pointer[view]
	// cl is a request-response exchange's state in a cluster (views
	// from its home node, stand-ins of remote handlers; peer_view.go),
	// made on first use; nil on a node alone.
	cl *clusterEx

	subMu sync.RWMutex // guards subs, cache, nsubs, subsClosed and the subscribers' patterns
	subs  *topicTree
	cache map[string][]*Attachment
	nsubs int
	// subsClosed is set once the exchange is deleted: it takes no more
	// patterns.
	subsClosed bool
	// interest counts the local subscribers of each pattern and peerSubs
	// are the other nodes' aggregated subscriptions, in a cluster only
	// (see peer_pubsub.go); guarded by subMu.
	interest map[string]*localInterest
	peerSubs map[string]*peerSub
	pendMu   sync.Mutex // guards pending, asks, ctrl
	// pending holds subscription requests waiting for a controller, and
	// asks those of other nodes' subscribers; ctrl is the controllers
	// across nodes (see peer_control.go).
	pending map[uint64]*subRequest
	asks    map[uint64]*remoteAsk
	ctrl    controlState

	requests  *Counter // request-response exchanges only, by request id
	publishes atomic.Uint64
	// latency is a request-response exchange's request times; nil for
	// the other patterns.
	latency *Latency

	tq *taskQueue // a task exchange's queue

	// def is a durable request-response or pub-sub exchange's stored
	// definition (def.ID != 0), set before it is added to the broker and
	// never changed.
	def queueDef
}

// view is a snapshot of an exchange's members for routing.
type view struct {
	leader *Attachment
	all    *group
	byTag  map[string]*group
	// fenced is set in a cluster: leader is the home node's appointee,
	// nil while none is valid here, and term its fencing term.
	fenced bool
	term   uint64
}

// group is the handlers of one service tag (or all of them).
type group struct {
	members []*Attachment
	ring    *ring
	next    atomic.Uint64
	// remote is set when members has stand-ins of other nodes' handlers.
	remote bool
	// exprList is members as expressions see them, built once, by the
	// first evaluation that reads it (see group.exprMembers).
	exprOnce sync.Once
	exprList ref.Val
}

func newExchange(b *Broker, name string, spec Spec) (*Exchange, error) {
	cfg := spec.ExchangeConfig
	ex := &Exchange{b: b, name: name, cfg: cfg, keyFn: spec.KeyFunc, route: spec.RouteFunc}
	switch cfg.Pattern {
	case wire.PatternReqResp:
		if cfg.Controlled {
			return nil, wire.Errorf(wire.CodeBadOptions, "exchange %q: only pubsub exchanges can be controlled", name)
		}
		if cfg.Strategy == "" {
			ex.cfg.Strategy = Broadcast
		}
		if err := ex.compileStrategy(); err != nil {
			return nil, err
		}
		ex.latency, ex.requests = &Latency{}, &Counter{}
	case wire.PatternPubSub:
		if cfg.Strategy != "" {
			return nil, wire.Errorf(wire.CodeBadOptions, "exchange %q: pubsub exchanges take no strategy (got %q)", name, cfg.Strategy)
		}
		if cfg.KeyExpr != "" || cfg.RouteExpr != "" || spec.KeyFunc != nil || spec.RouteFunc != nil {
			return nil, wire.Errorf(wire.CodeBadOptions, "exchange %q: pubsub exchanges take no routing functions", name)
		}
		ex.subs = newTopicTree()
		ex.cache = make(map[string][]*Attachment)
		ex.pending = make(map[uint64]*subRequest)
	case wire.PatternTasks:
		if err := checkTaskConfig(name, &ex.cfg, spec); err != nil {
			return nil, err
		}
	case "":
		return nil, wire.Errorf(wire.CodeBadOptions, "exchange %q: pattern missing (reqresp, pubsub or tasks)", name)
	default:
		return nil, wire.Errorf(wire.CodeBadOptions, "exchange %q: unknown pattern %q (reqresp, pubsub or tasks)", name, cfg.Pattern)
	}
	if spec.KeyFunc != nil || spec.RouteFunc != nil {
		// A Go function lives in the process, not in the store: the
		// program that routes with it declares the exchange again.
		ex.cfg.Transient = true
	}
	if cfg.Pattern != wire.PatternTasks && (cfg.MaxAttempts != 0 || cfg.TTLMS != 0 || cfg.BackoffMS != 0 || cfg.BackoffMaxMS != 0 || cfg.DeadLetter != "" ||
		cfg.MaxLength != 0 || cfg.MaxBytes != 0 || cfg.Overflow != "" || cfg.DedupWindowMS != 0 || cfg.Replicas != 0) {
		return nil, wire.Errorf(wire.CodeBadOptions, "exchange %q: max_attempts, ttl_ms, backoff, dead_letter, max_length, max_bytes, overflow, dedup_window_ms and replicas are options of task exchanges", name)
	}
	ex.view.Store(&view{all: &group{}, byTag: map[string]*group{}})
	return ex, nil
}

func (ex *Exchange) compileStrategy() error {
	cfg := ex.cfg
	known := false
	for _, s := range Strategies {
		known = known || s == cfg.Strategy
	}
	if !known {
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: unknown strategy %q (one of %s)", ex.name, cfg.Strategy, strings.Join(Strategies, ", "))
	}
	if cfg.KeyExpr != "" && cfg.Strategy != StickyFun {
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: key_expr needs strategy sticky-fun", ex.name)
	}
	if cfg.RouteExpr != "" && cfg.Strategy != Fun {
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: route_expr needs strategy fun", ex.name)
	}
	switch cfg.Strategy {
	case StickyFun:
		if ex.keyFn != nil {
			return nil
		}
		if cfg.KeyExpr == "" {
			return wire.Errorf(wire.CodeBadOptions, "exchange %q: strategy sticky-fun needs a key expression or function", ex.name)
		}
		e, err := compileExpr(cfg.KeyExpr, ex.b.exprLimits())
		if err != nil {
			return wire.Errorf(wire.CodeBadOptions, "exchange %q: key_expr: %v", ex.name, err)
		}
		ex.keyExpr = e
	case Fun:
		if ex.route != nil {
			return nil
		}
		if cfg.RouteExpr == "" {
			return wire.Errorf(wire.CodeBadOptions, "exchange %q: strategy fun needs a route expression or function", ex.name)
		}
		e, err := compileExpr(cfg.RouteExpr, ex.b.exprLimits())
		if err != nil {
			return wire.Errorf(wire.CodeBadOptions, "exchange %q: route_expr: %v", ex.name, err)
		}
		ex.routeExpr = e
	}
	return nil
}

// matches checks a declaration against this existing exchange.
func (ex *Exchange) matches(spec Spec) error {
	return ex.cfg.Clash(ex.name, spec.ExchangeConfig)
}

// Name returns the exchange's name.
func (ex *Exchange) Name() string { return ex.name }

// Config returns the exchange's configuration.
func (ex *Exchange) Config() wire.ExchangeConfig { return ex.cfg }

// Info returns a snapshot for listings, built from live counters.
func (ex *Exchange) Info() wire.ExchangeInfo {
	ex.mu.Lock()
	members := make([]wire.Member, len(ex.members))
	for i, a := range ex.members {
		members[i] = a.info()
	}
	v := ex.view.Load()
	ex.mu.Unlock()
	info := wire.ExchangeInfo{
		Name: ex.name, Pattern: ex.cfg.Pattern, Strategy: ex.cfg.Strategy,
		KeyExpr: ex.cfg.KeyExpr, RouteExpr: ex.cfg.RouteExpr, Controlled: ex.cfg.Controlled,
		Members: members, Requests: ex.Requests(), Publishes: ex.publishes.Load(),
		Transient: ex.cfg.Transient,
	}
	if v.leader != nil {
		info.Leader = v.leader.member
	}
	if ex.subs != nil {
		ex.subMu.RLock()
		info.Subscribers = ex.nsubs
		ex.subMu.RUnlock()
	}
	if ex.cfg.Pattern == wire.PatternTasks {
		// A replicated queue served on another node has no queue here
		// (replicated.go): its options, without counters.
		c := ex.cfg
		info.MaxAttempts, info.TTLMS, info.DeadLetter = c.MaxAttempts, c.TTLMS, c.DeadLetter
		info.BackoffMS, info.BackoffMaxMS = c.BackoffMS, c.BackoffMaxMS
		info.MaxLength, info.MaxBytes, info.Overflow = c.MaxLength, c.MaxBytes, c.Overflow
		info.DedupWindowMS, info.Replicas = c.DedupWindowMS, c.Replicas
	}
	if ex.tq != nil {
		info.Queue = ex.tq.info()
	}
	return info
}

// isMemberRole reports whether attachments of role join the group that
// elects a leader: handlers on request-response exchanges, controllers on
// pub-sub ones.
func (ex *Exchange) isMemberRole(role uint64) bool {
	switch ex.cfg.Pattern {
	case wire.PatternReqResp:
		return role == wire.RoleHandler
	case wire.PatternTasks:
		return role == wire.RoleWorker
	}
	return role == wire.RoleController
}

// join adds a member and announces it. The new member gets a leader event
// with the whole group; the others get member-up, and everyone gets a new
// leader event if the leader changed.
func (ex *Exchange) join(a *Attachment) error {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.closed {
		return wire.Errorf(wire.CodeNotFound, "exchange %q was deleted", ex.name)
	}
	if a.gone.Load() {
		// Dropped (its session closed) before it could join: drop's leave
		// found nothing to remove, so it must not join now.
		return wire.Errorf(wire.CodeCancelled, "attach: the connection closed")
	}
	if ex.clusterMode() {
		ex.clusterJoin(a)
		return nil
	}
	old := ex.view.Load().leader
	ex.members = append(ex.members, a)
	v := ex.rebuild()
	body := ex.eventBody(v, a)
	for _, m := range ex.members {
		switch {
		case m == a || v.leader != old:
			m.event(wire.EventLeader, body)
		default:
			m.event(wire.EventMemberUp, body)
		}
	}
	return nil
}

// leave removes a member and announces it.
func (ex *Exchange) leave(a *Attachment) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.cl != nil {
		ex.clusterLeave(a)
		return
	}
	i := -1
	for j, m := range ex.members {
		if m == a {
			i = j
		}
	}
	if i < 0 {
		return
	}
	old := ex.view.Load().leader
	ex.members = append(ex.members[:i:i], ex.members[i+1:]...)
	v := ex.rebuild()
	body := ex.eventBody(v, a)
	for _, m := range ex.members {
		m.event(wire.EventMemberDown, body)
		if v.leader != old {
			m.event(wire.EventLeader, body)
		}
	}
	if v.leader != old && v.leader != nil {
		ex.b.log.Info("leader appointed", "exchange", ex.name, "leader", v.leader.member)
	}
}

// rebuild computes and stores a new routing view; ex.mu is held.
func (ex *Exchange) rebuild() *view {
	v := &view{all: &group{members: ex.members}, byTag: make(map[string]*group)}
	if len(ex.members) > 0 {
		v.leader = ex.members[0]
	}
	for _, m := range ex.members {
		remote := m.s.peer != nil
		v.all.remote = v.all.remote || remote
		if m.serviceTag == "" {
			continue
		}
		g := v.byTag[m.serviceTag]
		if g == nil {
			g = &group{}
			v.byTag[m.serviceTag] = g
		}
		g.members = append(g.members, m)
		g.remote = g.remote || remote
	}
	if cl := ex.cl; cl != nil {
		v.leader, v.fenced, v.term = cl.leaderAtt, true, cl.term
	}
	if ex.cfg.Strategy == Sticky || ex.cfg.Strategy == StickyFun {
		v.all.ring = newRing(v.all.members)
		for _, g := range v.byTag {
			g.ring = newRing(g.members)
		}
	}
	ex.view.Store(v)
	return v
}

func (ex *Exchange) eventBody(v *view, changed *Attachment) []byte {
	e := wire.EventBody{Members: make([]wire.Member, len(ex.members))}
	for i, m := range ex.members {
		e.Members[i] = m.info()
	}
	if v.leader != nil {
		e.Leader = v.leader.member
	}
	if changed != nil {
		mi := changed.info()
		e.Member = &mi
	}
	return jsonBody(e)
}

// close detaches everyone after the exchange was deleted.
func (ex *Exchange) close() { ex.closeWith(fmt.Sprintf("exchange %q was deleted", ex.name)) }

// closeWith closes the exchange, telling its members why.
func (ex *Exchange) closeWith(why string) {
	ex.mu.Lock()
	ex.closed = true
	members := ex.members
	ex.members = nil
	if ex.cl != nil {
		ex.releaseOKs(true) // the held ATTACH and DETACH OKs
		ex.cl = nil         // every node deletes it: no view to keep
	}
	ex.rebuild()
	ex.mu.Unlock()
	var subs []*Attachment
	if ex.subs != nil {
		subs = ex.closeSubs()
		var gone []*subRequest
		ex.pendMu.Lock()
		for t, p := range ex.pending {
			delete(ex.pending, t)
			gone = append(gone, p)
		}
		ex.pendMu.Unlock()
		for _, p := range gone {
			ex.unreserve(p)
			p.s.sendError(p.ref, wire.Errorf(wire.CodeExchangeDeleted, "exchange %q was deleted", ex.name))
		}
		ex.closeControl() // peer_control.go
	}
	for _, a := range append(members, subs...) {
		a.s.forget(a)
		a.detached(why)
		if a.role == wire.RoleHandler {
			for _, sl := range a.s.handling.takeAttachment(a) {
				sl.handlerGone(why)
			}
		}
	}
}
