package broker

import (
	"github.com/courier-mq/courier/wire"
)

// inflight is one request between its requester and its handlers. The
// requester session's mu guards remaining and targets[i].done.
type inflight struct {
	requester *Session
	reqID     uint64
	remaining int
	targets   []target
	one       [1]target
}

// target is one handler a request went to, with the id the request has in
// that handler's session.
type target struct {
	a    *Attachment
	id   uint64
	done bool
}

// slot is an entry of a session's handling table.
type slot struct {
	inf *inflight
	idx int
	gen uint32
}

// slab maps the ids a session's handlers see to requests in flight. Ids
// carry a generation so that a stale id never finds a reused slot.
type slab struct {
	slots []slot
	free  []uint32
	n     int
}

func (t *slab) put(inf *inflight, idx int) uint64 {
	var i uint32
	if k := len(t.free); k > 0 {
		i = t.free[k-1]
		t.free = t.free[:k-1]
	} else {
		t.slots = append(t.slots, slot{})
		i = uint32(len(t.slots) - 1)
	}
	sl := &t.slots[i]
	sl.gen++
	sl.inf, sl.idx = inf, idx
	t.n++
	return uint64(sl.gen)<<32 | uint64(i+1)
}

func (t *slab) get(id uint64) (*inflight, int) {
	i := uint32(id) - 1
	if int(i) >= len(t.slots) || t.slots[i].gen != uint32(id>>32) || t.slots[i].inf == nil {
		return nil, 0
	}
	return t.slots[i].inf, t.slots[i].idx
}

func (t *slab) remove(id uint64) {
	i := uint32(id) - 1
	if int(i) < len(t.slots) && t.slots[i].gen == uint32(id>>32) && t.slots[i].inf != nil {
		t.slots[i].inf = nil
		t.free = append(t.free, i)
		t.n--
	}
}

func (t *slab) drain() []slot {
	var out []slot
	for i := range t.slots {
		if t.slots[i].inf != nil {
			out = append(out, t.slots[i])
		}
	}
	*t = slab{}
	return out
}

// maxRedirects bounds how often a routing function may redirect a request.
const maxRedirects = 8

// request routes a REQUEST from this session to handlers.
func (s *Session) request(f *wire.Frame) {
	s.stats.Requests.Add(1)
	ex, err := s.b.lookup(f.Name)
	for hops := 0; err == nil; hops++ {
		if ex.cfg.Pattern != wire.PatternReqResp {
			err = wire.Errorf(wire.CodeNotAllowed, "exchange %q is %s, not request-response", ex.name, ex.cfg.Pattern)
			break
		}
		ex.requests.Add(1)
		var redirect string
		redirect, err = s.dispatch(ex, f)
		if err != nil || redirect == "" {
			break
		}
		if hops == maxRedirects {
			err = wire.Errorf(wire.CodeRejected, "request redirected more than %d times (last to %q)", maxRedirects, redirect)
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
	r := f // reuse the frame
	*r = wire.Frame{Type: wire.TypeResponse, Flags: wire.FlagError | wire.FlagLast, Ref: f.Ref, Aux: uint64(e.Code), Tag: e.Msg}
	s.sink.Deliver(r)
}

// dispatch picks the handlers of ex for f and sends it to them. It returns
// the name of another exchange when a routing function redirects.
func (s *Session) dispatch(ex *Exchange, f *wire.Frame) (string, error) {
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
		return "", s.send(f, g.members)
	case RoundRobin, LeaderRoundRobin:
		one = g.members[(g.next.Add(1)-1)%uint64(len(g.members))]
	case Leader:
		one = g.members[0] // the earliest member, which is the leader
	case Sticky:
		one = g.ring.pick(f.Key)
	case StickyFun:
		one = g.ring.pick(ex.keyFn(routeInput(f, g)))
	case LeastBusy:
		one = leastBusy(g)
	case Fun:
		return s.routeFun(ex, g, f)
	}
	return "", s.sendOne(f, one)
}

func leastBusy(g *group) *Attachment {
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

func (s *Session) routeFun(ex *Exchange, g *group, f *wire.Frame) (string, error) {
	r, err := ex.route(routeInput(f, g))
	if err != nil {
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
				return "", s.sendOne(f, m)
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
	return "", s.sendOne(f, g.members[(g.next.Add(1)-1)%uint64(len(g.members))])
}

// sendOne sends f to one handler, reusing f as the delivered frame.
func (s *Session) sendOne(f *wire.Frame, a *Attachment) error {
	inf := &inflight{requester: s, reqID: f.Ref, remaining: 1}
	inf.one[0].a = a
	inf.targets = inf.one[:]
	if err := s.register(inf); err != nil {
		return err
	}
	h := a.s
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		s.unregister(inf)
		return wire.Errorf(wire.CodeHandlerGone, "the handler's connection closed")
	}
	id := h.handling.put(inf, 0)
	h.mu.Unlock()
	inf.targets[0].id = id
	a.busy.Add(1)
	h.stats.Delivered.Add(1)
	f.Ref, f.Attach, f.Name = id, a.id, s.id
	h.sink.Deliver(f)
	return nil
}

// send delivers f to every member of list (broadcast).
func (s *Session) send(f *wire.Frame, list []*Attachment) error {
	if len(list) == 1 {
		return s.sendOne(f, list[0])
	}
	inf := &inflight{requester: s, reqID: f.Ref, remaining: len(list), targets: make([]target, len(list))}
	if err := s.register(inf); err != nil {
		return err
	}
	for i, a := range list {
		inf.targets[i].a = a
		h := a.s
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			inf.fail(i, wire.CodeHandlerGone, "the handler's connection closed")
			continue
		}
		inf.targets[i].id = h.handling.put(inf, i)
		h.mu.Unlock()
	}
	for i, a := range list {
		if inf.targets[i].id == 0 {
			continue
		}
		g := f.Clone()
		g.Ref, g.Attach, g.Name = inf.targets[i].id, a.id, s.id
		a.busy.Add(1)
		a.s.stats.Delivered.Add(1)
		a.s.sink.Deliver(g)
	}
	f.Release()
	return nil
}

func (s *Session) register(inf *inflight) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return wire.Errorf(wire.CodeCancelled, "the requester's connection closed")
	case len(s.requests) >= s.b.cfg.MaxInflight:
		return wire.Errorf(wire.CodeLimit, "%d requests in flight on this connection, the limit", s.b.cfg.MaxInflight)
	}
	if _, dup := s.requests[inf.reqID]; dup {
		return wire.Errorf(wire.CodeProtocol, "request id %d is already in flight", inf.reqID)
	}
	s.requests[inf.reqID] = inf
	return nil
}

