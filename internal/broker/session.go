package broker

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/wire"
)

// Session is one client of the broker, remote or embedded. Frames from the
// client go to [Session.Handle]; frames to it go to its Sink.
type Session struct {
	b    *Broker
	n    uint64
	id   string
	name string
	sink Sink
	// user and policy are fixed at open; with a nil policy nothing is
	// checked (see access.go).
	user   string
	policy auth.Policy
	grants atomic.Pointer[grants]
	// peer is set on the session of another node of the cluster (see
	// peer.go); nil for a client's.
	peer *peer

	mu          sync.Mutex // guards attachments, closed, watches, fwdWorkers
	attachments map[uint32]*Attachment
	closed      bool
	watches     map[uint64]func() // WATCHes by ref: their cancel funcs
	// fwdWorkers are its workers attached to replicated queues that
	// other nodes serve (forward_worker.go), by attachment id.
	fwdWorkers map[uint32]*fwdWorker

	lastQueue atomic.Pointer[taskQueue] // the queue of its last SUBMIT, for flow control

	// patterns counts its subscribers' patterns, and those they asked of
	// a controller and wait for, against MaxPatternsPerConnection.
	patterns atomic.Int64

	requests requestTable // requests this session made, by its ids
	handling slotTable    // requests delivered to this session's handlers
	// answering counts final responses of this session's handlers taken
	// from their requester's table and not yet delivered (see
	// [Broker.Busy]).
	answering atomic.Int64
	// expiring is set while the timeouts of this session's expired
	// requests are being delivered (see [Session.expire]).
	expiring atomic.Bool

	stats SessionStats
}

// SessionStats are live counters of a session. Requests and Delivered
// are striped by request id: an embedded session's requesters and its
// handlers' requesters add to them from many cores at once.
type SessionStats struct {
	Requests  Counter       // requests made
	Responses atomic.Uint64 // responses sent as a handler
	Publishes atomic.Uint64
	Delivered Counter // messages and requests delivered to it
}

// ID returns the session id, such as "n1/c7"; see [Broker.Open].
func (s *Session) ID() string { return s.id }

// Name returns the client name given at Open.
func (s *Session) Name() string { return s.name }

// Stats returns the session's live counters.
func (s *Session) Stats() *SessionStats { return &s.stats }

// Attachments returns the number of attachments.
func (s *Session) Attachments() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.attachments)
}

// Attachment is a session's tie to an exchange in one role.
type Attachment struct {
	s          *Session
	id         uint32
	member     string
	ex         *Exchange
	role       uint64
	serviceTag string
	connTag    string
	options    map[string]string
	patterns   []string // subscriber patterns, guarded by ex.subMu
	// reserved counts the patterns of its subscription requests waiting
	// for a controller, guarded by ex.subMu (see Exchange.reserve).
	reserved int
	gone     atomic.Bool
	// busy counts the requests the handler is serving, for the least-busy
	// strategy only (countBusy): other exchanges spare the shared write.
	busy      atomic.Int64
	countBusy bool
	// reported is, on a stand-in of another node's handler (its session
	// is a peer's), the requests that node last said the handler serves
	// (see peerResponse).
	reported atomic.Int64
	// node is the member's node in a cluster ("" on a node alone); key
	// its seniority in the exchange's view (see clusterEx), guarded by
	// ex.mu.
	node string
	key  int64
	// inView is the version of the first view of its home that listed
	// this local member, 0 before; guarded by ex.mu.
	inView uint64
	// stripe is the stripe of the exchange's latency histogram that the
	// handler's answers are recorded in.
	stripe uint32

	// A worker's, or a durable subscriber's, queue and consumer. tmu is
	// held while the consumer is being added, so that a settle racing
	// with the attach waits for it.
	tq       *taskQueue
	tmu      sync.Mutex
	consumer atomic.Pointer[queue.Consumer]
	// bound is how many patterns of its durable subscription's binding a
	// durable subscriber counts against its session (see chargeBound);
	// guarded by tq.attachMu once it is a consumer.
	bound int
}

func (a *Attachment) info() wire.Member {
	return wire.Member{ID: a.member, Role: wire.RoleName(a.role), ServiceTag: a.serviceTag, ConnTag: a.connTag, Options: a.options, Node: a.node}
}

func (a *Attachment) event(kind uint64, body []byte) {
	f := wire.NewFrame(wire.TypeEvent)
	f.Attach, f.Aux, f.Name, f.Body = a.id, kind, a.ex.name, body
	a.s.sink.Deliver(f)
}

