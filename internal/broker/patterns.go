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
		a.patterns = nil
	}
	ex.b.countPatterns(nil, 0, -ex.subs.nodes, -ex.subs.mapped)
	ex.subs = newTopicTree()
	ex.subsClosed = true
	ex.cache = make(map[string][]*Attachment)
	ex.nsubs = 0
	return subs
}
