package broker

import (
	"cmp"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/wire"
)

// Pub-sub across nodes: the node is the mediator (docs/cluster.md).
//
// Each node counts, per pub-sub exchange, its local subscribers of each
// pattern (Exchange.interest; durable subscriptions are local
// subscribers of their node) and tells the other nodes only when a
// pattern gains its first (RSUB) or loses its last (RUNSUB), and its
// whole table when a link comes up. A node installs another's patterns
// as the patterns of one stand-in subscriber per exchange (peerSub),
// an attachment of that node's peer session: matching a publication
// yields it at most once, however many of the node's patterns match,
// and fanout sends it one RPUB, which that node fans out to its own
// subscribers only (one hop).
//
// An RSUB carries a number, the link's count of RSUBs, that its
// RSUBACK echoes once the interest is in place; as the control link is
// FIFO both ways, an RSUBACK acknowledges every RSUB sent before it. A
// subscribe whose pattern gained its first local subscriber answers
// once every node that was up has acknowledged it, or gone down
// (interestWait): a publication anywhere after that reaches it.
//
// Lock order: Exchange.subMu → pubsubCluster.mu → psPeer.mu →
// interestWait.mu. Waits' callbacks (replies to subscribers) run with
// no lock held.

// pubsubCluster is the broker's state of pub-sub across nodes.
type pubsubCluster struct {
	mu    sync.RWMutex       // guards peers, ops
	peers map[string]*psPeer // the nodes whose links are up
	// counters are each node's link counters, kept across its links'
	// ups and downs (by node name: *psCounters).
	counters sync.Map
	// ops are SUBSCRIBE or UNSUBSCRIBE of another node's member by a
	// local controller, waiting for that node's answer (see
	// peer_control.go).
	ops map[uint64]*memberOp
	// maxWait is maxInterestWait; tests shorten it.
	maxWait time.Duration

	// earlyMu orders interest for an exchange this node does not know
	// yet with the exchange's declaration here (see holdEarly).
	earlyMu sync.Mutex
	// early is the interest of other nodes in exchanges this node does
	// not know yet, by exchange and node: in a cluster a declaration
	// reaches the nodes one by one, and a subscriber's node may tell of
	// its interest before another node applied the declaration. It is
	// installed when the exchange is declared here, before anyone here
	// can publish to it. earlyN counts its patterns per node, bounded
	// by MaxPatternsPerPeer.
	early  map[string]map[string][]string
	earlyN map[string]int
	// earlyCtrl holds the controller ads of other nodes for exchanges
	// this node does not know yet, by exchange and node.
	earlyCtrl map[[2]string]ctrlAd
}

// psPeer is one node's link, for pub-sub.
type psPeer struct {
	p *peer
	c *psCounters

	mu    sync.Mutex // guards seq, down, waits; orders RSUB numbers as sent
	seq   uint64     // the last RSUB number sent
	down  bool
	waits []pendingAck // in seq order
	// asks counts the patterns of its RSUBREQs waiting here for a
	// controller (at least 1 each), bounded by MaxPatternsPerPeer.
	asks atomic.Int64
}

// isDown reports whether pp's links went down.
func (pp *psPeer) isDown() bool {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.down
}

// pendingAck is a wait for the RSUBACK of RSUB number need.
type pendingAck struct {
	need uint64
	w    *interestWait
}

// psCounters are one node link's pub-sub counters.
type psCounters struct {
	pubsSent, pubBytesSent, pubsReceived, pubBytesReceived atomic.Uint64
	subsSent, unsubsSent, subsReceived, unsubsReceived     atomic.Uint64
	unknown, refused                                       atomic.Uint64
	patterns, collapsed                                    atomic.Int64
	// seq is the last RSUB number sent to the node: a link coming up
	// numbers on from it, so that an RSUBACK of an earlier link can
	// never end a wait of this one.
	seq atomic.Uint64
}

