package broker

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
)

// A request in flight is recorded twice: the requester's session keeps a
// pending entry under the id the requester chose (for CANCEL, ANSWER and
// cleanup when the requester goes), and each handler's session keeps a
// slot under an id the broker chose (for RESPONSE, ASK and cleanup when
// the handler goes). A unicast request needs no other record, so routing
// it allocates nothing; a broadcast shares one inflight among its targets.
// Both records keep the REQUEST's wire.Frame.Waiter (nil from a network),
// which every frame to the requester for that request carries back.

// pending is a requester's record of one request.
type pending struct {
	inf      *inflight   // broadcast: the shared record; nil for unicast
	a        *Attachment // unicast: the handler
	id       uint64      // unicast: the id in the handler's session
	deadline int64       // monoNow after which the broker gives up; 0: none
	w        any         // the requester's wire.Frame.Waiter
}

// Deadlines travel as time remaining, never as a clock reading: a
// REQUEST's Aux is its timeout in ms from when it was sent. The broker
// counts it from the request's arrival (start, on the monotonic clock),
// and gives each handler what remains of it when the request is
// delivered, after routing (expressions, redirects) took its share.
// Clocks of different machines, or a wall clock set back or forth, then
// never shorten nor lengthen a deadline.

// deadlineOf returns the monotonic deadline of request f that arrived at
// start (monoNow), 0 for none.
func deadlineOf(f *wire.Frame, start int64) int64 {
	if f.Aux == 0 {
		return 0
	}
	return start + int64(f.Aux)*int64(time.Millisecond)
}

// remainingMS is what a handler receives as Aux for request f that
// arrived at start: its timeout less the time spent since, in whole
// milliseconds, at least 1; 0 (none) for a request without a deadline.
func remainingMS(f *wire.Frame, start int64) uint64 {
	if f.Aux == 0 {
		return 0
	}
	return uint64(max(timeLeft(f, start).Milliseconds(), 1))
}

// inflight is a broadcast request. The requester's shard lock for reqID
// guards remaining and targets[i].done.
type inflight struct {
	requester *Session
	reqID     uint64
	w         any   // the requester's wire.Frame.Waiter
	start     int64 // monoNow at the request's arrival
	remaining int
	targets   []target
	// deliver serializes responses to the requester from the moment one
	// is found last until it is delivered, so that no other response of
	// this broadcast arrives after the one marked FlagLast (the client
	// forgets the request then and would drop it).
	deliver sync.Mutex
}

// target is one handler a broadcast went to.
type target struct {
	a    *Attachment
	id   uint64
	done bool
}

// slot is a handler session's record of one request it serves.
type slot struct {
	r     *Session // the requester
	reqID uint64
	w     any // the requester's wire.Frame.Waiter
	a     *Attachment
	inf   *inflight // broadcast only
	idx   int
	gen   uint32
	start int64 // unicast: monoNow at the request's arrival
	// retry is kept for a request sent to another node's leader, to route
	// it again if that node answers not-leader (see peerResponse).
	retry *leaderRetry
}

const shards = 8 // power of two

// requestTable is a session's pending requests, sharded by request id so
// that the goroutines of one embedded client do not queue on one lock.
type requestTable struct {
	shard [shards]reqShard
}

type reqShard struct {
	mu     sync.Mutex // guards m, closed; held to change n
	m      map[uint64]pending
	closed bool
	n      atomic.Int64 // len(m): the session's in flight is the sum
	_      [32]byte     // keep shards on separate cache lines
}

// lock locks and returns the shard of reqID.
func (t *requestTable) lock(reqID uint64) *reqShard {
	sh := &t.shard[reqID&(shards-1)]
	sh.mu.Lock()
	return sh
}

// drain closes the table and returns every pending request.
func (t *requestTable) drain() map[uint64]pending {
	out := make(map[uint64]pending)
	for i := range t.shard {
		sh := &t.shard[i]
		sh.mu.Lock()
		sh.closed = true
		for id, p := range sh.m {
			out[id] = p
		}
		sh.m = nil
		sh.n.Store(0)
		sh.mu.Unlock()
	}
	return out
}

