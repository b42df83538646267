package broker

import (
	"slices"

	"github.com/courier-mq/courier/wire"
)

// Subscription patterns are bounded per attachment and per session
// (Config.MaxPatternsPerAttachment, Config.MaxPatternsPerConnection) and
// counted node-wide, with an estimate of the memory they take. Each
// Attachment's patterns are its own count; a session's count is their
// sum, with the patterns its subscribers asked of a controller and wait
// for (subRequest.reserved); the broker's counts every pattern of every
// exchange, durable subscriptions' included.

// Estimates of the memory the patterns take (TestPatternBytesEstimate
// checks them against the heap):
const (
	// patternNodeBytes is one node of an exchange's topic tree (its
	// struct's size class).
	patternNodeBytes = 80
	// patternMappedBytes is a node's entry in its parent's map of
	// children, the room the map keeps to grow included.
	patternMappedBytes = 40
	// patternBytes is one pattern of one attachment, besides its text:
	// the text's header in the attachment's list and the attachment in
	// its node's subscribers.
	patternBytes = 48
)

// PatternStats are the node's subscription patterns.
type PatternStats struct {
	// Patterns counts the patterns of every subscriber, durable
	// subscriptions included; a pattern two subscribers share counts
	// twice.
	Patterns int64
	// Bytes estimates the memory they take: the topic trees' nodes, the
	// patterns' text and their places in the lists of their attachments.
	Bytes int64
}

// PatternStats returns the node's subscription patterns, from atomics.
func (b *Broker) PatternStats() PatternStats {
	return PatternStats{
		Patterns: b.patterns.Load(),
		Bytes: b.patternNodes.Load()*patternNodeBytes + b.patternMapped.Load()*patternMappedBytes +
			b.patterns.Load()*patternBytes + b.patternText.Load(),
	}
}

// countPatterns adds (sign 1) or removes (sign -1) patterns to the
// node's counts, and nodes tree nodes, mapped of them in maps.
func (b *Broker) countPatterns(patterns []string, sign int64, nodes, mapped int) {
	text := 0
	for _, p := range patterns {
		text += len(p)
	}
	b.patterns.Add(sign * int64(len(patterns)))
	b.patternText.Add(sign * int64(text))
	b.patternNodes.Add(int64(nodes))
	b.patternMapped.Add(int64(mapped))
}

// Patterns returns the number of patterns of the session's subscribers,
// those waiting for a controller's decision included.
func (s *Session) Patterns() int64 { return s.patterns.Load() }

// admit counts n more patterns for a, or fails with
// [wire.CodeTooManyPatterns] when that would take a or its session past
// a limit; released of them were reserved already (see reserve), and
// are released by the caller whether admit succeeds or not. ex.subMu
// is held.
func (ex *Exchange) admit(a *Attachment, n, released int) error {
	if n == 0 && released == 0 {
		return nil
	}
	cfg := &ex.b.cfg
	if have := len(a.patterns) + a.reserved - released; n > 0 && have+n > cfg.MaxPatternsPerAttachment {
		return wire.Errorf(wire.CodeTooManyPatterns, "subscribe %s: %d more patterns would pass the attachment's limit of %d (it has %d)",
			a.member, n, cfg.MaxPatternsPerAttachment, have)
	}
	delta := int64(n - released)
	for {
		have := a.s.patterns.Load()
		if delta > 0 && have+delta > int64(cfg.MaxPatternsPerConnection) {
			return wire.Errorf(wire.CodeTooManyPatterns, "subscribe %s: %d more patterns would pass the connection's limit of %d (it has %d)",
				a.member, n, cfg.MaxPatternsPerConnection, have-int64(released))
		}
		if a.s.patterns.CompareAndSwap(have, have+delta) {
			return nil
		}
	}
}

// reserve counts the patterns of a subscription request against the
// limits while the controller decides, and returns how many it counted
// (those a has not already).
func (ex *Exchange) reserve(a *Attachment, patterns []string) (int, error) {
	ex.subMu.Lock()
	defer ex.subMu.Unlock()
	n := len(ex.freshPatterns(a, patterns))
	if err := ex.admit(a, n, 0); err != nil {
		return 0, err
	}
	a.reserved += n
	return n, nil
}

// unreserve gives back what a subscription request reserved.
func (ex *Exchange) unreserve(p *subRequest) {
	ex.subMu.Lock()
	ex.unreserveLocked(p.a, p.reserved)
	ex.subMu.Unlock()
	p.reserved = 0
}

// unreserveLocked gives back n patterns reserved for a; ex.subMu is held.
func (ex *Exchange) unreserveLocked(a *Attachment, n int) {
	if n == 0 {
		return
	}
	a.reserved -= n
	a.s.patterns.Add(-int64(n))
}