// PeerPubSubStats are the pub-sub counters of the links to one node of
// the cluster, since this node started.
type PeerPubSubStats struct {
	// Node is the other node's name; Up whether its links are up now.
	Node string `json:"node"`
	Up   bool   `json:"up"`
	// PubsSent and PubsReceived count RPUB frames, one per publication
	// and interested node; the bytes are their keys, headers and
	// bodies.
	PubsSent         uint64 `json:"rpub_sent"`
	PubBytesSent     uint64 `json:"rpub_bytes_sent"`
	PubsReceived     uint64 `json:"rpub_received"`
	PubBytesReceived uint64 `json:"rpub_bytes_received"`
	// SubsSent, UnsubsSent, SubsReceived and UnsubsReceived count RSUB
	// and RUNSUB frames (a frame carries one or more patterns).
	SubsSent       uint64 `json:"rsub_sent"`
	UnsubsSent     uint64 `json:"runsub_sent"`
	SubsReceived   uint64 `json:"rsub_received"`
	UnsubsReceived uint64 `json:"runsub_received"`
	// DroppedUnknown counts frames from the node (publications and
	// interest) dropped because this node does not know their exchange,
	// or knows it with another pattern.
	DroppedUnknown uint64 `json:"dropped_unknown_exchange"`
	// Refused counts frames from the node dropped as malformed (a bad
	// pattern, a bad body).
	Refused uint64 `json:"refused"`
	// Patterns is the number of the node's patterns installed here now;
	// Collapsed the number of exchanges where they went past
	// Config.MaxPatternsPerPeer and became '#'.
	Patterns  int64 `json:"patterns"`
	Collapsed int64 `json:"collapsed"`
}

// PeerPubSubStats returns the pub-sub counters of every node this node
// had a link to, sorted by node.
func (b *Broker) PeerPubSubStats() []PeerPubSubStats {
	var out []PeerPubSubStats
	b.ps.mu.RLock()
	up := maps.Clone(b.ps.peers)
	b.ps.mu.RUnlock()
	b.ps.counters.Range(func(k, v any) bool {
		c := v.(*psCounters)
		node := k.(string)
		out = append(out, PeerPubSubStats{
			Node: node, Up: up[node] != nil,
			PubsSent: c.pubsSent.Load(), PubBytesSent: c.pubBytesSent.Load(),
			PubsReceived: c.pubsReceived.Load(), PubBytesReceived: c.pubBytesReceived.Load(),
			SubsSent: c.subsSent.Load(), UnsubsSent: c.unsubsSent.Load(),
			SubsReceived: c.subsReceived.Load(), UnsubsReceived: c.unsubsReceived.Load(),
			DroppedUnknown: c.unknown.Load(), Refused: c.refused.Load(),
			Patterns: c.patterns.Load(), Collapsed: c.collapsed.Load(),
		})
		return true
	})
	slices.SortFunc(out, func(a, b PeerPubSubStats) int {
		if a.Node < b.Node {
			return -1
		}
		if a.Node > b.Node {
			return 1
		}
		return 0
	})
	return out
}

// counterOf returns node's counters, made on first use.
func (ps *pubsubCluster) counterOf(node string) *psCounters {
	if v, ok := ps.counters.Load(node); ok {
		return v.(*psCounters)
	}
	v, _ := ps.counters.LoadOrStore(node, &psCounters{})
	return v.(*psCounters)
}

// hasPeerLinks reports whether the broker has node links: a node alone
// keeps no interest table.
func (b *Broker) hasPeerLinks() bool { return b.peerLinks.Load() != nil }

// psLivePeers returns the pub-sub links up now.
func (b *Broker) psLivePeers() []*psPeer {
	b.ps.mu.RLock()
	defer b.ps.mu.RUnlock()
	if len(b.ps.peers) == 0 {
		return nil
	}
	return slices.Collect(maps.Values(b.ps.peers))
}

// psPeer returns node's pub-sub link, or nil when it is down.
func (b *Broker) psPeer(node string) *psPeer {
	b.ps.mu.RLock()
	defer b.ps.mu.RUnlock()
	return b.ps.peers[node]
}