func (s *Session) unregister(inf *inflight) {
	s.mu.Lock()
	if s.requests[inf.reqID] == inf {
		delete(s.requests, inf.reqID)
	}
	s.mu.Unlock()
}

// finish marks target idx done. It reports whether the target was still
// live and whether it was the last one.
func (inf *inflight) finish(idx int) (live, last bool) {
	r := inf.requester
	r.mu.Lock()
	defer r.mu.Unlock()
	t := &inf.targets[idx]
	if t.done {
		return false, false
	}
	t.done = true
	inf.remaining--
	if inf.remaining == 0 {
		if r.requests[inf.reqID] == inf {
			delete(r.requests, inf.reqID)
		}
		return true, true
	}
	return true, false
}

// fail ends target idx with an error response to the requester.
func (inf *inflight) fail(idx int, code wire.Code, msg string) {
	live, last := inf.finish(idx)
	if !live {
		return
	}
	inf.targets[idx].a.busy.Add(-1)
	f := wire.NewFrame(wire.TypeResponse)
	f.Flags = wire.FlagError
	if last {
		f.Flags |= wire.FlagLast
	}
	f.Ref, f.Aux, f.Tag, f.Name = inf.reqID, uint64(code), msg, inf.targets[idx].a.member
	inf.requester.sink.Deliver(f)
}

// cancelTargets tells every handler still working on inf to stop.
func (inf *inflight) cancelTargets(b *Broker) {
	r := inf.requester
	var live []target
	r.mu.Lock()
	for i := range inf.targets {
		if !inf.targets[i].done {
			inf.targets[i].done = true
			live = append(live, inf.targets[i])
		}
	}
	inf.remaining = 0
	r.mu.Unlock()
	for _, t := range live {
		h := t.a.s
		h.mu.Lock()
		h.handling.remove(t.id)
		h.mu.Unlock()
		t.a.busy.Add(-1)
		c := wire.NewFrame(wire.TypeCancel)
		c.Ref, c.Attach = t.id, t.a.id
		h.sink.Deliver(c)
	}
}

// respond forwards a RESPONSE from a handler of this session.
func (s *Session) respond(f *wire.Frame) {
	final := f.Flags&wire.FlagChunk == 0
	s.mu.Lock()
	inf, idx := s.handling.get(f.Ref)
	if inf != nil && final {
		s.handling.remove(f.Ref)
	}
	s.mu.Unlock()
	if inf == nil {
		// Cancelled or timed out meanwhile: the requester is not waiting.
		f.Release()
		return
	}
	s.stats.Responses.Add(1)
	t := inf.targets[idx]
	last := false
	if final {
		var live bool
		if live, last = inf.finish(idx); !live {
			f.Release()
			return
		}
		t.a.busy.Add(-1)
	}
	f.Ref, f.Attach, f.Name = inf.reqID, 0, t.a.member
	f.Flags &^= wire.FlagLast
	if last {
		f.Flags |= wire.FlagLast
	}
	inf.requester.sink.Deliver(f)
}

// cancel handles a CANCEL from the requester.
func (s *Session) cancel(reqID uint64) {
	s.mu.Lock()
	inf := s.requests[reqID]
	delete(s.requests, reqID)
	s.mu.Unlock()
	if inf != nil {
		inf.cancelTargets(s.b)
	}
}

// ask forwards a handler's question to the requester. The token the
// requester answers with encodes the target index and the handler's ask id.
func (s *Session) ask(f *wire.Frame) {
	s.mu.Lock()
	inf, idx := s.handling.get(f.Ref)
	s.mu.Unlock()
	if inf == nil || f.Aux > 1<<32-1 {
		a := wire.NewFrame(wire.TypeAnswer)
		a.Ref, a.Aux, a.Flags = f.Ref, f.Aux, wire.FlagError
		a.Tag = "the request is no longer in flight"
		f.Release()
		s.sink.Deliver(a)
		return
	}
	f.Aux = uint64(idx)<<32 | f.Aux
	f.Ref, f.Attach, f.Name = inf.reqID, 0, inf.targets[idx].a.member
	inf.requester.sink.Deliver(f)
}

// answer forwards the requester's answer to the handler that asked.
func (s *Session) answer(f *wire.Frame) {
	idx := int(f.Aux >> 32)
	s.mu.Lock()
	inf := s.requests[f.Ref]
	var t target
	ok := inf != nil && idx < len(inf.targets) && !inf.targets[idx].done
	if ok {
		t = inf.targets[idx]
	}
	s.mu.Unlock()
	if !ok {
		f.Release()
		return
	}
	f.Ref, f.Aux, f.Attach = t.id, f.Aux&(1<<32-1), t.a.id
	t.a.s.sink.Deliver(f)
}
