package broker

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
)

var errBadPattern = errors.New("bad pattern")

// maxCache bounds the per-exchange cache of routing key → subscribers.
const maxCache = 16384

// publish routes a PUBLISH to every matching subscriber, once each, in the
// order this session published.
func (s *Session) publish(f *wire.Frame) {
	if !s.allowed(auth.Write, f.Name) {
		s.sendError(f.Ref, s.deny("publish", auth.Write, f.Name))
		f.Release()
		return
	}
	ex, err := s.b.lookup(f.Name)
	if err == nil && ex.subs == nil {
		err = wire.Errorf(wire.CodeNotAllowed, "exchange %q is %s: publish needs a pub-sub exchange", ex.name, ex.cfg.Pattern)
	}
	if err != nil {
		s.sendError(f.Ref, err)
		f.Release()
		return
	}
	ex.publishes.Add(1)
	s.stats.Publishes.Add(1)
	var pc *publishConfirm
	if f.Flags&wire.FlagReply != 0 {
		pc = newPublishConfirm(s, f.Ref, ex.name)
	}
	if tq := ex.fanout(f, pc); tq != nil && s.lastQueue.Load() != tq {
		// Its flow control is the durable subscription's queue's, as a
		// SUBMIT's is its task queue's (see Session.Pressure).
		s.lastQueue.Store(tq)
	}
	if pc != nil {
		pc.stored("", nil) // the router's hold: every queue is counted now
	}
}

// fanout delivers a publication to every matching subscriber as MESSAGE
// frames, and takes ownership of f. With pc (a PUBLISH with flag Reply),
// each durable subscription's queue it enqueues to holds pc's answer
// until the message is durable there. It returns, of the durable
// subscriptions' queues it enqueued to, the one under the most pressure
// (nil if none).
//
// In a cluster, each other node with interest in the publication is one
// of subs (its stand-in, see peer_pubsub.go) and gets one RPUB.
func (ex *Exchange) fanout(f *wire.Frame, pc *publishConfirm) (durable *taskQueue) {
	return ex.fanoutTo(f, pc, ex.match(f.Key))
}

// fanoutTo is fanout to subs, the subscribers matched.
func (ex *Exchange) fanoutTo(f *wire.Frame, pc *publishConfirm, subs []*Attachment) (durable *taskQueue) {
	last := len(subs) - 1
	for i, a := range subs {
		if bs, ok := a.s.sink.(bindingSink); ok && !bs.tq.admits(f.Header) {
			// A headers binding the publication does not pass.
			if i == last {
				f.Release()
			}
			continue
		}
		g := f
		if i != last {
			g = f.Clone()
		}
		if a.isPeerSub() {
			ex.forwardPub(a, g)
			continue
		}
		bs, isQueue := a.s.sink.(bindingSink)
		if isQueue && (durable == nil || bs.tq.q.Pressure() > durable.q.Pressure()) {
			durable = bs.tq
		}
		g.Type, g.Flags, g.Ref, g.Attach, g.Aux, g.Name, g.Tag = wire.TypeMessage, 0, 0, a.id, 0, "", ""
		a.s.stats.Delivered.Add(0, 1)
		if isQueue && pc != nil {
			bs.enqueue(g, pc)
			continue
		}
		a.s.sink.Deliver(g)
	}
	if last < 0 {
		f.Release()
	}
	return durable
}

// maxCachedKey is the longest routing key the cache keeps: the cache's
// memory is bounded by maxCache times it, not by the frame size.
const maxCachedKey = 256

// publishConfirm answers a PUBLISH with flag Reply once the message is
// durable in every durable subscription's queue it was routed to: the
// publisher confirm of pub-sub, as a SUBMIT's is of tasks (see
// taskWatch). pending counts the holds: one per queue enqueued to, and
// the router's own until it has enqueued to them all, so that the answer
// waits for the last.
type publishConfirm struct {
	s        *Session
	ref      uint64
	exchange string
	pending  atomic.Int32
	failed   atomic.Pointer[wire.Error] // the first queue's store error
}