// psSend sends f on pp's control link and takes ownership of it.
// An RSUB or an RCTRL gets the link's next number as its Ref and, with
// w, makes w wait for its RSUBACK. It reports whether f was sent.
func (b *Broker) psSend(pp *psPeer, f *wire.Frame, w *interestWait) bool {
	links := b.peerLinks.Load()
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.down || links == nil {
		f.Release()
		return false
	}
	typ := f.Type
	acked := typ == wire.TypeRSub || typ == wire.TypeRCtrl
	if acked {
		pp.seq++
		f.Ref = pp.seq
		pp.c.seq.Store(pp.seq)
	}
	if err := (*links).SendControl(pp.p.node, f); err != nil {
		return false // the link is down: PeerDown follows
	}
	if acked && w != nil && w.hold() {
		pp.waits = append(pp.waits, pendingAck{need: pp.seq, w: w})
	}
	switch typ {
	case wire.TypeRSub:
		pp.c.subsSent.Add(1)
	case wire.TypeRUnsub:
		pp.c.unsubsSent.Add(1)
	}
	return true
}

// localInterest is the local interest in one pattern of an exchange.
type localInterest struct {
	n int // local subscribers, durable subscriptions included
	// wait is the RSUB that made it known to the other nodes, until
	// they all acknowledged it.
	wait *interestWait
}

// interestWait waits for the RSUBACKs of an RSUB sent to several nodes:
// one hold per node, and its creator's until it has sent to them all.
type interestWait struct {
	mu      sync.Mutex
	pending int
	done    bool
	then    []func()
}

func newInterestWait() *interestWait { return &interestWait{pending: 1} }

// hold counts one more node to wait for; false once the wait is over.
func (w *interestWait) hold() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return false
	}
	w.pending++
	return true
}

// release counts one node less; the last runs the callbacks.
func (w *interestWait) release() {
	w.mu.Lock()
	if w.pending--; w.pending > 0 || w.done {
		w.mu.Unlock()
		return
	}
	w.done = true
	then := w.then
	w.then = nil
	w.mu.Unlock()
	for _, f := range then {
		f()
	}
}