// slotTable is a session's requests being handled, sharded; an id carries
// its shard, its index and a generation, so a stale id never finds a
// reused slot.
type slotTable struct {
	shard [shards]slotShard
	// sweeping counts the sweeps in progress; a sweep adds to epoch
	// before it leaves sweeping, so sendOne, reading sweeping then epoch,
	// never misses a sweep that took its slot.
	sweeping atomic.Int64
	// epoch counts the sweeps that take slots away (drain,
	// takeAttachment); it lets sendOne skip a check when none ran.
	epoch atomic.Uint64
}

// live reports whether id still has its slot.
func (t *slotTable) live(id uint64) bool {
	_, ok := t.get(id, false)
	return ok
}

type slotShard struct {
	mu     sync.Mutex // guards slots, free, closed
	slots  []slot
	free   []uint32
	closed bool
	_      [24]byte
}

// put stores sl and returns its id; ok is false once the session closed.
func (t *slotTable) put(sl slot, hint uint64) (id uint64, ok bool) {
	si := hint & (shards - 1)
	sh := &t.shard[si]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		return 0, false
	}
	var i uint32
	if k := len(sh.free); k > 0 {
		i = sh.free[k-1]
		sh.free = sh.free[:k-1]
	} else {
		sh.slots = append(sh.slots, slot{})
		i = uint32(len(sh.slots) - 1)
	}
	p := &sh.slots[i]
	sl.gen = p.gen + 1
	*p = sl
	return uint64(sl.gen)<<32 | uint64(i)<<3 | si, true
}

// get returns the slot of id; with remove, the slot is freed.
func (t *slotTable) get(id uint64, remove bool) (slot, bool) {
	sh := &t.shard[id&(shards-1)]
	i := uint32(id) >> 3
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if int(i) >= len(sh.slots) || sh.slots[i].gen != uint32(id>>32) || sh.slots[i].a == nil {
		return slot{}, false
	}
	sl := sh.slots[i]
	if remove {
		sh.slots[i] = slot{gen: sl.gen}
		sh.free = append(sh.free, i)
	}
	return sl, true
}

// swept ends a sweep: epoch moves on before sweeping drops.
func (t *slotTable) swept() {
	t.epoch.Add(1)
	t.sweeping.Add(-1)
}

// sweptSince reports whether a sweep ran or is running since epoch was
// read.
func (t *slotTable) sweptSince(epoch uint64) bool {
	return t.sweeping.Load() != 0 || t.epoch.Load() != epoch
}