func newPublishConfirm(s *Session, ref uint64, exchange string) *publishConfirm {
	pc := &publishConfirm{s: s, ref: ref, exchange: exchange}
	pc.pending.Store(1)
	return pc
}

// hold counts one more queue to wait for.
func (pc *publishConfirm) hold() { pc.pending.Add(1) }

// stored releases a hold: queue has the message durably (err nil), or
// its store failed with err.
func (pc *publishConfirm) stored(queue string, err error) {
	if err != nil {
		pc.failed.CompareAndSwap(nil, wire.Errorf(wire.CodeStorage, "publish to %s: the message may not be durable in queue %s: %v", pc.exchange, queue, err))
	}
	if pc.pending.Add(-1) != 0 {
		return
	}
	if e := pc.failed.Load(); e != nil {
		pc.s.sendError(pc.ref, e)
		return
	}
	pc.s.reply(pc.ref, nil, nil)
}

// match returns the subscribers for key; the slice is shared, read-only.
func (ex *Exchange) match(key string) []*Attachment {
	ex.subMu.RLock()
	subs, ok := ex.cache[key]
	if !ok && len(key) > maxCachedKey {
		subs, ok = ex.subs.match(key, nil), true
	}
	ex.subMu.RUnlock()
	if ok {
		return subs
	}
	ex.subMu.Lock()
	defer ex.subMu.Unlock()
	if subs, ok = ex.cache[key]; ok {
		return subs
	}
	subs = ex.subs.match(key, nil)
	if len(ex.cache) >= maxCache {
		clear(ex.cache)
	}
	ex.cache[key] = subs
	return subs
}

// addPatterns subscribes a to patterns and returns all its patterns
// now. With check, patterns that would take a or its session past a
// limit are refused, all of them, with [wire.CodeTooManyPatterns].
// released is what a subscription request reserved for them (see
// [Exchange.reserve]), given back in any case.
func (ex *Exchange) addPatterns(a *Attachment, patterns []string, check bool, released int) ([]string, error) {
	ex.subMu.Lock()
	defer ex.subMu.Unlock()
	if a.gone.Load() || ex.subsClosed {
		ex.unreserveLocked(a, released)
		return nil, nil
	}
	fresh := ex.freshPatterns(a, patterns)
	if check {
		if err := ex.admit(a, len(fresh), released); err != nil {
			ex.unreserveLocked(a, released)
			return nil, err
		}
	} else {
		a.s.patterns.Add(int64(len(fresh) - released))
	}
	a.reserved -= released
	if len(fresh) == 0 {
		return slices.Clone(a.patterns), nil
	}
	nodes, mapped := ex.subs.nodes, ex.subs.mapped
	if len(a.patterns) == 0 {
		ex.nsubs++
	}
	for _, p := range fresh {
		ex.subs.insert(p, a)
	}
	a.patterns = append(a.patterns, fresh...)
	ex.b.countPatterns(fresh, 1, ex.subs.nodes-nodes, ex.subs.mapped-mapped)
	clear(ex.cache)
	ex.gainInterest(fresh)
	return slices.Clone(a.patterns), nil
}

// freshPatterns returns the patterns a is not subscribed to yet, each
// once; ex.subMu is held.
func (ex *Exchange) freshPatterns(a *Attachment, patterns []string) []string {
	var fresh []string
	var seen map[string]bool // past a few, so that a long list costs O(n)
	if len(patterns) > 16 {
		seen = make(map[string]bool, len(patterns))
	}
	for _, p := range patterns {
		if seen != nil && seen[p] || seen == nil && slices.Contains(fresh, p) || ex.subs.has(p, a) {
			continue
		}
		if seen != nil {
			seen[p] = true
		}
		fresh = append(fresh, p)
	}
	return fresh
}

// removePatterns unsubscribes a from patterns and returns all its
// patterns now.
func (ex *Exchange) removePatterns(a *Attachment, patterns []string) []string {
	ex.subMu.Lock()
	defer ex.subMu.Unlock()
	if len(a.patterns) == 0 {
		return nil
	}
	drop := make(map[string]bool, len(patterns))
	for _, p := range patterns {
		drop[p] = true
	}
	ex.dropPatternsLocked(a, func(p string) bool { return drop[p] })
	return slices.Clone(a.patterns)
}