func (a *Attachment) detached(reason string) {
	if a.gone.Swap(true) {
		return
	}
	a.sendDetached(reason)
}

// sendDetached tells the client its attachment is gone.
func (a *Attachment) sendDetached(reason string) {
	if a.s.peer != nil && (a.tq == nil || a.role != wire.RoleWorker) {
		return // a stand-in: its node tells its own members
	}
	// A client's, or a worker forwarded from another node: that node
	// attaches it again where the queue is served next.
	f := wire.NewFrame(wire.TypeEvent)
	f.Attach, f.Aux, f.Name, f.Tag = a.id, wire.EventDetached, a.ex.name, reason
	a.s.sink.Deliver(f)
}

// Handle processes one frame from the client and takes ownership of it.
// Replies and errors go to the session's sink. Frames of one session may
// be handled concurrently (an embedded client has many goroutines); the
// order of frames handled by one goroutine is kept.
func (s *Session) Handle(f *wire.Frame) {
	switch f.Type {
	case wire.TypeRequest:
		s.request(f)
	case wire.TypeResponse:
		s.respond(f)
	case wire.TypePublish:
		s.publish(f)
	case wire.TypeCancel:
		switch {
		case s.peer != nil && f.Name != "":
			// Over a node link, a CANCEL naming a queue ends a
			// forwarded watch (forward_watch.go); one without, a
			// forwarded request: their Refs are of different tables.
			s.unwatch(f.Ref)
		case s.peer != nil:
			s.cancel(f.Ref)
		case !s.unwatch(f.Ref):
			s.cancel(f.Ref)
		}
		f.Release()
	case wire.TypeAsk:
		s.ask(f)
	case wire.TypeAnswer:
		s.answer(f)
	case wire.TypeDeclare:
		body, err := s.declare(f)
		s.reply(f.Ref, body, err)
	case wire.TypeDelete:
		s.reply(f.Ref, nil, s.delete(f.Name, f.Aux == 1))
	case wire.TypeList:
		s.reply(f.Ref, jsonBody(s.exchanges()), nil)
	case wire.TypeAttach:
		s.attach(f)
	case wire.TypeDetach:
		ref := f.Ref
		if w := s.forwardedWorker(f.Attach); w != nil {
			f.Release()
			w.close()
			s.reply(ref, nil, nil)
			return
		}
		if err := s.detach(f.Attach, func() { s.reply(ref, nil, nil) }); err != nil {
			s.reply(ref, nil, err)
		}
	case wire.TypeSubscribe, wire.TypeUnsubscribe:
		s.subscribe(f)
	case wire.TypeDecision:
		s.decide(f)
	case wire.TypeSubmit:
		s.submit(f)
	case wire.TypeAck, wire.TypeNack, wire.TypeProgress:
		if w := s.forwardedWorker(f.Attach); w != nil {
			w.settleForwarded(f)
			return
		}
		s.settle(f)
	case wire.TypeWatch:
		s.watchTask(f)
	default:
		s.sendError(f.Ref, wire.Errorf(wire.CodeProtocol, "unexpected %s frame from a client", f.Type))
	}
}

func (s *Session) reply(ref uint64, body []byte, err error) {
	if err != nil {
		s.sendError(ref, err)
		return
	}
	ok := wire.NewFrame(wire.TypeOK)
	ok.Ref, ok.Body = ref, body
	s.sink.Deliver(ok)
}

func (s *Session) sendError(ref uint64, err error) {
	e := asWireError(err)
	f := wire.NewFrame(wire.TypeError)
	f.Ref, f.Aux, f.Tag = ref, uint64(e.Code), e.Msg
	s.sink.Deliver(f)
}

func asWireError(err error) *wire.Error {
	if e, ok := err.(*wire.Error); ok {
		return e
	}
	return &wire.Error{Code: wire.CodeInternal, Msg: err.Error()}
}

func (s *Session) declare(f *wire.Frame) ([]byte, error) {
	var spec Spec
	if len(f.Body) > 0 {
		if err := json.Unmarshal(f.Body, &spec.ExchangeConfig); err != nil {
			return nil, wire.Errorf(wire.CodeBadOptions, "declare %q: bad config: %v", f.Name, err)
		}
	}
	spec.Passive = f.Aux == 1
	if err := s.checkDeclare(f.Name, &spec); err != nil {
		return nil, err
	}
	ex, err := s.b.declare(f.Name, spec, s.declarer(), nil, s.vetRedirects)
	if err != nil {
		return nil, err
	}
	return jsonBody(ex.Info()), nil
}

