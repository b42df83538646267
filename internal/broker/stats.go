package broker

import (
	"github.com/courier-mq/courier/wire"
)

// Read-only accessors for the management API (internal/admin). They read
// live counters with atomic loads and take at most a short read lock; none
// waits on a goroutine or scans messages.

// RangeExchanges calls fn for every exchange, in no particular order,
// until fn returns false. It takes no lock; an exchange declared or
// deleted meanwhile may or may not be seen.
func (b *Broker) RangeExchanges(fn func(*Exchange) bool) {
	b.exchanges.Range(func(_, v any) bool { return fn(v.(*Exchange)) })
}

// ExchangeVersion returns a number that changes whenever an exchange is
// declared or deleted: a list of exchanges taken after reading version v
// is still the whole set while ExchangeVersion returns v.
func (b *Broker) ExchangeVersion() uint64 { return b.exVersion.Load() }

// Sessions appends every open session to dst, in no particular order, and
// returns it.
func (b *Broker) Sessions(dst []*Session) []*Session {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, s := range b.sessions {
		dst = append(dst, s)
	}
	return dst
}

// SessionByID returns the open session whose id is id (such as "n1/c7"),
// or nil.
func (b *Broker) SessionByID(id string) *Session {
	node, n, ok := parseConnID(id)
	if !ok || node != b.cfg.Node {
		return nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if s := b.sessions[n]; s != nil && s.id == id {
		return s
	}
	return nil
}

// AttachmentCount returns the number of attachments of every session.
func (b *Broker) AttachmentCount() int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.members)
}

// Requests returns how many requests were routed through the exchange
// (a redirected request counts at every exchange it passes).
func (ex *Exchange) Requests() uint64 {
	if ex.requests == nil {
		return 0
	}
	return ex.requests.Load()
}

// Latency returns the histogram of the requests answered through a
// request-response exchange, from their arrival to their last response;
// nil for other patterns. A redirected request counts at the exchange
// whose handler answered it.
func (ex *Exchange) Latency() *Latency { return ex.latency }

// Publishes returns how many messages were published to the exchange.
func (ex *Exchange) Publishes() uint64 { return ex.publishes.Load() }

// Leader returns the member id of the exchange's leader, or "". It takes
// no lock.
func (ex *Exchange) Leader() string {
	if l := ex.view.Load().leader; l != nil {
		return l.member
	}
	return ""
}

// MemberCount returns the number of members (handlers of a
// request-response exchange, controllers of a pub-sub one). It takes no
// lock.
func (ex *Exchange) MemberCount() int { return len(ex.view.Load().all.members) }

// Members returns the members, oldest (the leader) first.
func (ex *Exchange) Members() []wire.Member {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	members := make([]wire.Member, len(ex.members))
	for i, a := range ex.members {
		members[i] = a.info()
	}
	return members
}

// Subscribers returns the number of subscribers of a pub-sub exchange.
func (ex *Exchange) Subscribers() int {
	if ex.subs == nil {
		return 0
	}
	ex.subMu.RLock()
	defer ex.subMu.RUnlock()
	return ex.nsubs
}

// Number returns the session's sequence number: 7 for "n1/c7" (and for
// "n1/c3-7"). Sessions opened later have higher numbers.
func (s *Session) Number() uint64 { return s.n }

// Sink returns the sink the session was opened with: for the management
// API to ask the transport (a network connection, an in-process one) what
// it knows of the peer.
func (s *Session) Sink() Sink { return s.sink }

// Inflight returns the number of requests the session has in flight as a
// requester.
func (s *Session) Inflight() int64 {
	var n int64
	for i := range s.requests.shard {
		n += s.requests.shard[i].n.Load()
	}
	return n
}

// Routes returns how many subscribers a publication with key would reach
// now on a pub-sub exchange (0 on another kind): the management API's
// publish answers {"routed": ...} with it.
func (ex *Exchange) Routes(key string) int {
	if ex.subs == nil {
		return 0
	}
	return len(ex.match(key))
}