// dropPatternsLocked unsubscribes a from the patterns that gone selects;
// ex.subMu is held.
func (ex *Exchange) dropPatternsLocked(a *Attachment, gone func(string) bool) {
	nodes, mapped := ex.subs.nodes, ex.subs.mapped
	var removed []string
	kept := a.patterns[:0]
	for _, p := range a.patterns {
		if gone(p) {
			ex.subs.remove(p, a)
			removed = append(removed, p)
		} else {
			kept = append(kept, p)
		}
	}
	if len(removed) == 0 {
		return
	}
	clear(a.patterns[len(kept):])
	a.patterns = kept
	peerSub := a.isPeerSub()
	if !peerSub {
		ex.loseInterest(removed)
	}
	if len(kept) == 0 {
		a.patterns = nil
		if !peerSub {
			ex.nsubs--
		}
	} else if cap(kept) >= minShrink && len(kept) <= cap(kept)/4 {
		a.patterns = slices.Clone(kept)
	}
	a.s.patterns.Add(-int64(len(removed)))
	ex.b.countPatterns(removed, -1, ex.subs.nodes-nodes, ex.subs.mapped-mapped)
	clear(ex.cache)
}

// removeAll unsubscribes a from everything, as it goes away, and refuses
// the subscription requests it has waiting.
func (ex *Exchange) removeAll(a *Attachment) {
	ex.subMu.Lock()
	ex.dropPatternsLocked(a, func(string) bool { return true })
	ex.subMu.Unlock()
	var gone []*subRequest
	ex.pendMu.Lock()
	for t, p := range ex.pending {
		if p.a == a {
			delete(ex.pending, t)
			gone = append(gone, p)
		}
	}
	ex.pendMu.Unlock()
	for _, p := range gone {
		ex.unreserve(p)
		p.s.sendError(p.ref, wire.Errorf(wire.CodeNotFound, "attachment %s detached before the controller decided", a.member))
	}
}

// subRequest is a subscription waiting for the controller's decision.
type subRequest struct {
	s          *Session
	a          *Attachment
	ref        uint64
	patterns   []string
	attach     bool // the subscriber's ATTACH waits on it
	controller *Attachment
	reserved   int // patterns counted against the limits meanwhile
	// remote is the node of the controller asked, when it is another
	// node's (see peer_control.go); tries counts the times it was asked.
	remote string
	tries  int
}

// requestSubscription asks the exchange's controller (its leader) whether
// a may subscribe to patterns. The subscriber's OK waits for the answer.
// Its patterns count against the limits while it waits: past one, it
// fails at once with [wire.CodeTooManyPatterns], and the controller is
// not asked.
func (ex *Exchange) requestSubscription(a *Attachment, ref uint64, patterns []string, attach bool) {
	p := &subRequest{s: a.s, a: a, ref: ref, patterns: patterns, attach: attach}
	n, err := ex.reserve(a, patterns)
	if err != nil {
		ex.fail(p, err)
		return
	}
	p.reserved = n
	ex.ask(p)
}

func (ex *Exchange) ask(p *subRequest) {
	p.remote = ""
	if node, member := ex.remoteController(); node != "" && ex.askRemote(p, node, member) {
		return
	}
	ctrl := ex.view.Load().leader
	if ctrl == nil {
		ex.refuse(p, "no controller is attached to exchange "+ex.name)
		return
	}
	p.controller = ctrl
	token := ex.b.nextSubReq.Add(1)
	ex.pendMu.Lock()
	ex.pending[token] = p
	ex.pendMu.Unlock()
	f := wire.NewFrame(wire.TypeSubRequest)
	f.Ref, f.Attach, f.Name = token, ctrl.id, p.a.member
	f.Body = jsonBody(wire.SubRequestBody{Member: p.a.info(), Patterns: p.patterns})
	ctrl.s.sink.Deliver(f)
}