// vetRedirects refuses a new exchange whose route expression redirects,
// in so many words, to an exchange the session may not write to. A
// redirect the expression computes, or a Go routing function's, is
// checked when a request takes it (see request).
func (s *Session) vetRedirects(ex *Exchange) error {
	if s.policy == nil || ex.routeExpr == nil {
		return nil
	}
	for _, to := range ex.routeExpr.redirects {
		if !s.allowed(auth.Write, to) {
			return s.deny("declare "+ex.name+", which redirects to it", auth.Write, to)
		}
	}
	return nil
}

// checkDeclare lets a DECLARE through with the configure permission. A
// session with only read or write permission on the exchange may still
// declare it when it exists (to open it, as [courier.Conn.ReqResp] does):
// the declare turns passive, so that it can never create it. Creating a
// task exchange with a dead_letter also needs write permission on the
// dead_letter exchange; the broker checks it again (checkDeadLetter),
// this check is for the session's log of refusals.
func (s *Session) checkDeclare(name string, spec *Spec) error {
	configure, any := s.mayConfigure(name)
	switch {
	case configure:
		if dl := spec.DeadLetter; dl != "" && !spec.Passive && spec.Pattern == wire.PatternTasks &&
			!s.allowed(auth.Write, dl) && s.b.Exchange(name) == nil {
			return s.deny("declare "+name+" with dead_letter", auth.Write, dl)
		}
		return nil
	case any && (spec.Passive || s.b.Exchange(name) != nil):
		spec.Passive = true
		return nil
	}
	return s.deny("declare", auth.Configure, name)
}

// delete deletes an exchange, or a queue, with the configure permission
// on its name.
func (s *Session) delete(name string, queue bool) error {
	if configure, _ := s.mayConfigure(name); !configure {
		return s.deny("delete", auth.Configure, name)
	}
	if queue {
		return s.b.DeleteQueue(name)
	}
	return s.b.Delete(name)
}

// exchanges lists the exchanges; a checked session sees only those it has
// some permission on.
func (s *Session) exchanges() []wire.ExchangeInfo {
	list := s.b.Exchanges()
	if s.policy == nil {
		return list
	}
	return slices.DeleteFunc(list, func(e wire.ExchangeInfo) bool { return s.policy.Perms(s.user, e.Name) == 0 })
}

// DeclareFuncs declares an exchange whose routing functions are Go funcs.
// Only embedded clients can call it.
func (s *Session) DeclareFuncs(name string, spec Spec) (wire.ExchangeInfo, error) {
	if err := s.checkDeclare(name, &spec); err != nil {
		return wire.ExchangeInfo{}, err
	}
	ex, err := s.b.declare(name, spec, s.declarer(), nil, s.vetRedirects)
	if err != nil {
		return wire.ExchangeInfo{}, err
	}
	return ex.Info(), nil
}