// takeAttachment removes and returns the live slots of attachment a.
func (t *slotTable) takeAttachment(a *Attachment) []slot {
	t.sweeping.Add(1)
	defer t.swept()
	var out []slot
	for si := range t.shard {
		sh := &t.shard[si]
		sh.mu.Lock()
		for i := range sh.slots {
			if sl := sh.slots[i]; sl.a == a {
				out = append(out, sl)
				sh.slots[i] = slot{gen: sl.gen}
				sh.free = append(sh.free, uint32(i))
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// drain closes the table and returns every live slot.
func (t *slotTable) drain() []slot {
	t.sweeping.Add(1)
	defer t.swept()
	var out []slot
	for si := range t.shard {
		sh := &t.shard[si]
		sh.mu.Lock()
		sh.closed = true
		for _, sl := range sh.slots {
			if sl.a != nil {
				out = append(out, sl)
			}
		}
		sh.slots, sh.free = nil, nil
		sh.mu.Unlock()
	}
	return out
}

// maxRedirects bounds how often a routing function may redirect a request.
const maxRedirects = 8

// request routes a REQUEST from this session to handlers.
func (s *Session) request(f *wire.Frame) {
	start := monoNow()
	s.stats.Requests.Add(f.Ref, 1)
	if !s.allowed(auth.Write, f.Name) {
		s.failRequest(f, s.deny("request", auth.Write, f.Name))
		return
	}
	if f.Aux > wire.MaxDurationMS {
		s.failRequest(f, wire.Errorf(wire.CodeDeadlineTooLong, "request deadline %d ms is over the protocol's maximum %d ms (10 years)", f.Aux, uint64(wire.MaxDurationMS)))
		return
	}
	if max := s.b.maxDeadlineMS; max != 0 {
		if f.Aux > max {
			s.failRequest(f, wire.Errorf(wire.CodeDeadlineTooLong, "request deadline %s is over the server's maximum %s",
				time.Duration(f.Aux)*time.Millisecond, time.Duration(max)*time.Millisecond))
			return
		}
		if f.Aux == 0 {
			f.Aux = max // no deadline: the maximum
		}
	}
	ex, err := s.b.lookup(f.Name)
	for hops := 0; err == nil; hops++ {
		if ex.cfg.Pattern != wire.PatternReqResp {
			err = wire.Errorf(wire.CodeNotAllowed, "exchange %q is %s, not request-response", ex.name, ex.cfg.Pattern)
			break
		}
		ex.requests.Add(f.Ref, 1)
		var redirect string
		redirect, err = s.dispatch(ex, f, start)
		if err != nil || redirect == "" {
			break
		}
		if hops == maxRedirects {
			err = wire.Errorf(wire.CodeRejected, "request redirected more than %d times (last to %q)", maxRedirects, redirect)
			break
		}
		if !s.allowed(auth.Write, redirect) {
			// The routing function may be the requester's own: a
			// redirect is a request to its target like any other.
			err = s.deny("request redirected by "+ex.name, auth.Write, redirect)
			break
		}
		ex, err = s.b.lookup(redirect)
	}
	if err != nil {
		s.failRequest(f, err)
	}
}

// failRequest answers a request that reached no handler.
func (s *Session) failRequest(f *wire.Frame, err error) {
	e := asWireError(err)
	*f = wire.Frame{Type: wire.TypeResponse, Flags: wire.FlagError | wire.FlagLast, Ref: f.Ref, Aux: uint64(e.Code), Tag: e.Msg, Waiter: f.Waiter}
	s.sink.Deliver(f)
}

// dispatch picks the handlers of ex for f and sends it to them. It returns
// the name of another exchange when a routing function redirects. start
// is when the request arrived (monoNow), for the exchange's latency.
func (s *Session) dispatch(ex *Exchange, f *wire.Frame, start int64) (string, error) {
	v := ex.view.Load()
	g := v.all
	if f.Tag != "" {
		g = v.byTag[f.Tag]
		if g == nil || len(g.members) == 0 {
			return "", wire.Errorf(wire.CodeNoHandler, "no handler with service tag %q on exchange %q", f.Tag, ex.name)
		}
	}
	if len(g.members) == 0 {
		return "", wire.Errorf(wire.CodeNoHandler, "no handler on exchange %q", ex.name)
	}
	var one *Attachment
	switch ex.cfg.Strategy {
	case Broadcast:
		return "", s.send(f, g.members, start)
	case RoundRobin, LeaderRoundRobin:
		if len(g.members) == 1 {
			one = g.members[0] // spare the shared counter its write
		} else {
			one = g.members[(g.next.Add(1)-1)%uint64(len(g.members))]
		}
	case Leader:
		one = g.members[0] // the earliest member, which is the leader
		if v.fenced && g == v.all {
			// In a cluster, the home node's appointee, valid here.
			if one = v.leader; one == nil {
				return "", wire.Errorf(wire.CodeNoHandler, "no leader on exchange %q: none is appointed, or this node lost its exchange's home node", ex.name)
			}
		}
	case Sticky:
		one = g.ring.pick(f.Key)
	case StickyFun:
		key, err := ex.stickyKey(s, f, g, start)
		if err != nil {
			return "", err
		}
		one = g.ring.pick(key)
	case LeastBusy:
		one = leastBusy(g)
	case Fun:
		return s.routeFun(ex, g, f, start)
	}
	return "", s.sendOne(f, one, start)
}

// addBusy counts a request the handler takes (d = 1) or finishes (-1), on
// a least-busy exchange.
func (a *Attachment) addBusy(d int64) {
	if a.countBusy {
		a.busy.Add(d)
	}
}

func leastBusy(g *group) *Attachment {
	if g.remote {
		return twoChoices(g)
	}
	start := int(g.next.Add(1) - 1)
	n := len(g.members)
	best := g.members[start%n]
	low := best.busy.Load()
	for i := 1; i < n && low > 0; i++ {
		m := g.members[(start+i)%n]
		if b := m.busy.Load(); b < low {
			best, low = m, b
		}
	}
	return best
}

// stickyKey computes the key of a sticky-fun request. A key expression
// that fails gives "", unless a limit stopped it: the request fails then.
func (ex *Exchange) stickyKey(s *Session, f *wire.Frame, g *group, start int64) (string, error) {
	if ex.keyExpr == nil {
		return ex.keyFn(routeInput(f, g)), nil
	}
	e, left := ex.keyExpr, timeLeft(f, start)
	if e.costly {
		owner := s.slotOwner()
		sh, le := ex.b.takeSlot(owner, left)
		if le != nil {
			return "", ex.exprLimited("key", le)
		}
		defer ex.b.giveSlot(owner, sh)
	}
	key, err := e.key(exprVarsOf(f, g), left)
	var le *exprLimitError
	if errors.As(err, &le) {
		return "", ex.exprLimited("key", le)
	}
	return key, nil
}

// timeLeft is what remains of request f's deadline, 0 for none; start is
// when it arrived (monoNow).
func timeLeft(f *wire.Frame, start int64) time.Duration {
	if f.Aux == 0 {
		return 0
	}
	return max(time.Duration(f.Aux)*time.Millisecond-time.Duration(monoNow()-start), 1)
}

// limitLogEvery is the least time between two logs of an exchange's
// expression stopped by a limit.
const limitLogEvery = 5 * time.Second

// exprLimited counts and logs an evaluation of ex stopped by a limit, and
// returns the error the request fails with.
func (ex *Exchange) exprLimited(kind string, le *exprLimitError) error {
	n := ex.limited.Add(1)
	now := time.Now().UnixNano()
	if last := ex.limitLogged.Load(); now-last >= int64(limitLogEvery) && ex.limitLogged.CompareAndSwap(last, now) {
		ex.b.log.Warn("routing expression stopped by its limit", "exchange", ex.name, "expr", kind, "reason", le.msg, "stopped", n)
	}
	return wire.Errorf(wire.CodeExprLimit, "exchange %q: %s expression %s", ex.name, kind, le.msg)
}

// ExprLimited returns how many evaluations of the exchange's key or
// route expression a limit stopped.
func (ex *Exchange) ExprLimited() int64 { return ex.limited.Load() }

// evalRoute evaluates the route expression for a request of s, in an
// evaluation slot if it is costly.
func (ex *Exchange) evalRoute(s *Session, vars *exprVars, left time.Duration) (Route, error) {
	e := ex.routeExpr
	if e.costly {
		owner := s.slotOwner()
		sh, le := ex.b.takeSlot(owner, left)
		if le != nil {
			return Route{}, le
		}
		defer ex.b.giveSlot(owner, sh)
	}
	return e.route(vars, left)
}

func (s *Session) routeFun(ex *Exchange, g *group, f *wire.Frame, start int64) (string, error) {
	var r Route
	var err error
	if ex.routeExpr != nil {
		r, err = ex.evalRoute(s, exprVarsOf(f, g), timeLeft(f, start))
	} else {
		r, err = ex.route(routeInput(f, g))
	}
	if err != nil {
		var le *exprLimitError
		if errors.As(err, &le) {
			return "", ex.exprLimited("route", le)
		}
		return "", wire.Errorf(wire.CodeRejected, "routing function of %q failed: %v", ex.name, err)
	}
	if r.Key != nil {
		f.Key = *r.Key
	}
	if r.Header != nil {
		f.Header = r.Header
	}
	switch {
	case r.Reject != "":
		return "", wire.Errorf(wire.CodeRejected, "%s", r.Reject)
	case r.Redirect != "":
		f.Tag = ""
		return r.Redirect, nil
	case r.Member != "":
		for _, m := range g.members {
			if m.member == r.Member {
				return "", s.sendOne(f, m, start)
			}
		}
		return "", wire.Errorf(wire.CodeNoHandler, "routing function of %q picked %q, which is not a handler", ex.name, r.Member)
	case r.Tag != "":
		tg := ex.view.Load().byTag[r.Tag]
		if tg == nil || len(tg.members) == 0 {
			return "", wire.Errorf(wire.CodeNoHandler, "routing function of %q picked service tag %q, which has no handler", ex.name, r.Tag)
		}
		g = tg
	}
	return "", s.sendOne(f, g.members[(g.next.Add(1)-1)%uint64(len(g.members))], start)
}

// register records a pending request; it fails on a closed session, a
// duplicate id or too many requests in flight.
func (s *Session) register(reqID uint64, p pending) error {
	sh := s.requests.lock(reqID)
	defer sh.mu.Unlock()
	switch {
	case sh.closed:
		return wire.Errorf(wire.CodeCancelled, "the requester's connection closed")
	case s.overLimit(sh):
		return wire.Errorf(wire.CodeTooManyInflight, "%d requests in flight on this connection, the limit", s.b.cfg.MaxInflight)
	case s.b.draining.Load():
		// Checked after the count went up, so that Busy, reading the
		// counts after Drain, sees every request that got past here.
		sh.n.Add(-1)
		return wire.Errorf(wire.CodeShutdown, "the server is shutting down: it takes no new requests")
	}
	if sh.m == nil {
		sh.m = make(map[uint64]pending)
	}
	if _, dup := sh.m[reqID]; dup {
		sh.n.Add(-1)
		return wire.Errorf(wire.CodeProtocol, "request id %d is already in flight", reqID)
	}
	sh.m[reqID] = p
	return nil
}

// take removes and returns the pending request reqID if match accepts it.
func (s *Session) take(reqID uint64, match func(pending) bool) (pending, bool) {
	sh := s.requests.lock(reqID)
	defer sh.mu.Unlock()
	p, ok := sh.m[reqID]
	if !ok || (match != nil && !match(p)) {
		return pending{}, false
	}
	delete(sh.m, reqID)
	sh.n.Add(-1)
	return p, true
}

// overLimit counts a new request in shard sh (locked) and reports, having
// taken it back out, whether it would make too many in flight. The sum
// of the shards is read only once sh holds more than its share of the
// limit, so a request costs no read of the other shards' lines; the
// limit can be overshot, by requests racing in other shards, by at most
// the limit again.
func (s *Session) overLimit(sh *reqShard) bool {
	max := int64(s.b.cfg.MaxInflight)
	if n := sh.n.Add(1); n*shards > max && s.Inflight() > max {
		sh.n.Add(-1)
		return true
	}
	return false
}

// sendOne sends f to one handler, reusing f as the delivered frame.
func (s *Session) sendOne(f *wire.Frame, a *Attachment, start int64) error {
	h := a.s
	if h.peer != nil {
		return s.sendRemote(f, a, start)
	}
	epoch := h.handling.epoch.Load()
	id, ok := h.handling.put(slot{r: s, reqID: f.Ref, w: f.Waiter, a: a, start: start}, f.Ref)
	if !ok {
		return wire.Errorf(wire.CodeHandlerGone, "the handler's connection closed")
	}
	a.addBusy(1)
	if err := s.register(f.Ref, pending{a: a, id: id, deadline: deadlineOf(f, start), w: f.Waiter}); err != nil {
		if _, ok := h.handling.get(id, true); ok {
			a.addBusy(-1)
		}
		return err
	}
	if h.handling.sweptSince(epoch) && !h.handling.live(id) {
		// The handler went away between put and register, so whoever
		// took the slot could not find the request to fail it; unless a
		// CANCEL took it meanwhile, that is left to us.
		if _, ok := s.take(f.Ref, func(p pending) bool { return p.id == id && p.a == a }); ok {
			return wire.Errorf(wire.CodeHandlerGone, "the handler left")
		}
		f.Release()
		return nil
	}
	h.stats.Delivered.Add(f.Ref, 1)
	if s.peer == nil { // another node's request names its requester already
		f.Name = s.id
	}
	f.Ref, f.Attach, f.Aux, f.Waiter = id, a.id, remainingMS(f, start), nil
	h.sink.Deliver(f)
	return nil
}

// send delivers f to every member of list (broadcast).
func (s *Session) send(f *wire.Frame, list []*Attachment, start int64) error {
	if len(list) == 1 {
		return s.sendOne(f, list[0], start)
	}
	inf := &inflight{requester: s, reqID: f.Ref, w: f.Waiter, start: start, remaining: len(list), targets: make([]target, len(list))}
	if err := s.register(f.Ref, pending{inf: inf, deadline: deadlineOf(f, start), w: f.Waiter}); err != nil {
		return err
	}
	for i, a := range list {
		inf.targets[i].a = a
		id, ok := a.s.handling.put(slot{r: s, reqID: f.Ref, w: f.Waiter, a: a, inf: inf, idx: i}, f.Ref)
		if !ok {
			s.finish(inf, i, wire.CodeHandlerGone, "the handler's connection closed")
			continue
		}
		sh := s.requests.lock(f.Ref)
		inf.targets[i].id = id
		sh.mu.Unlock()
	}
	for i, a := range list {
		sh := s.requests.lock(f.Ref)
		id := inf.targets[i].id
		sh.mu.Unlock()
		if id == 0 {
			continue
		}
		g := f.Clone()
		g.Ref, g.Attach, g.Name, g.Waiter = id, a.id, s.id, nil
		if a.s.peer != nil {
			toRReq(g, a, 0, start) // the time left, from g.Aux as the requester sent it
		} else {
			g.Aux = remainingMS(f, start)
		}
		a.addBusy(1)
		a.s.stats.Delivered.Add(f.Ref, 1)
		a.s.sink.Deliver(g)
	}
	f.Release()
	return nil
}

// finishTarget marks target idx of a broadcast done. It reports whether
// the target was still live and whether it was the last one.
func (s *Session) finishTarget(inf *inflight, idx int) (live, last bool) {
	sh := s.requests.lock(inf.reqID)
	defer sh.mu.Unlock()
	t := &inf.targets[idx]
	if t.done {
		return false, false
	}
	t.done = true
	inf.remaining--
	if inf.remaining == 0 {
		if p, ok := sh.m[inf.reqID]; ok && p.inf == inf {
			delete(sh.m, inf.reqID)
			sh.n.Add(-1)
		}
		return true, true
	}
	return true, false
}

// finish ends target idx of a broadcast with an error response.
func (s *Session) finish(inf *inflight, idx int, code wire.Code, msg string) {
	inf.deliver.Lock()
	defer inf.deliver.Unlock()
	live, last := s.finishTarget(inf, idx)
	if !live {
		return
	}
	s.sendFailure(inf.reqID, inf.w, inf.targets[idx].a.member, last, code, msg)
}

// sendFailure sends the requester an error response to request reqID,
// whose wire.Frame.Waiter is w.
func (s *Session) sendFailure(reqID uint64, w any, from string, last bool, code wire.Code, msg string) {
	f := wire.NewFrame(wire.TypeResponse)
	f.Flags = wire.FlagError
	if last {
		f.Flags |= wire.FlagLast
	}
	f.Ref, f.Aux, f.Tag, f.Name, f.Waiter = reqID, uint64(code), msg, from, w
	s.sink.Deliver(f)
}

// handlerGone fails a request whose handler went away.
func (sl slot) handlerGone(msg string) {
	sl.a.addBusy(-1)
	r := sl.r
	if sl.inf != nil {
		r.finish(sl.inf, sl.idx, wire.CodeHandlerGone, msg)
		return
	}
	if _, ok := r.take(sl.reqID, func(p pending) bool { return p.a == sl.a }); ok {
		r.sendFailure(sl.reqID, sl.w, sl.a.member, true, wire.CodeHandlerGone, msg)
	}
}

// cancelPending tells the handlers of a request this session gave up on.
func (s *Session) cancelPending(reqID uint64, p pending) {
	if p.inf == nil {
		cancelAt(p.a, p.id)
		return
	}
	var live []target
	sh := s.requests.lock(reqID)
	for i := range p.inf.targets {
		if t := &p.inf.targets[i]; !t.done {
			t.done = true
			if t.id != 0 {
				live = append(live, *t)
			}
		}
	}
	p.inf.remaining = 0
	sh.mu.Unlock()
	for _, t := range live {
		cancelAt(t.a, t.id)
	}
}

// cancelAt removes request id from a handler and tells it.
func cancelAt(a *Attachment, id uint64) {
	if _, ok := a.s.handling.get(id, true); !ok {
		return
	}
	a.addBusy(-1)
	c := wire.NewFrame(wire.TypeCancel)
	c.Ref, c.Attach = id, a.id
	a.s.sink.Deliver(c)
}

// respond forwards a RESPONSE from a handler of this session.
func (s *Session) respond(f *wire.Frame) {
	final := f.Flags&wire.FlagChunk == 0
	sl, ok := s.handling.get(f.Ref, final)
	if !ok {
		// Cancelled or timed out meanwhile: the requester is not waiting.
		f.Release()
		return
	}
	if s.peer != nil && s.peerResponse(sl, f, final) {
		return
	}
	s.stats.Responses.Add(1)
	if final {
		s.answering.Add(1)
		defer s.answering.Add(-1)
	}
	r := sl.r
	if sl.inf != nil {
		// Held until delivered: a response found last must arrive last.
		sl.inf.deliver.Lock()
		defer sl.inf.deliver.Unlock()
	}
	last := false
	if final {
		sl.a.addBusy(-1)
		if sl.inf != nil {
			var live bool
			if live, last = r.finishTarget(sl.inf, sl.idx); !live {
				f.Release()
				return
			}
		} else {
			id := f.Ref
			if _, ok := r.take(sl.reqID, func(p pending) bool { return p.id == id && p.a == sl.a }); !ok {
				f.Release()
				return
			}
			last = true
		}
	}
	f.Ref, f.Attach, f.Name, f.Waiter = sl.reqID, 0, sl.a.member, sl.w
	if r.peer != nil && sl.a.countBusy {
		// Tell the requester's node how busy the handler is now.
		f.Attach = uint32(min(max(sl.a.busy.Load(), 0), 1<<31)) + 1
	}
	f.Flags &^= wire.FlagLast
	if last {
		f.Flags |= wire.FlagLast
		if h := sl.a.ex.latency; h != nil {
			start := sl.start
			if sl.inf != nil {
				start = sl.inf.start
			}
			h.observe(sl.a.stripe, monoNow()-start)
		}
	}
	r.sink.Deliver(f)
}

// Refuse fails a REQUEST that the broker gave this session's sink and
// the sink could not take (its peer does not read), as if the handler
// had answered it with err. It takes ownership of f.
func (s *Session) Refuse(f *wire.Frame, err *wire.Error) {
	*f = wire.Frame{Type: wire.TypeResponse, Flags: wire.FlagError, Ref: f.Ref, Attach: f.Attach, Aux: uint64(err.Code), Tag: err.Msg}
	s.respond(f)
}

// cancel handles a CANCEL from the requester.
func (s *Session) cancel(reqID uint64) {
	if p, ok := s.take(reqID, nil); ok {
		s.cancelPending(reqID, p)
	}
}

// ask forwards a handler's question to the requester. The token the
// requester answers with encodes the target index and the handler's ask id.
func (s *Session) ask(f *wire.Frame) {
	sl, ok := s.handling.get(f.Ref, false)
	if !ok || f.Aux > 1<<32-1 {
		a := wire.NewFrame(wire.TypeAnswer)
		a.Ref, a.Aux, a.Attach, a.Flags = f.Ref, f.Aux, f.Attach, wire.FlagError
		a.Tag = "the request is no longer in flight"
		f.Release()
		s.sink.Deliver(a)
		return
	}
	f.Aux = uint64(sl.idx)<<32 | f.Aux
	f.Ref, f.Attach, f.Name, f.Waiter = sl.reqID, 0, sl.a.member, sl.w
	sl.r.sink.Deliver(f)
}

// answer forwards the requester's answer to the handler that asked.
func (s *Session) answer(f *wire.Frame) {
	idx := int(f.Aux >> 32)
	sh := s.requests.lock(f.Ref)
	p, ok := sh.m[f.Ref]
	var a *Attachment
	var id uint64
	switch {
	case !ok:
	case p.inf == nil:
		a, id, ok = p.a, p.id, idx == 0
	case idx < len(p.inf.targets) && !p.inf.targets[idx].done:
		a, id = p.inf.targets[idx].a, p.inf.targets[idx].id
	default:
		ok = false
	}
	sh.mu.Unlock()
	if !ok {
		f.Release()
		return
	}
	f.Ref, f.Aux, f.Attach = id, f.Aux&(1<<32-1), a.id
	a.s.sink.Deliver(f)
}

// expire fails the requests of this session whose deadline passed before
// now (monoNow): the requester gets a timeout, the handlers a CANCEL. Clients cancel
// on their own deadline too; this is for those that do not.
//
// The sweep calls it for every session in turn, and a session's sink may
// wait (a requester that reads nothing holds a RESPONSE for up to the
// slow-consumer timeout): so the timeouts are taken from the table here
// and delivered by a goroutine of the session's own, one at a time per
// session. A session whose last timeouts are still on their way is
// skipped; its requests expire in the next round after. One requester
// that does not read never holds back the deadlines of the others.
func (s *Session) expire(now int64) {
	if !s.expiring.CompareAndSwap(false, true) {
		return
	}
	late := s.takeExpired(now)
	if len(late) == 0 {
		s.expiring.Store(false)
		return
	}
	// Taken from the table and not yet delivered: Busy counts them, so
	// that a drain waits for them.
	s.answering.Add(int64(len(late)))
	go func() {
		defer s.expiring.Store(false)
		for _, d := range late {
			s.cancelPending(d.reqID, d.p)
			s.sendFailure(d.reqID, d.p.w, "", true, wire.CodeTimeout, "the request's deadline passed")
			s.answering.Add(-1)
		}
	}()
}

// expired is a request taken from the table at its deadline.
type expired struct {
	reqID uint64
	p     pending
}

// takeExpired removes from the table the requests whose deadline passed
// before now.
func (s *Session) takeExpired(now int64) []expired {
	var late []expired
	for i := range s.requests.shard {
		sh := &s.requests.shard[i]
		sh.mu.Lock()
		for id, p := range sh.m {
			if p.deadline != 0 && p.deadline < now {
				delete(sh.m, id)
				sh.n.Add(-1)
				late = append(late, expired{id, p})
			}
		}
		sh.mu.Unlock()
	}
	return late
}