func (ex *Exchange) refuse(p *subRequest, reason string) {
	ex.unreserve(p)
	ex.fail(p, wire.Errorf(wire.CodeRejected, "subscription refused: %s", reason))
}

// fail answers a subscription request with err; the ATTACH that waited
// on it leaves no attachment.
func (ex *Exchange) fail(p *subRequest, err error) {
	p.s.sendError(p.ref, err)
	if p.attach {
		p.a.gone.Store(true)
		p.s.forget(p.a)
		ex.removeAll(p.a) // what a controller may have subscribed it to meanwhile
	}
}

// controllerGone hands the subscription requests a controller left
// undecided to the new leader.
func (ex *Exchange) controllerGone(ctrl *Attachment) {
	var redo []*subRequest
	ex.pendMu.Lock()
	for t, p := range ex.pending {
		if p.controller == ctrl {
			delete(ex.pending, t)
			redo = append(redo, p)
		}
	}
	ex.pendMu.Unlock()
	for _, p := range redo {
		ex.ask(p)
	}
	ex.remoteControllerGone(ctrl)
}

// decide applies a controller's DECISION.
func (s *Session) decide(f *wire.Frame) {
	defer f.Release()
	s.mu.Lock()
	ctrl := s.attachments[f.Attach]
	s.mu.Unlock()
	if ctrl == nil || ctrl.role != wire.RoleController {
		s.sendError(0, wire.Errorf(wire.CodeNotFound, "decision: attachment %d is not a controller", f.Attach))
		return
	}
	ex := ctrl.ex
	ex.pendMu.Lock()
	p := ex.pending[f.Ref]
	delete(ex.pending, f.Ref)
	ex.pendMu.Unlock()
	if p == nil {
		// Another node's subscriber, or one that went away meanwhile.
		if err := ex.remoteDecision(f); err != nil {
			s.sendError(0, err)
		}
		return
	}
	if err := ex.settle(p, f.Aux, f.Tag, f.Body); err != nil {
		s.sendError(0, err)
	}
}

// settle applies a controller's verdict, reason and body (narrowed
// patterns) to subscription request p. The error, if any, is for the
// controller: its decision was bad, or the subscriber went past a limit.
func (ex *Exchange) settle(p *subRequest, verdict uint64, reason string, body []byte) error {
	patterns, err := checkDecision(verdict, body)
	if err != nil {
		ex.refuse(p, "the controller sent a bad decision")
		return err
	}
	if verdict == wire.VerdictRefuse {
		if reason == "" {
			reason = "refused by the controller"
		}
		ex.refuse(p, reason)
		return nil
	}
	if patterns == nil {
		patterns = p.patterns
	}
	now, err := ex.addPatterns(p.a, patterns, true, p.reserved)
	if err != nil {
		ex.fail(p, err)
		return wire.Errorf(wire.CodeTooManyPatterns, "decision for %s: %v", p.a.member, asWireError(err).Msg)
	}
	p.accepted(patterns, now)
	return nil
}

// checkDecision checks a DECISION's verdict and body, and returns the
// patterns it narrows to (nil: those asked).
func checkDecision(verdict uint64, body []byte) ([]string, error) {
	if verdict != wire.VerdictAccept && verdict != wire.VerdictRefuse {
		return nil, wire.Errorf(wire.CodeBadOptions, "decision: unknown verdict %d (0 accept, 1 refuse)", verdict)
	}
	if verdict == wire.VerdictRefuse || len(body) == 0 {
		return nil, nil
	}
	var pb wire.PatternsBody
	if err := json.Unmarshal(body, &pb); err != nil {
		return nil, wire.Errorf(wire.CodeBadOptions, "decision: bad body: %v", err)
	}
	if err := checkPatterns(pb.Patterns); err != nil {
		return nil, wire.Errorf(wire.CodeBadOptions, "decision: %v", err)
	}
	if pb.Patterns == nil {
		pb.Patterns = []string{}
	}
	return pb.Patterns, nil
}