func (s *Session) attach(f *wire.Frame) {
	defer f.Release()
	var spec wire.AttachSpec
	if len(f.Body) > 0 {
		if err := json.Unmarshal(f.Body, &spec); err != nil {
			s.sendError(f.Ref, wire.Errorf(wire.CodeBadOptions, "attach: bad body: %v", err))
			return
		}
	}
	if need := attachNeeds(f.Aux); !s.allowed(need, f.Name) {
		s.sendError(f.Ref, s.deny("attach as "+wire.RoleName(f.Aux), need, f.Name))
		return
	}
	ex, err := s.b.lookup(f.Name)
	if err != nil && s.peer == nil && f.Aux == wire.RoleWorker {
		// A replicated queue led by another node: the worker is
		// attached there (forward_worker.go).
		if node := s.b.forwardTarget(f.Name); node != "" {
			s.forwardAttach(node, f, spec)
			return
		}
	}
	if err != nil {
		s.sendError(f.Ref, err)
		return
	}
	if f.Attach == 0 {
		s.sendError(f.Ref, wire.Errorf(wire.CodeProtocol, "attach: attachment id 0 is reserved"))
		return
	}
	a := &Attachment{
		s: s, id: f.Attach, member: fmt.Sprintf("%s.%d", s.id, f.Attach), ex: ex, role: f.Aux,
		serviceTag: f.Tag, connTag: spec.ConnTag, options: spec.Options,
		stripe:    uint32(s.n) + f.Attach,
		countBusy: ex.cfg.Strategy == LeastBusy,
	}
	switch {
	case ex.cfg.Pattern == wire.PatternReqResp && a.role != wire.RoleHandler:
		err = wire.Errorf(wire.CodeNotAllowed, "exchange %q is request-response: attach as a handler", ex.name)
	case ex.cfg.Pattern == wire.PatternTasks && a.role != wire.RoleWorker:
		err = wire.Errorf(wire.CodeNotAllowed, "exchange %q is a task exchange: attach as a worker", ex.name)
	case spec.Durable != "" && a.role != wire.RoleSubscriber:
		err = wire.Errorf(wire.CodeBadOptions, "attach: only pub-sub subscribers can be durable")
	case spec.Prefetch < 0 || spec.Prefetch > wire.MaxPrefetch:
		err = wire.Errorf(wire.CodeBadOptions, "attach: prefetch %d out of range: 0 to %d", spec.Prefetch, wire.MaxPrefetch)
	case ex.cfg.Pattern == wire.PatternPubSub && a.role != wire.RoleSubscriber && a.role != wire.RoleController:
		err = wire.Errorf(wire.CodeNotAllowed, "exchange %q is pub-sub: attach as a subscriber or controller", ex.name)
	case a.role == wire.RoleController && !ex.cfg.Controlled:
		err = wire.Errorf(wire.CodeNotAllowed, "exchange %q is not controlled: declare it with controlled to attach a controller", ex.name)
	}
	if err == nil && a.role == wire.RoleSubscriber {
		if perr := checkPatterns(spec.Patterns); perr != nil {
			err = wire.Errorf(wire.CodeBadOptions, "attach: %v", perr)
		} else {
			err = s.b.checkPatternCount(spec.Patterns)
		}
	}
	if err == nil && spec.Durable != "" {
		// Checked first as well, so that a refused ATTACH creates no
		// durable subscription.
		s.mu.Lock()
		err = s.roomFor(a)
		s.mu.Unlock()
		if err == nil {
			a.tq, err = s.b.durableSub(ex, spec.Durable, spec.Patterns, a)
		}
	}
	if a.role == wire.RoleWorker {
		a.tq = ex.tq
	}
	if err != nil {
		s.sendError(f.Ref, err)
		return
	}
	s.mu.Lock()
	if err, closed := s.roomFor(a), s.closed; err != nil || closed {
		s.mu.Unlock()
		if a.tq != nil && a.role == wire.RoleSubscriber {
			a.tq.releaseBound(a)
		}
		if !closed {
			s.sendError(f.Ref, err)
		}
		return
	}
	s.attachments[a.id] = a
	s.mu.Unlock()
	s.b.mu.Lock()
	s.b.members[a.member] = a
	s.b.mu.Unlock()

	if a.tq != nil {
		if err := a.tq.attachConsumer(a, spec.Prefetch); err != nil {
			s.forget(a)
			s.sendError(f.Ref, err)
			return
		}
		res := wire.AttachResult{Member: a.member}
		if a.role == wire.RoleSubscriber {
			a.tq.defMu.Lock()
			res.Patterns = a.tq.def.Patterns
			a.tq.defMu.Unlock()
		}
		ref := f.Ref
		ex.whenKnown(res.Patterns, func() { s.reply(ref, jsonBody(res), nil) })
		return
	}
	if a.role == wire.RoleSubscriber {
		if ex.cfg.Controlled && len(spec.Patterns) > 0 {
			// The OK waits for the controller's decision.
			ex.requestSubscription(a, f.Ref, spec.Patterns, true)
			return
		}
		now, err := ex.addPatterns(a, spec.Patterns, true, 0)
		if err != nil {
			a.gone.Store(true)
			s.forget(a)
			ex.removeAll(a) // what a controller may have subscribed it to meanwhile
			s.sendError(f.Ref, err)
			return
		}
		ref := f.Ref
		ex.whenKnown(now, func() { s.reply(ref, jsonBody(wire.AttachResult{Member: a.member, Patterns: now}), nil) })
		return
	}
	// Join before the OK, so that once the client has its OK every request
	// routed afterwards can reach the new handler. The client holds the
	// events that arrive first until the OK.
	if testHookBeforeJoin != nil {
		testHookBeforeJoin(a)
	}
	if err := ex.join(a); err != nil {
		s.forget(a)
		s.sendError(f.Ref, err)
		return
	}
	ref, res := f.Ref, jsonBody(wire.AttachResult{Member: a.member})
	reply := func() { s.reply(ref, res, nil) }
	// The OK waits until every node routes to it (a handler), and knows
	// of it (a controller).
	afterView := func() {
		if !ex.awaitView(a, reply) {
			reply()
		}
	}
	if a.role == wire.RoleController {
		ex.controllerJoined(a, afterView) // peer_control.go
		return
	}
	afterView()
}