// onDone calls f once the wait is over: now if it is.
func (w *interestWait) onDone(f func()) {
	w.mu.Lock()
	if !w.done {
		w.then = append(w.then, f)
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	f()
}

// maxPatternsPerFrame bounds the patterns of one RSUB or RUNSUB this
// node sends, so that a large table goes in frames of bounded size.
const maxPatternsPerFrame = 4096

// gainInterest counts a local subscriber more for each of patterns
// (fresh for it) and tells the other nodes of those that gained their
// first; ex.subMu is held.
func (ex *Exchange) gainInterest(patterns []string) {
	if !ex.b.hasPeerLinks() || len(patterns) == 0 {
		return
	}
	var first []string
	if ex.interest == nil {
		// Never announced: every pattern is a first, a's fresh ones
		// included (they are in the tree already).
		first = slices.Sorted(maps.Keys(ex.buildInterestLocked()))
	} else {
		for _, p := range patterns {
			li := ex.interest[p]
			if li == nil {
				li = &localInterest{}
				ex.interest[p] = li
				first = append(first, p)
			}
			li.n++
		}
	}
	if len(first) == 0 {
		return
	}
	w := ex.announce(wire.TypeRSub, first)
	for _, p := range first {
		ex.interest[p].wait = w
	}
}

// buildInterestLocked makes the exchange's interest table from its
// local subscribers: the table is kept only once the node has links
// (see hasPeerLinks), and subscribers may be older, such as durable
// subscriptions brought back from the store before the node joined its
// cluster. ex.subMu is held.
func (ex *Exchange) buildInterestLocked() map[string]*localInterest {
	ex.interest = make(map[string]*localInterest)
	for _, a := range ex.subs.all() {
		if a.isPeerSub() {
			continue
		}
		for _, p := range a.patterns {
			li := ex.interest[p]
			if li == nil {
				li = &localInterest{}
				ex.interest[p] = li
			}
			li.n++
		}
	}
	return ex.interest
}

// loseInterest counts a local subscriber less for each of patterns and
// tells the other nodes of those that lost their last; ex.subMu is held.
func (ex *Exchange) loseInterest(patterns []string) {
	if ex.interest == nil {
		return
	}
	var last []string
	for _, p := range patterns {
		li := ex.interest[p]
		if li == nil {
			continue
		}
		if li.n--; li.n <= 0 {
			delete(ex.interest, p)
			last = append(last, p)
		}
	}
	if len(last) > 0 {
		ex.announce(wire.TypeRUnsub, last)
	}
}

// announce sends an RSUB or RUNSUB of patterns to every node up, and
// returns, for an RSUB, the wait for their RSUBACKs (nil if no node is
// up); ex.subMu is held, which orders the announcements of an exchange.
func (ex *Exchange) announce(typ wire.Type, patterns []string) *interestWait {
	peers := ex.b.psLivePeers()
	if len(peers) == 0 {
		return nil
	}
	var w *interestWait
	if typ == wire.TypeRSub {
		w = newInterestWait()
		defer w.release()
	}
	for chunk := range slices.Chunk(patterns, maxPatternsPerFrame) {
		body := jsonBody(wire.PatternsBody{Patterns: chunk})
		for _, pp := range peers {
			f := wire.NewFrame(typ)
			f.Name, f.Body = ex.name, body
			ex.b.psSend(pp, f, w)
		}
	}
	return w
}

// whenKnown calls then once the local interest in patterns is known to
// every node that was up when it began (or that node went down): at
// once on a node alone, or when every pattern's RSUB was acknowledged.
// A subscribe calls it before its OK.
func (ex *Exchange) whenKnown(patterns []string, then func()) {
	if !ex.b.hasPeerLinks() {
		then()
		return
	}
	var waits []*interestWait
	ex.subMu.RLock()
	for _, p := range patterns {
		if li := ex.interest[p]; li != nil && li.wait != nil && !slices.Contains(waits, li.wait) {
			waits = append(waits, li.wait)
		}
	}
	ex.subMu.RUnlock()
	if len(waits) == 0 {
		then()
		return
	}
	var once sync.Once
	wait := cmp.Or(ex.b.ps.maxWait, maxInterestWait)
	timer := time.AfterFunc(wait, func() {
		ex.b.log.Warn("a subscribe answers without every node's acknowledgement", "exchange", ex.name, "waited", wait)
		once.Do(then)
	})
	var left atomic.Int32
	left.Store(int32(len(waits)))
	for _, w := range waits {
		w.onDone(func() {
			if left.Add(-1) == 0 {
				timer.Stop()
				once.Do(then)
			}
		})
	}
}

// maxInterestWait bounds a subscribe's wait for the other nodes'
// RSUBACKs: a node that keeps its link up but never answers (a bug, or
// a hostile node) cannot hold a subscriber for longer. A silent node's
// link is cut well before (its heartbeats).
const maxInterestWait = 5 * time.Second

// peerSub is another node's aggregated subscription to an exchange: an
// attachment of its peer session, never in the session's attachments
// nor among the broker's members, subscribed to that node's patterns.
type peerSub struct {
	a *Attachment
	// collapsed is set once the node's patterns went past
	// MaxPatternsPerPeer: the stand-in is subscribed to '#' and ignores
	// the node's RSUB and RUNSUB until its link comes up again.
	collapsed bool
}

// isPeerSub reports whether a stands in for another node.
func (a *Attachment) isPeerSub() bool { return a.s.peer != nil && a.role == wire.RoleSubscriber }

// installLocked subscribes pp's stand-in on ex to patterns; ex.subMu is
// held.
func (ex *Exchange) installLocked(pp *psPeer, patterns []string) {
	if ex.subsClosed || pp.isDown() {
		return // pubsubPeerDown marks it down before it takes its stand-ins
	}
	if ex.peerSubs == nil {
		ex.peerSubs = make(map[string]*peerSub)
	}
	si := ex.peerSubs[pp.p.node]
	if si != nil && si.a.s != pp.p.s {
		ex.uninstallLocked(&psPeer{p: si.a.s.peer, c: pp.c}, nil) // an earlier link's
		si = nil
	}
	if si == nil {
		a := &Attachment{s: pp.p.s, member: "node " + pp.p.node, ex: ex, role: wire.RoleSubscriber}
		si = &peerSub{a: a}
		ex.peerSubs[pp.p.node] = si
	}
	if si.collapsed {
		return
	}
	fresh := ex.freshPatterns(si.a, patterns)
	if len(fresh) == 0 {
		return
	}
	if len(si.a.patterns)+len(fresh) > ex.b.cfg.MaxPatternsPerPeer {
		ex.b.log.Warn("a node's patterns passed the limit: it now gets every publication of the exchange",
			"node", pp.p.node, "exchange", ex.name, "limit", ex.b.cfg.MaxPatternsPerPeer)
		ex.uninstallLocked(pp, nil)
		si.collapsed = true
		ex.peerSubs[pp.p.node] = si
		pp.c.collapsed.Add(1)
		fresh = []string{"#"}
	}
	ex.insertLocked(si.a, fresh)
	pp.c.patterns.Add(int64(len(fresh)))
}

// insertLocked subscribes a stand-in to fresh patterns; ex.subMu is held.
func (ex *Exchange) insertLocked(a *Attachment, fresh []string) {
	nodes, mapped := ex.subs.nodes, ex.subs.mapped
	for _, p := range fresh {
		ex.subs.insert(p, a)
	}
	a.patterns = append(a.patterns, fresh...)
	a.s.patterns.Add(int64(len(fresh)))
	ex.b.countPatterns(fresh, 1, ex.subs.nodes-nodes, ex.subs.mapped-mapped)
	clear(ex.cache)
}

// uninstallLocked unsubscribes pp's stand-in on ex from patterns, from
// all of them with nil, and forgets it once it has none; ex.subMu is
// held.
func (ex *Exchange) uninstallLocked(pp *psPeer, patterns []string) {
	si := ex.peerSubs[pp.p.node]
	if si == nil || si.collapsed && patterns != nil {
		return
	}
	before := len(si.a.patterns)
	if patterns == nil {
		ex.dropPatternsLocked(si.a, func(string) bool { return true })
	} else {
		drop := make(map[string]bool, len(patterns))
		for _, p := range patterns {
			drop[p] = true
		}
		ex.dropPatternsLocked(si.a, func(p string) bool { return drop[p] })
	}
	pp.c.patterns.Add(int64(len(si.a.patterns) - before))
	if len(si.a.patterns) == 0 {
		if si.collapsed {
			pp.c.collapsed.Add(-1)
		}
		delete(ex.peerSubs, pp.p.node)
	}
}

// forwardPub sends g, a publication of ex matched for stand-in a, to a's
// node as an RPUB, and takes ownership of it.
func (ex *Exchange) forwardPub(a *Attachment, g *wire.Frame) {
	g.Type, g.Flags, g.Ref, g.Attach, g.Aux, g.Name, g.Tag = wire.TypeRPub, 0, 0, 0, 0, ex.name, ""
	c := ex.b.ps.counterOf(a.s.peer.node)
	c.pubsSent.Add(1)
	c.pubBytesSent.Add(pubBytes(g))
	a.s.sink.Deliver(g)
}

// pubBytes is what an RPUB counts in bytes: key, headers and body.
func pubBytes(f *wire.Frame) uint64 {
	n := len(f.Key) + len(f.Body)
	for k, v := range f.Header {
		n += len(k) + len(v)
	}
	return uint64(n)
}

// localOnly returns subs without the stand-ins of other nodes: a
// publication from another node is fanned out here to local
// subscribers only. subs is shared; a new slice is made only when it
// holds a stand-in.
func localOnly(subs []*Attachment) []*Attachment {
	for i, a := range subs {
		if !a.isPeerSub() {
			continue
		}
		out := make([]*Attachment, 0, len(subs)-1)
		out = append(out, subs[:i]...)
		for _, a := range subs[i+1:] {
			if !a.isPeerSub() {
				out = append(out, a)
			}
		}
		return out
	}
	return subs
}

// peerPubSub handles a pub-sub node-link frame from p.
func (b *Broker) peerPubSub(p *peer, f *wire.Frame) {
	pp := b.psPeer(p.node)
	if pp == nil || pp.p != p {
		f.Release()
		return
	}
	switch f.Type {
	case wire.TypeRPub:
		b.remotePublish(pp, f)
	case wire.TypeRSub, wire.TypeRUnsub:
		b.remoteInterest(pp, f)
	case wire.TypeRSubAck:
		b.interestAcked(pp, f.Ref)
		f.Release()
	default:
		b.peerControl(pp, f)
	}
}

// remotePublish fans a publication from another node out to the local
// subscribers only, in the order the link brought it.
func (b *Broker) remotePublish(pp *psPeer, f *wire.Frame) {
	pp.c.pubsReceived.Add(1)
	pp.c.pubBytesReceived.Add(pubBytes(f))
	ex := b.Exchange(f.Name)
	if ex == nil || ex.subs == nil {
		pp.c.unknown.Add(1)
		f.Release()
		return
	}
	ex.fanoutTo(f, nil, localOnly(ex.match(f.Key)))
}

// remoteInterest installs (RSUB) or removes (RUNSUB) another node's
// patterns, and acknowledges an RSUB once they are in place.
func (b *Broker) remoteInterest(pp *psPeer, f *wire.Frame) {
	defer f.Release()
	sub := f.Type == wire.TypeRSub
	if sub {
		pp.c.subsReceived.Add(1)
		defer b.ackInterest(pp, f.Ref)
	} else {
		pp.c.unsubsReceived.Add(1)
	}
	ex := b.Exchange(f.Name)
	if ex == nil && f.Aux != rsubResend && b.holdEarly(pp, f) {
		return
	}
	if ex == nil || ex.subs == nil {
		pp.c.unknown.Add(1)
		return
	}
	if sub && f.Aux == rsubResend {
		ex.sendTable(pp)
		return
	}
	var pb wire.PatternsBody
	if err := json.Unmarshal(f.Body, &pb); err != nil || checkPatterns(pb.Patterns) != nil {
		pp.c.refused.Add(1)
		b.log.Warn("bad interest from a node dropped", "node", pp.p.node, "type", f.Type, "exchange", f.Name)
		return
	}
	ex.subMu.Lock()
	defer ex.subMu.Unlock()
	if sub {
		ex.installLocked(pp, pb.Patterns)
	} else if len(pb.Patterns) > 0 {
		ex.uninstallLocked(pp, pb.Patterns)
	}
}

// holdEarly keeps interest f of pp in an exchange this node does not
// know, for when it is declared here; it reports whether it took f (the
// exchange is still unknown under earlyMu, and the bound holds).
func (b *Broker) holdEarly(pp *psPeer, f *wire.Frame) bool {
	var pb wire.PatternsBody
	if err := json.Unmarshal(f.Body, &pb); err != nil || checkPatterns(pb.Patterns) != nil || !ValidName(f.Name) {
		return false
	}
	ps := &b.ps
	ps.earlyMu.Lock()
	defer ps.earlyMu.Unlock()
	if b.Exchange(f.Name) != nil {
		return false // declared meanwhile: handled as known
	}
	node := pp.p.node
	held := ps.early[f.Name][node]
	if f.Type == wire.TypeRUnsub {
		if len(held) == 0 {
			return true
		}
		kept := slices.DeleteFunc(slices.Clone(held), func(p string) bool { return slices.Contains(pb.Patterns, p) })
		ps.earlyN[node] -= len(held) - len(kept)
		ps.setEarly(f.Name, node, kept)
		return true
	}
	fresh := slices.DeleteFunc(slices.Clone(pb.Patterns), func(p string) bool { return slices.Contains(held, p) })
	if ps.earlyN[node]+len(fresh) > b.cfg.MaxPatternsPerPeer {
		pp.c.refused.Add(1)
		return false
	}
	if ps.early == nil {
		ps.early, ps.earlyN = make(map[string]map[string][]string), make(map[string]int)
	}
	ps.earlyN[node] += len(fresh)
	ps.setEarly(f.Name, node, append(held, fresh...))
	return true
}

// setEarly sets node's held patterns of exchange; earlyMu is held.
func (ps *pubsubCluster) setEarly(exchange, node string, patterns []string) {
	if len(patterns) == 0 {
		delete(ps.early[exchange], node)
		if len(ps.early[exchange]) == 0 {
			delete(ps.early, exchange)
		}
		return
	}
	if ps.early[exchange] == nil {
		ps.early[exchange] = make(map[string][]string)
	}
	ps.early[exchange][node] = patterns
}

// declareHeld makes ex visible with store, once the interest held for it
// is installed: a publication here can then never miss it. store
// reports whether ex was added (another exchange of its name may have
// been first).
func (b *Broker) declareHeld(ex *Exchange, store func() bool) {
	ps := &b.ps
	ps.earlyMu.Lock()
	defer ps.earlyMu.Unlock()
	held := ps.early[ex.name]
	if ex.subs != nil && len(held) > 0 {
		ex.subMu.Lock()
		for node, patterns := range held {
			if pp := b.psPeer(node); pp != nil {
				ex.installLocked(pp, patterns)
			}
		}
		ex.subMu.Unlock()
	}
	var ads []ctrlAd
	for key, ad := range ps.earlyCtrl {
		if key[0] == ex.name {
			ads = append(ads, ad)
		}
	}
	if ex.cfg.Controlled && len(ads) > 0 {
		ex.pendMu.Lock()
		if ex.ctrl.ads == nil {
			ex.ctrl.ads = make(map[string]ctrlAd)
		}
		for _, ad := range ads {
			if b.psPeer(ad.node) != nil {
				ex.ctrl.ads[ad.node] = ad
			}
		}
		ex.pendMu.Unlock()
	}
	if store() {
		for node, patterns := range held {
			ps.earlyN[node] -= len(patterns)
		}
		delete(ps.early, ex.name)
		for _, ad := range ads {
			delete(ps.earlyCtrl, [2]string{ex.name, ad.node})
			ps.earlyN[ad.node]--
		}
	}
}

// dropEarly forgets what node's interest was held.
func (b *Broker) dropEarly(node string) {
	ps := &b.ps
	ps.earlyMu.Lock()
	defer ps.earlyMu.Unlock()
	for name, nodes := range ps.early {
		if _, ok := nodes[node]; ok {
			ps.setEarly(name, node, nil)
		}
	}
	for key := range ps.earlyCtrl {
		if key[1] == node {
			delete(ps.earlyCtrl, key)
		}
	}
	delete(ps.earlyN, node)
}

// rsubResend is the Aux of an RSUB that asks for the receiving node's
// table of its exchange, and carries no patterns: the sending node just
// declared the exchange, and may have dropped interest in it before.
const rsubResend = 1

// pubsubDeclared asks the other nodes for their interest in ex, a
// pub-sub exchange this node just declared: what they sent before it
// existed here was dropped.
func (b *Broker) pubsubDeclared(ex *Exchange) {
	if ex.subs == nil || !b.hasPeerLinks() {
		return
	}
	for _, pp := range b.psLivePeers() {
		f := wire.NewFrame(wire.TypeRSub)
		f.Name, f.Aux = ex.name, rsubResend
		b.psSend(pp, f, nil)
	}
}

// ackInterest sends the RSUBACK of RSUB number ref.
func (b *Broker) ackInterest(pp *psPeer, ref uint64) {
	if ref == 0 {
		return
	}
	f := wire.NewFrame(wire.TypeRSubAck)
	f.Ref = ref
	b.psSend(pp, f, nil)
}

// interestAcked ends the waits for the RSUBs up to number ref.
func (b *Broker) interestAcked(pp *psPeer, ref uint64) {
	pp.mu.Lock()
	i := 0
	for i < len(pp.waits) && pp.waits[i].need <= ref {
		i++
	}
	done := slices.Clone(pp.waits[:i])
	pp.waits = slices.Delete(pp.waits, 0, i)
	pp.mu.Unlock()
	for _, pa := range done {
		pa.w.release()
	}
}

// pubsubPeerUp sends p the whole interest table of every exchange, and
// the controllers it must know of. A subscribe still waiting for the
// other nodes waits for p too.
func (b *Broker) pubsubPeerUp(p *peer) {
	pp := &psPeer{p: p, c: b.ps.counterOf(p.node)}
	pp.seq = pp.c.seq.Load()
	b.ps.mu.Lock()
	if b.ps.peers == nil {
		b.ps.peers = make(map[string]*psPeer)
	}
	b.ps.peers[p.node] = pp
	b.ps.mu.Unlock()
	b.exchanges.Range(func(_, v any) bool {
		if ex := v.(*Exchange); ex.subs != nil {
			ex.sendTable(pp)
			ex.advertiseTo(pp)
		}
		return true
	})
}

// sendTable sends pp every pattern ex has local interest in.
func (ex *Exchange) sendTable(pp *psPeer) {
	var last *interestWait
	defer func() {
		if last != nil {
			last.release() // with no lock held: it may end waits
		}
	}()
	ex.subMu.Lock()
	defer ex.subMu.Unlock()
	if ex.interest == nil && !ex.subsClosed {
		ex.buildInterestLocked()
	}
	if len(ex.interest) == 0 {
		return
	}
	patterns := slices.Sorted(maps.Keys(ex.interest))
	chunks := slices.Collect(slices.Chunk(patterns, maxPatternsPerFrame))
	for i, chunk := range chunks {
		f := wire.NewFrame(wire.TypeRSub)
		f.Name, f.Body = ex.name, jsonBody(wire.PatternsBody{Patterns: chunk})
		var w *interestWait
		if i == len(chunks)-1 {
			// Its RSUBACK comes once the whole table is in place: the
			// RSUBs still unacknowledged wait for it too, and so does a
			// new subscriber of a pattern already known elsewhere.
			w = newInterestWait()
			for _, li := range ex.interest {
				if li.wait != nil && li.wait.hold() {
					w.onDone(li.wait.release)
				} else {
					li.wait = w
				}
			}
		}
		ex.b.psSend(pp, f, w)
		last = w
	}
}

// pubsubPeerDown forgets p: its stand-ins leave their exchanges, the
// subscribes waiting for its RSUBACK wait no more, and what waited on
// it for inverted pub-sub is redone or failed.
func (b *Broker) pubsubPeerDown(p *peer) {
	b.ps.mu.Lock()
	pp := b.ps.peers[p.node]
	if pp != nil && pp.p == p {
		delete(b.ps.peers, p.node)
	} else {
		pp = nil
	}
	b.ps.mu.Unlock()
	if pp == nil {
		return
	}
	pp.mu.Lock()
	pp.down = true
	waits := pp.waits
	pp.waits = nil
	pp.mu.Unlock()
	b.dropEarly(p.node)
	for _, pa := range waits {
		pa.w.release()
	}
	b.exchanges.Range(func(_, v any) bool {
		if ex := v.(*Exchange); ex.subs != nil {
			ex.subMu.Lock()
			ex.uninstallLocked(pp, nil)
			ex.subMu.Unlock()
			ex.controlPeerDown(pp)
		}
		return true
	})
	b.memberOpsPeerDown(pp)
}

// closeInterest tells the other nodes that ex, deleted, has no local
// interest left, and forgets their stand-ins; ex.subMu is held.
func (ex *Exchange) closeInterest() {
	if len(ex.interest) > 0 {
		ex.announce(wire.TypeRUnsub, slices.Sorted(maps.Keys(ex.interest)))
	}
	for node, si := range ex.peerSubs {
		if si.collapsed {
			ex.b.ps.counterOf(node).collapsed.Add(-1)
		}
	}
	ex.interest, ex.peerSubs = nil, nil
}