// accepted answers a subscription request the controller accepted, once
// its patterns' interest is known cluster-wide; now are the subscriber's
// patterns.
func (p *subRequest) accepted(patterns, now []string) {
	p.a.ex.whenKnown(patterns, func() {
		if p.attach {
			p.s.reply(p.ref, jsonBody(wire.AttachResult{Member: p.a.member, Patterns: now}), nil)
		} else {
			p.s.reply(p.ref, jsonBody(wire.PatternsBody{Patterns: now}), nil)
		}
	})
}

// subscribe handles SUBSCRIBE and UNSUBSCRIBE, for oneself or, from a
// controller, on behalf of another attachment.
func (s *Session) subscribe(f *wire.Frame) {
	defer f.Release()
	var pb wire.PatternsBody
	if err := json.Unmarshal(f.Body, &pb); err != nil {
		s.sendError(f.Ref, wire.Errorf(wire.CodeBadOptions, "%s: bad body: %v", f.Type, err))
		return
	}
	if err := checkPatterns(pb.Patterns); err != nil {
		s.sendError(f.Ref, wire.Errorf(wire.CodeBadOptions, "%s: %v", f.Type, err))
		return
	}
	ref := f.Ref
	s.mu.Lock()
	self := s.attachments[f.Attach]
	s.mu.Unlock()
	if self == nil {
		s.sendError(f.Ref, wire.Errorf(wire.CodeNotFound, "%s: no attachment %d", f.Type, f.Attach))
		return
	}
	ex := self.ex
	target := self
	if f.Name != "" && f.Name != self.member {
		if self.role != wire.RoleController {
			s.sendError(f.Ref, wire.Errorf(wire.CodeNotAllowed, "%s: only a controller subscribes others", f.Type))
			return
		}
		target = s.b.member(f.Name)
		if target == nil && s.subscribeElsewhere(f, self, pb.Patterns) {
			return
		}
		if target == nil || target.ex != ex || target.role != wire.RoleSubscriber {
			s.sendError(f.Ref, wire.Errorf(wire.CodeNotFound, "%s: %q is not a subscriber of exchange %q", f.Type, f.Name, ex.name))
			return
		}
	} else if self.role != wire.RoleSubscriber {
		s.sendError(f.Ref, wire.Errorf(wire.CodeNotAllowed, "%s: attachment %d is not a subscriber", f.Type, f.Attach))
		return
	}
	if need := attachNeeds(self.role); (f.Type == wire.TypeSubscribe || target != self) && !s.allowed(need, ex.name) {
		s.sendError(f.Ref, s.deny(strings.ToLower(f.Type.String()), need, ex.name))
		return
	}
	if target.tq != nil {
		// A durable subscriber: its patterns are its subscription's.
		now, err := s.b.resubscribe(target, f.Type == wire.TypeSubscribe, pb.Patterns)
		if err != nil {
			s.sendError(f.Ref, err)
			return
		}
		known := pb.Patterns
		if f.Type == wire.TypeUnsubscribe {
			known = nil // an unsubscribe need not wait
		}
		ex.whenKnown(known, func() { s.reply(ref, jsonBody(wire.PatternsBody{Patterns: now}), nil) })
		return
	}
	if f.Type == wire.TypeSubscribe && target == self && ex.cfg.Controlled {
		ex.requestSubscription(self, f.Ref, pb.Patterns, false)
		return
	}
	var now []string
	if f.Type == wire.TypeSubscribe {
		var err error
		if now, err = ex.addPatterns(target, pb.Patterns, true, 0); err != nil {
			s.sendError(f.Ref, err)
			return
		}
	} else {
		now = ex.removePatterns(target, pb.Patterns)
	}
	known := pb.Patterns
	if f.Type == wire.TypeUnsubscribe {
		known = nil // an unsubscribe need not wait
	}
	ex.whenKnown(known, func() { s.reply(ref, jsonBody(wire.PatternsBody{Patterns: now}), nil) })
	if target != self {
		target.event(wire.EventSubscriptions, jsonBody(wire.EventBody{Patterns: now}))
	}
}