// roomFor refuses a new attachment a past the session's limit, or with
// an id in use; s.mu is held.
func (s *Session) roomFor(a *Attachment) error {
	return s.roomForID(a.ex.name, a.id)
}

// roomForID refuses a new attachment id to exchange name past the
// session's limit, or with an id in use (by an attachment or a
// forwarded worker); s.mu is held.
func (s *Session) roomForID(name string, id uint32) error {
	if max := s.b.cfg.MaxAttachments; len(s.attachments)+len(s.fwdWorkers) >= max {
		return wire.Errorf(wire.CodeTooManyAttachments, "attach %q: this connection has %d attachments, the limit", name, max)
	}
	_, dup := s.attachments[id]
	if _, fwd := s.fwdWorkers[id]; dup || fwd {
		return wire.Errorf(wire.CodeProtocol, "attach: attachment id %d already in use", id)
	}
	return nil
}

// testHookBeforeJoin, set only by tests, runs between an ATTACH's
// registration in the session and its join of the group.
var testHookBeforeJoin func(a *Attachment)

// forget removes a from the session and the member index.
func (s *Session) forget(a *Attachment) {
	s.mu.Lock()
	if s.attachments[a.id] == a {
		delete(s.attachments, a.id)
	}
	s.mu.Unlock()
	s.b.mu.Lock()
	if s.b.members[a.member] == a {
		delete(s.b.members, a.member)
	}
	s.b.mu.Unlock()
}

// detach ends attachment id and calls ok, at once or, in a cluster,
// once no node routes to it any more.
func (s *Session) detach(id uint32, ok func()) error {
	s.mu.Lock()
	a := s.attachments[id]
	s.mu.Unlock()
	if a == nil {
		return wire.Errorf(wire.CodeNotFound, "detach: no attachment %d", id)
	}
	s.forget(a)
	s.drop(a)
	if !a.ex.awaitGone(a, ok) {
		ok()
	}
	return nil
}

// drop takes a out of its exchange.
func (s *Session) drop(a *Attachment) { s.dropAs(a, false) }

// dropAs takes a out of its exchange; with returned, a consumer's tasks
// in flight come back without a failed attempt.
func (s *Session) dropAs(a *Attachment, returned bool) {
	a.gone.Store(true)
	if a.tq != nil {
		a.tq.detachConsumerAs(a, returned)
		return
	}
	if a.ex.isMemberRole(a.role) {
		a.ex.leave(a)
	}
	if a.role == wire.RoleHandler {
		// Requests it was serving will get no answer.
		for _, sl := range s.handling.takeAttachment(a) {
			sl.handlerGone("the handler detached")
		}
	}
	if a.role == wire.RoleSubscriber {
		a.ex.removeAll(a)
	}
	if a.role == wire.RoleController {
		a.ex.controllerGone(a)
	}
}

// Close ends the session: its attachments leave their exchanges (a new
// leader is appointed where needed), requests it made are cancelled at
// their handlers, and requests it was handling fail with "handler gone".
func (s *Session) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	atts := s.attachments
	s.attachments = map[uint32]*Attachment{}
	watches := s.watches
	s.watches = nil
	fwdWorkers := s.fwdWorkers
	s.mu.Unlock()
	for _, w := range fwdWorkers {
		w.close()
	}
	for _, cancel := range watches {
		cancel()
	}
	reqs := s.requests.drain()
	handling := s.handling.drain()

	s.b.mu.Lock()
	delete(s.b.sessions, s.n)
	for _, a := range atts {
		if s.b.members[a.member] == a {
			delete(s.b.members, a.member)
		}
	}
	s.b.mu.Unlock()
	for _, a := range atts {
		// A peer's workers are its node's: their tasks come back
		// without a failed attempt (forward_worker.go).
		s.dropAs(a, s.peer != nil)
	}
	for id, p := range reqs {
		s.cancelPending(id, p)
		if p.w != nil {
			// An in-process requester waits on its call, not on the
			// connection: it is told here.
			s.sendFailure(id, p.w, "", true, wire.CodeCancelled, "the requester's connection closed")
		}
	}
	for _, sl := range handling {
		sl.handlerGone("the handler's connection closed")
	}
}