// checkPatternCount refuses, before anything is attached, the patterns
// of an ATTACH that are more than one attachment may have.
func (b *Broker) checkPatternCount(patterns []string) error {
	max := b.cfg.MaxPatternsPerAttachment
	if len(patterns) <= max {
		return nil
	}
	distinct := slices.Clone(patterns)
	slices.Sort(distinct)
	if n := len(slices.Compact(distinct)); n > max {
		return wire.Errorf(wire.CodeTooManyPatterns, "attach: %d patterns, over an attachment's limit of %d", n, max)
	}
	return nil
}

// closeSubs drops every subscription of a deleted exchange and returns
// its subscribers; their patterns no longer count.
func (ex *Exchange) closeSubs() []*Attachment {
	ex.subMu.Lock()
	defer ex.subMu.Unlock()
	subs := ex.subs.all()
	for _, a := range subs {
		a.s.patterns.Add(-int64(len(a.patterns)))
		ex.b.countPatterns(a.patterns, -1, 0, 0)
		if a.isPeerSub() {
			a.gone.Store(true) // another node's: nothing to tell it
			ex.b.ps.counterOf(a.s.peer.node).patterns.Add(-int64(len(a.patterns)))
		}
		a.patterns = nil
	}
	subs = slices.DeleteFunc(subs, (*Attachment).isPeerSub)
	ex.closeInterest()
	ex.b.countPatterns(nil, 0, -ex.subs.nodes, -ex.subs.mapped)
	// Emptied in place: ex.subs itself never changes once set, since
	// code outside subMu reads it to tell a pub-sub exchange.
	*ex.subs = *newTopicTree()
	ex.subsClosed = true
	ex.cache = make(map[string][]*Attachment)
	ex.nsubs = 0
	return subs
}

// A durable subscription's patterns are those of its binding (see
// taskQueue.bind), which the subscription's queue holds whether a
// subscriber is attached or not; they are bounded like one attachment's.
// While attached, each of its subscribers counts them against its
// connection too: Attachment.bound is how many it counted, kept equal to
// the binding's by syncBounds whenever the binding changes. The number
// of durable subscriptions is bounded node-wide
// (Config.MaxDurableSubscriptions).

// chargeBound counts n patterns, those of a durable subscription's
// binding, for its subscriber a in place of those a counted before, or
// fails with [wire.CodeTooManyPatterns] when that would take a's
// connection past its limit. A nil a counts nothing. a is not yet a
// consumer of its queue, or the queue's attachMu is held.
func (b *Broker) chargeBound(a *Attachment, n int, what string) error {
	if a == nil {
		return nil
	}
	delta := int64(n - a.bound)
	for {
		have := a.s.patterns.Load()
		if max := int64(b.cfg.MaxPatternsPerConnection); delta > 0 && have+delta > max {
			return wire.Errorf(wire.CodeTooManyPatterns, "%s: the durable subscription's %d patterns would pass the connection's limit of %d (it has %d)",
				what, n, max, have-int64(a.bound))
		}
		if a.s.patterns.CompareAndSwap(have, have+delta) {
			a.bound = n
			return nil
		}
	}
}

// uncharge gives back what a counted for its durable subscription's
// binding; nil or not a durable subscriber, it does nothing. As for
// chargeBound, a is not a consumer or its queue's attachMu is held.
func uncharge(a *Attachment) {
	if a != nil && a.bound != 0 {
		a.s.patterns.Add(-int64(a.bound))
		a.bound = 0
	}
}

// syncBound makes a count n patterns for its durable subscription, the
// binding's now, whatever its connection's limit: only the subscriber
// that changes a binding is checked (chargeBound). The queue's attachMu
// is held.
func syncBound(a *Attachment, n int) {
	a.s.patterns.Add(int64(n - a.bound))
	a.bound = n
}

// syncBounds makes every subscriber attached to durable subscription tq
// count its binding's patterns as they are now.
func (tq *taskQueue) syncBounds() {
	tq.attachMu.Lock()
	defer tq.attachMu.Unlock()
	n := tq.boundPatterns()
	for a := range tq.consumers {
		if a.role == wire.RoleSubscriber {
			syncBound(a, n)
		}
	}
}

// boundPatterns returns the number of patterns of tq's binding.
func (tq *taskQueue) boundPatterns() int {
	tq.defMu.Lock()
	defer tq.defMu.Unlock()
	return len(tq.def.Patterns)
}

// releaseBound gives back what a, a durable subscriber that is not a
// consumer of its queue, counted for the queue's binding.
func (tq *taskQueue) releaseBound(a *Attachment) {
	tq.attachMu.Lock()
	uncharge(a)
	tq.attachMu.Unlock()
}
