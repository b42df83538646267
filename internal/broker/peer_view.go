package broker

import (
	"cmp"
	"encoding/json"
	"slices"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/wire"
)

// Views of request-response exchanges across nodes (docs/cluster.md).
//
// Each request-response exchange has a home node, named by
// Config.Home. The home owns the member list: every member with its
// node, tags, options and a seniority key, oldest first, and the leader,
// whom it appoints. It publishes each change as a versioned view (RVIEW)
// to every node, itself included. A member that attaches or detaches on
// another node is reported to the home (RATTACH, RDETACH), which
// publishes the next view; until then it is routable on its own node
// only.
//
// Every node builds its routing members from the last view: its own
// attachments, and a stand-in for each member of another node whose
// link is up, an attachment of that node's peer session (peer.go). It
// tells its own members the events the change of view means, so that
// members on every node get the same events in the same order.
//
// The leader is valid on a node only while the view comes from the
// exchange's current home, the link to the home has not gone down since,
// and the node's lease holds (Config.LeaseValid); otherwise its members
// get a leader event with no leader, and leader requests fail with "no
// handler". Every view carries the fencing token (epoch, term): the
// home's epoch from Config.Home, and the exchange's term, one more at
// each appointment.

// rrCluster is the broker's state of request-response across nodes.
type rrCluster struct {
	// nextStandin numbers stand-ins; their attachment ids are it with
	// the top bit set, apart from any other attachment of a peer session.
	nextStandin atomic.Uint32
	// lease is the last answer of Config.LeaseValid seen by checkLease,
	// leaseKnown whether there is one.
	lease, leaseKnown atomic.Bool
}

// maxViewMembers bounds the members of a view or report from a peer.
const maxViewMembers = 1 << 16

// viewMember is a member as views and reports carry it.
type viewMember struct {
	wire.Member
	// Key is its seniority: lower is older. A member attaching gets its
	// attach time (unix ns), or one more than the youngest member's key
	// at the home, whichever is larger; a new home orders the members
	// reported to it by these keys, so that the oldest stays oldest.
	Key int64 `json:"key"`
}

// viewBody is the JSON body of RVIEW; its Aux is the view's version.
type viewBody struct {
	Epoch   uint64       `json:"epoch"`
	Term    uint64       `json:"term"`
	Leader  string       `json:"leader,omitempty"`
	Members []viewMember `json:"members"`
}

// reportBody is the JSON body of RATTACH.
type reportBody struct {
	// Full says Members are all the sender's members of the exchange,
	// sent when its home changes or its link to the home comes up: the
	// home drops the sender's others. An empty full report asks for the
	// view.
	Full bool `json:"full,omitempty"`
	// Term is the last term the sender saw, so that a new home never
	// appoints under a smaller one.
	Term    uint64       `json:"term,omitempty"`
	Members []viewMember `json:"members"`
}

// clusterEx is a request-response exchange's state in a cluster,
// guarded by the exchange's mu.
type clusterEx struct {
	// home and homeEpoch are what Config.Home last said.
	home      string
	homeEpoch uint64

	// The view applied last, and the node it came from.
	from         string
	epoch, ver   uint64
	term         uint64
	leader       string
	entries      []viewMember
	stale, valid bool // stale: the home's link went down since; valid: its leader holds here
	leaderAtt    *Attachment

	locals   []*Attachment          // this node's members, in attach order
	standins map[string]*Attachment // by member id
	hs       *homeState             // while this node is the home
	body     []byte                 // the last view published as home

	// confirmed is the latest version of the home's view that every
	// node linked to the home has applied; waiting holds the ATTACH
	// OKs of local members not yet in a confirmed view.
	confirmed uint64
	waiting   map[*Attachment]func()
	// leaving holds the DETACH OKs of local members until a confirmed
	// view no longer lists them.
	leaving map[*Attachment]*goneWait
}

// goneWait is a held DETACH OK: ver is the first view of the home that
// no longer listed the member, 0 until one came.
type goneWait struct {
	ver uint64
	ok  func()
}

// homeState is the member list the home node keeps.
type homeState struct {
	ver, term uint64
	leader    string
	members   []viewMember      // by key, node, id
	acked     map[string]uint64 // the latest version each node applied
}

// viewState is what a node's members were told of a view.
type viewState struct {
	entries     []viewMember
	leader      string
	epoch, term uint64
}

func (b *Broker) clustered() bool { return b.peerLinks.Load() != nil }

// clusterMode reports whether ex's members are kept by views: a
// request-response exchange of a broker with node links.
func (ex *Exchange) clusterMode() bool {
	return ex.cfg.Pattern == wire.PatternReqResp && ex.b.clustered()
}

func (b *Broker) homeOf(name string) (string, uint64) {
	if b.cfg.Home != nil {
		return b.cfg.Home(name)
	}
	return b.cfg.Node, 0
}

func (b *Broker) leaseValid() bool { return b.cfg.LeaseValid == nil || b.cfg.LeaseValid() }

// sendControl sends f on the control link to node; a link that is down
// drops it (the peer's coming up resends what it needs).
func (b *Broker) sendControl(node string, f *wire.Frame) {
	p := b.peerLinks.Load()
	if p == nil {
		f.Release()
		return
	}
	_ = (*p).SendControl(node, f)
}

// cluster returns ex's cluster state, made on first use; ex.mu is held.
func (ex *Exchange) cluster() *clusterEx {
	if ex.cl != nil {
		return ex.cl
	}
	home, epoch := ex.b.homeOf(ex.name)
	cl := &clusterEx{home: home, homeEpoch: epoch, standins: make(map[string]*Attachment)}
	ex.cl = cl
	now := time.Now().UnixNano()
	for _, a := range ex.members { // attached before the broker had links
		if a.s.peer == nil {
			a.node, a.key = ex.b.cfg.Node, now
			cl.locals = append(cl.locals, a)
		}
	}
	if home == ex.b.cfg.Node {
		cl.hs = &homeState{term: ex.b.firstTerm()}
		for _, a := range cl.locals {
			cl.hs.add(a.viewMember())
		}
		ex.publish()
		return cl
	}
	ex.rebuildCluster()
	ex.report(true, cl.locals)
	return cl
}

// clusterDeclared runs once ex is declared here: its home publishes a
// first view, another node asks the home for it.
func (b *Broker) clusterDeclared(ex *Exchange) {
	if !ex.clusterMode() {
		return
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if !ex.closed {
		ex.cluster()
	}
}

func (a *Attachment) viewMember() viewMember {
	return viewMember{Member: a.info(), Key: a.key}
}

// clusterJoin adds a local member a; ex.mu is held.
func (ex *Exchange) clusterJoin(a *Attachment) {
	cl := ex.cluster()
	a.node, a.key = ex.b.cfg.Node, time.Now().UnixNano()
	cl.locals = append(cl.locals, a)
	if hs := cl.hs; hs != nil {
		m := a.viewMember()
		m.Key = max(m.Key, hs.youngest()+1)
		a.key = m.Key
		hs.add(m)
		ex.publish()
		return
	}
	ex.rebuildCluster()
	ex.report(false, []*Attachment{a})
}

// clusterLeave removes a, a local member or a stand-in, from routing;
// ex.mu is held.
func (ex *Exchange) clusterLeave(a *Attachment) {
	cl := ex.cl
	if a.s.peer != nil {
		// Its node's session closed: the home's next view says more.
		if cl.standins[a.member] == a {
			delete(cl.standins, a.member)
		}
		ex.rebuildCluster()
		return
	}
	i := slices.Index(cl.locals, a)
	if i < 0 {
		return
	}
	cl.locals = slices.Delete(cl.locals, i, i+1)
	if ok := cl.waiting[a]; ok != nil {
		delete(cl.waiting, a)
		ok()
	}
	if cl.hs != nil && cl.hs.remove(a.member, ex.b.cfg.Node) {
		ex.publish()
		return
	}
	ex.rebuildCluster()
	if cl.hs == nil {
		f := wire.NewFrame(wire.TypeRDetach)
		f.Name, f.Tag = ex.name, a.member
		ex.b.sendControl(cl.home, f)
	}
}

// report tells the home of list, this node's members; full says they
// are all of them. ex.mu is held.
func (ex *Exchange) report(full bool, list []*Attachment) {
	cl := ex.cl
	body := reportBody{Full: full, Term: cl.term, Members: make([]viewMember, len(list))}
	for i, a := range list {
		body.Members[i] = a.viewMember()
	}
	f := wire.NewFrame(wire.TypeRAttach)
	f.Name, f.Body = ex.name, jsonBody(body)
	ex.b.sendControl(cl.home, f)
}

// firstTerm is where this node's terms start when it becomes a home:
// above every term of its earlier boots ((Boot-1)<<32), since a home
// restarted within its lease keeps its epoch but forgets the terms it
// gave, and a token must never be given twice. Terms of one boot stay
// below the next boot's start (2^32 appointments).
func (b *Broker) firstTerm() uint64 { return (max(b.cfg.Boot, 1) - 1) << 32 }

// publish appoints a leader if there is none, and applies and sends the
// home's next view; ex.mu is held and this node is the home.
func (ex *Exchange) publish() {
	cl, hs := ex.cl, ex.cl.hs
	if hs.leader != "" && hs.index(hs.leader) < 0 {
		hs.leader = ""
	}
	if hs.leader == "" && len(hs.members) > 0 && ex.b.leaseValid() {
		hs.leader = hs.members[0].ID
		hs.term++
	}
	hs.ver++
	body := viewBody{Epoch: cl.homeEpoch, Term: hs.term, Leader: hs.leader, Members: slices.Clone(hs.members)}
	cl.body = jsonBody(body)
	ex.applyView(ex.b.cfg.Node, hs.ver, body)
	for _, n := range ex.b.PeerNodes() {
		ex.sendView(n)
	}
	ex.confirm()
}

// sendView sends node the view this home published last.
func (ex *Exchange) sendView(node string) {
	cl := ex.cl
	if cl.hs == nil || cl.body == nil {
		return
	}
	f := wire.NewFrame(wire.TypeRView)
	f.Name, f.Aux, f.Body = ex.name, cl.hs.ver, cl.body
	ex.b.sendControl(node, f)
}

// state returns what the members were told of the current view.
func (cl *clusterEx) state() viewState {
	return viewState{entries: cl.entries, leader: cl.validLeader(), epoch: cl.epoch, term: cl.term}
}

func (cl *clusterEx) validLeader() string {
	if cl.valid {
		return cl.leader
	}
	return ""
}

// applyView makes body, version ver from node from, the exchange's view
// here and tells the local members; ex.mu is held.
func (ex *Exchange) applyView(from string, ver uint64, body viewBody) {
	cl := ex.cl
	old := cl.state()
	cl.from, cl.epoch, cl.ver, cl.term, cl.leader, cl.entries = from, body.Epoch, ver, body.Term, body.Leader, body.Members
	cl.stale = false
	self := ex.b.cfg.Node
	locals := make(map[string]*Attachment, len(cl.locals))
	for _, a := range cl.locals {
		locals[a.member] = a
	}
	for _, e := range cl.entries {
		if a := locals[e.ID]; a != nil && e.Node == self {
			a.key = e.Key // its seniority as the home keeps it
			delete(locals, e.ID)
		}
	}
	var missing []*Attachment
	for _, a := range cl.locals {
		if locals[a.member] == a {
			missing = append(missing, a)
		}
	}
	for _, e := range cl.entries {
		if a := ex.localMember(e); a != nil && a.inView == 0 {
			a.inView = ver
		}
	}
	if len(cl.leaving) > 0 {
		listed := make(map[string]bool, len(cl.entries))
		for _, e := range cl.entries {
			listed[e.ID] = true
		}
		for a, w := range cl.leaving {
			if w.ver == 0 && !listed[a.member] {
				w.ver = ver
			}
		}
	}
	cl.valid = ex.viewValid()
	ex.rebuildCluster()
	ex.announceView(old)
	if cl.hs == nil && from == cl.home {
		f := wire.NewFrame(wire.TypeRViewAck)
		f.Name, f.Aux = ex.name, ver
		ex.b.sendControl(from, f)
	}
	if cl.hs == nil && len(missing) > 0 {
		// Attached since, or dropped while the home lost this node.
		ex.report(false, missing)
	}
}

// viewValid reports whether the leader of the current view holds here.
func (ex *Exchange) viewValid() bool {
	cl := ex.cl
	if cl.stale || cl.from != cl.home || cl.epoch != cl.homeEpoch || !ex.b.leaseValid() {
		return false
	}
	return cl.home == ex.b.cfg.Node || ex.b.peer(cl.home) != nil
}

// revalidate tells the members if the leader's validity changed; ex.mu
// is held.
func (ex *Exchange) revalidate() {
	cl := ex.cl
	valid := ex.viewValid()
	if cl.hs == nil && (cl.stale || ex.b.peer(cl.home) == nil) {
		ex.releaseOKs(true) // the home is out of reach: no confirmation is coming
	}
	if valid == cl.valid {
		return
	}
	old := cl.state()
	cl.valid = valid
	ex.rebuildCluster()
	ex.announceView(old)
	if !valid && old.leader != "" {
		ex.b.log.Info("leader no longer valid here", "exchange", ex.name, "leader", old.leader, "home", cl.home)
	}
}

// rebuildCluster computes the routing members from the view, the local
// members and the links up; ex.mu is held.
func (ex *Exchange) rebuildCluster() {
	cl := ex.cl
	self := ex.b.cfg.Node
	locals := make(map[string]*Attachment, len(cl.locals))
	for _, a := range cl.locals {
		locals[a.member] = a
	}
	list := make([]*Attachment, 0, len(cl.entries)+len(cl.locals))
	remote := make(map[string]bool)
	for _, e := range cl.entries {
		if e.Node == self {
			if a := locals[e.ID]; a != nil {
				list = append(list, a)
				delete(locals, e.ID)
			}
			continue
		}
		remote[e.ID] = true
		if a := ex.standin(e); a != nil {
			list = append(list, a)
		}
	}
	for _, a := range cl.locals {
		if locals[a.member] == a { // not in the view yet: youngest
			list = append(list, a)
		}
	}
	for id, a := range cl.standins {
		if !remote[id] {
			dropStandin(a)
			delete(cl.standins, id)
		}
	}
	ex.members = list
	cl.leaderAtt = nil
	if l := cl.validLeader(); l != "" {
		for _, a := range list {
			if a.member == l {
				cl.leaderAtt = a
			}
		}
	}
	ex.rebuild()
}

// standin returns the stand-in of remote member e, made if needed, or
// nil while e's node is not linked; ex.mu is held.
func (ex *Exchange) standin(e viewMember) *Attachment {
	cl := ex.cl
	a := cl.standins[e.ID]
	p := ex.b.peer(e.Node)
	if a != nil && p != nil && a.s == p.s && !a.gone.Load() && a.node == e.Node &&
		a.serviceTag == e.ServiceTag && a.connTag == e.ConnTag {
		a.key = e.Key
		return a
	}
	if a != nil {
		dropStandin(a)
		delete(cl.standins, e.ID)
	}
	if p == nil {
		return nil
	}
	id := 1<<31 | ex.b.rr.nextStandin.Add(1)&(1<<31-1)
	a = &Attachment{
		s: p.s, id: id, member: e.ID, ex: ex, role: wire.RoleHandler,
		serviceTag: e.ServiceTag, connTag: e.ConnTag, options: e.Options,
		node: e.Node, key: e.Key, stripe: uint32(p.s.n) + id,
		countBusy: ex.cfg.Strategy == LeastBusy,
	}
	p.s.mu.Lock()
	if p.s.closed {
		p.s.mu.Unlock()
		return nil
	}
	p.s.attachments[a.id] = a
	p.s.mu.Unlock()
	cl.standins[e.ID] = a
	return a
}

// dropStandin takes a stand-in out of its peer session. Requests in
// flight to it stay: its node answers them (with "handler gone" if the
// member left), or their failure comes when the node's session closes.
func dropStandin(a *Attachment) {
	a.gone.Store(true)
	a.s.mu.Lock()
	if a.s.attachments[a.id] == a {
		delete(a.s.attachments, a.id)
	}
	a.s.mu.Unlock()
}

// announceView sends the local members the events that the change from old
// to the current view means, as a node alone would for the same joins
// and leaves: member-down for each member gone, member-up for each
// member come (leader instead when the leader changed), leader to a new
// member and to everyone when the leader or its token changed. ex.mu is
// held.
func (ex *Exchange) announceView(old viewState) {
	cl := ex.cl
	was := make(map[string]bool, len(old.entries))
	for _, e := range old.entries {
		was[e.ID] = true
	}
	is := make(map[string]bool, len(cl.entries))
	for _, e := range cl.entries {
		is[e.ID] = true
	}
	var to []*Attachment // local members in the view
	fresh := make(map[*Attachment]bool)
	for _, a := range cl.locals {
		if is[a.member] {
			to = append(to, a)
			if !was[a.member] {
				fresh[a] = true
			}
		}
	}
	if len(to) == 0 {
		return
	}
	leader := cl.validLeader()
	changed := leader != old.leader || (leader != "" && (cl.epoch != old.epoch || cl.term != old.term))
	members := make([]wire.Member, len(cl.entries))
	for i, e := range cl.entries {
		members[i] = e.Member
	}
	body := func(m *wire.Member) []byte {
		return jsonBody(wire.EventBody{Leader: leader, Members: members, Member: m, Epoch: cl.epoch, Term: cl.term})
	}
	var last *wire.Member
	for i := range old.entries {
		if e := &old.entries[i]; !is[e.ID] {
			last = &e.Member
			ev := body(last)
			for _, a := range to {
				if !fresh[a] {
					a.event(wire.EventMemberDown, ev)
				}
			}
		}
	}
	for i := range cl.entries {
		if e := &cl.entries[i]; !was[e.ID] {
			last = &e.Member
			if changed {
				continue
			}
			ev := body(last)
			for _, a := range to {
				if !fresh[a] {
					a.event(wire.EventMemberUp, ev)
				}
			}
		}
	}
	if !changed && len(fresh) == 0 {
		return
	}
	ev := body(last)
	for _, a := range to {
		if changed || fresh[a] {
			a.event(wire.EventLeader, ev)
		}
	}
	if changed && leader != "" {
		ex.b.log.Info("leader appointed", "exchange", ex.name, "leader", leader, "epoch", cl.epoch, "term", cl.term)
	}
}

// recheckHome follows a change of Config.Home's answer for ex; ex.mu is
// held. A node that becomes the home builds the member list from its
// last view (the members of nodes it still reaches) and its own
// members, ordered by seniority, and appoints the oldest under the next
// term; the other nodes report their members to it in full.
func (ex *Exchange) recheckHome() {
	cl := ex.cl
	home, epoch := ex.b.homeOf(ex.name)
	self := ex.b.cfg.Node
	if home == cl.home && epoch == cl.homeEpoch {
		if hs := cl.hs; hs != nil && hs.leader == "" && len(hs.members) > 0 && ex.b.leaseValid() {
			ex.publish() // the lease came back: appoint
			return
		}
		ex.revalidate()
		return
	}
	ex.b.log.Info("exchange re-homed", "exchange", ex.name, "from", cl.home, "to", home, "epoch", epoch)
	cl.home, cl.homeEpoch = home, epoch
	// Versions start again under the new home.
	ex.releaseOKs(true)
	cl.confirmed = 0
	for _, a := range cl.locals {
		a.inView = 0
	}
	if home != self {
		cl.hs = nil
		ex.revalidate()
		ex.report(true, cl.locals)
		return
	}
	hs := &homeState{term: max(cl.term, ex.b.firstTerm())}
	for _, e := range cl.entries {
		if e.Node != self && ex.b.peer(e.Node) != nil {
			hs.add(e)
		}
	}
	for _, a := range cl.locals {
		hs.add(a.viewMember())
	}
	cl.hs = hs
	ex.publish()
}

// RecheckHomes makes the broker read Config.Home and Config.LeaseValid
// again for every request-response exchange: the metadata layer calls
// it when it re-homes exchanges or a lease changes. Peers coming and
// going, and the sweep (for the lease), call it too.
func (b *Broker) RecheckHomes() {
	if !b.clustered() {
		return
	}
	b.eachReqResp(func(ex *Exchange) {
		ex.cluster()
		ex.recheckHome()
	})
}

// checkLease runs RecheckHomes when Config.LeaseValid's answer changed.
func (b *Broker) checkLease() {
	if !b.clustered() || b.cfg.LeaseValid == nil {
		return
	}
	v := b.leaseValid()
	if b.rr.leaseKnown.Load() && b.rr.lease.Load() == v {
		return
	}
	b.rr.lease.Store(v)
	b.rr.leaseKnown.Store(true)
	b.RecheckHomes()
}

// eachReqResp runs fn on every request-response exchange, under its mu.
func (b *Broker) eachReqResp(fn func(ex *Exchange)) {
	b.exchanges.Range(func(_, v any) bool {
		ex := v.(*Exchange)
		if ex.cfg.Pattern != wire.PatternReqResp {
			return true
		}
		ex.mu.Lock()
		if !ex.closed {
			fn(ex)
		}
		ex.mu.Unlock()
		return true
	})
}

// rrPeerUp tells p what it must know: the views this node is home of,
// and this node's members of the exchanges p is home of.
func (b *Broker) rrPeerUp(p *peer) {
	b.eachReqResp(func(ex *Exchange) {
		cl := ex.cluster()
		ex.recheckHome()
		switch {
		case cl.hs != nil:
			ex.sendView(p.node)
		case cl.home == p.node:
			ex.report(true, cl.locals)
		}
		ex.rebuildCluster()
	})
}

// rrPeerDown drops p's members: from the member list where this node is
// the home (appointing the next leader at once if p's member led), from
// routing everywhere; where p is the home, its leader is no longer valid
// here.
func (b *Broker) rrPeerDown(p *peer) {
	b.eachReqResp(func(ex *Exchange) {
		cl := ex.cl
		if cl == nil {
			return
		}
		if cl.home == p.node {
			// Whatever the home says next counts, even under a lower
			// version: it may have restarted.
			cl.stale = true
			cl.confirmed = 0
			for _, a := range cl.locals {
				a.inView = 0
			}
		}
		if cl.hs != nil && cl.hs.removeNode(p.node) {
			ex.publish()
		} else {
			ex.rebuildCluster()
		}
		if cl.hs != nil {
			delete(cl.hs.acked, p.node)
			ex.confirm() // p's applying is no longer waited for
		}
		ex.recheckHome()
	})
}

// peerView handles an RVIEW from p.
func (b *Broker) peerView(p *peer, f *wire.Frame) {
	defer f.Release()
	ex := b.Exchange(f.Name)
	if ex == nil || !ex.clusterMode() {
		return
	}
	var body viewBody
	if err := json.Unmarshal(f.Body, &body); err != nil || !validMembers(body.Members, "") {
		b.log.Warn("bad view from a peer node", "node", p.node, "exchange", f.Name, "err", err)
		return
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.closed {
		return
	}
	cl := ex.cluster()
	ex.recheckHome()
	if cl.home != p.node || body.Epoch != cl.homeEpoch {
		return // not from this exchange's home, as this node knows it
	}
	if !cl.stale && cl.from == p.node && cl.epoch == body.Epoch && f.Aux < cl.ver {
		return // older than the view applied
	}
	ex.applyView(p.node, f.Aux, body)
}

// peerAttach handles an RATTACH from p, at the home.
func (b *Broker) peerAttach(p *peer, f *wire.Frame) {
	defer f.Release()
	ex := b.Exchange(f.Name)
	if ex == nil || !ex.clusterMode() {
		return
	}
	var body reportBody
	if err := json.Unmarshal(f.Body, &body); err != nil || !validMembers(body.Members, p.node) {
		b.log.Warn("bad member report from a peer node", "node", p.node, "exchange", f.Name, "err", err)
		return
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.closed {
		return
	}
	cl := ex.cluster()
	hs := cl.hs
	if hs == nil {
		return // not the home here: the sender will report to the right one
	}
	changed := false
	if body.Term > hs.term {
		// A term seen under an earlier home, which this one missed: the
		// leader's token must be larger than any before it.
		hs.term = body.Term + 1
		changed = true
	}
	if body.Full {
		keep := make(map[string]bool, len(body.Members))
		for _, m := range body.Members {
			keep[m.ID] = true
		}
		for i := 0; i < len(hs.members); {
			if m := hs.members[i]; m.Node == p.node && !keep[m.ID] {
				hs.members = slices.Delete(hs.members, i, i+1)
				changed = true
				continue
			}
			i++
		}
	}
	for _, m := range body.Members {
		if hs.index(m.ID) >= 0 {
			continue
		}
		if !body.Full {
			m.Key = max(m.Key, hs.youngest()+1)
		}
		hs.add(m)
		changed = true
	}
	if changed {
		ex.publish()
	} else if body.Full {
		ex.sendView(p.node)
	}
}

// peerDetach handles an RDETACH from p, at the home.
func (b *Broker) peerDetach(p *peer, f *wire.Frame) {
	defer f.Release()
	ex := b.Exchange(f.Name)
	if ex == nil || !ex.clusterMode() {
		return
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.closed || ex.cl == nil || ex.cl.hs == nil {
		return
	}
	if ex.cl.hs.remove(f.Tag, p.node) {
		ex.publish()
	}
}

// localMember returns the local member e names, or nil.
func (ex *Exchange) localMember(e viewMember) *Attachment {
	if e.Node != ex.b.cfg.Node {
		return nil
	}
	for _, a := range ex.cl.locals {
		if a.member == e.ID {
			return a
		}
	}
	return nil
}

// attachWait bounds how long an ATTACH's OK waits for every node to
// route to the new member.
const attachWait = 5 * time.Second

// awaitView holds the OK of local member a's ATTACH, ok, until every
// node linked to the exchange's home has applied a view that lists a,
// so that a requester on any node reaches a once its ATTACH returned,
// as on a node alone. It reports whether it holds ok; it does not on a
// node alone, nor once that is so already. The OK goes anyway after
// attachWait, or when the home is out of reach.
func (ex *Exchange) awaitView(a *Attachment, ok func()) bool {
	if ex.cfg.Pattern != wire.PatternReqResp {
		return false
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	cl := ex.cl
	if cl == nil || !slices.Contains(cl.locals, a) || ex.confirmedMember(a) || ex.homeLost() {
		return false
	}
	if cl.waiting == nil {
		cl.waiting = make(map[*Attachment]func())
	}
	// The timer's callback waits for ex.mu, held here, so it finds the
	// entry; the entry stops the timer, so that an answered wait does
	// not keep the exchange for attachWait.
	t := time.AfterFunc(attachWait, func() {
		ex.mu.Lock()
		defer ex.mu.Unlock()
		if cl := ex.cl; cl != nil {
			if ok := cl.waiting[a]; ok != nil {
				delete(cl.waiting, a)
				ok()
			}
		}
	})
	cl.waiting[a] = func() { t.Stop(); ok() }
	return true
}

// awaitGone holds the OK of local member a's DETACH, ok, until every
// node linked to the home has applied a view without a, so that no
// request routed afterwards reaches it, as on a node alone. It reports
// whether it holds ok, with the same bounds as awaitView.
func (ex *Exchange) awaitGone(a *Attachment, ok func()) bool {
	if ex.cfg.Pattern != wire.PatternReqResp || !ex.isMemberRole(a.role) {
		return false
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	cl := ex.cl
	if cl == nil || ex.homeLost() {
		return false
	}
	w := &goneWait{}
	if cl.hs != nil {
		w.ver = cl.hs.ver // the home published the view without a already
		if cl.confirmed >= w.ver {
			return false
		}
	}
	if cl.leaving == nil {
		cl.leaving = make(map[*Attachment]*goneWait)
	}
	cl.leaving[a] = w
	t := time.AfterFunc(attachWait, func() {
		ex.mu.Lock()
		defer ex.mu.Unlock()
		if cl := ex.cl; cl != nil && cl.leaving[a] == w {
			delete(cl.leaving, a)
			w.ok()
		}
	})
	w.ok = func() { t.Stop(); ok() } // under ex.mu, as the callback reads it
	return true
}

// homeLost reports whether this node cannot hear from the exchange's
// home: no confirmation is coming. ex.mu is held.
func (ex *Exchange) homeLost() bool {
	cl := ex.cl
	return cl.hs == nil && (cl.stale || ex.b.peer(cl.home) == nil)
}

func (ex *Exchange) confirmedMember(a *Attachment) bool {
	return a.inView != 0 && ex.cl.confirmed >= a.inView
}

// releaseOKs sends the held OKs of members now in a confirmed view, or
// all of them; ex.mu is held.
func (ex *Exchange) releaseOKs(all bool) {
	cl := ex.cl
	for a, ok := range cl.waiting {
		if all || ex.confirmedMember(a) {
			delete(cl.waiting, a)
			ok()
		}
	}
	for a, w := range cl.leaving {
		if all || w.ver != 0 && cl.confirmed >= w.ver {
			delete(cl.leaving, a)
			w.ok()
		}
	}
}

// confirm finds, at the home, the latest version every linked node
// applied; when it moves on, the held OKs it covers go, and every node
// is told. ex.mu is held.
func (ex *Exchange) confirm() {
	cl, hs := ex.cl, ex.cl.hs
	v := hs.ver
	for _, n := range ex.b.PeerNodes() {
		v = min(v, hs.acked[n])
	}
	if v <= cl.confirmed {
		return
	}
	cl.confirmed = v
	ex.releaseOKs(false)
	for _, n := range ex.b.PeerNodes() {
		f := wire.NewFrame(wire.TypeRViewAck)
		f.Name, f.Aux = ex.name, v
		ex.b.sendControl(n, f)
	}
}

// peerViewAck handles an RVIEWACK from p: at the home, p applied a
// view; at another node, the home says every node applied one.
func (b *Broker) peerViewAck(p *peer, f *wire.Frame) {
	defer f.Release()
	ex := b.Exchange(f.Name)
	if ex == nil || !ex.clusterMode() {
		return
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	cl := ex.cl
	if ex.closed || cl == nil {
		return
	}
	if hs := cl.hs; hs != nil {
		if f.Aux <= hs.ver && f.Aux > hs.acked[p.node] {
			if hs.acked == nil {
				hs.acked = make(map[string]uint64)
			}
			hs.acked[p.node] = f.Aux
			ex.confirm()
		}
		return
	}
	if cl.home == p.node && cl.from == p.node && f.Aux > cl.confirmed {
		cl.confirmed = f.Aux
		ex.releaseOKs(false)
	}
}

// validMembers checks members from a peer node: bounded, with ids, all
// handlers; node, if set, must be every member's node (a node reports
// only its own), and is filled in.
func validMembers(list []viewMember, node string) bool {
	if len(list) > maxViewMembers {
		return false
	}
	for i := range list {
		m := &list[i]
		if m.ID == "" || len(m.ID) > 255 || len(m.Node) > 255 {
			return false
		}
		if node != "" {
			if m.Node != "" && m.Node != node {
				return false
			}
			m.Node = node
		} else if m.Node == "" {
			return false
		}
		m.Role = wire.RoleName(wire.RoleHandler)
	}
	return true
}

// add inserts m in seniority order, unless its id is there; it reports
// whether it did.
func (hs *homeState) add(m viewMember) bool {
	if hs.index(m.ID) >= 0 {
		return false
	}
	i, _ := slices.BinarySearchFunc(hs.members, m, func(x, y viewMember) int {
		return cmp.Or(cmp.Compare(x.Key, y.Key), cmp.Compare(x.Node, y.Node), cmp.Compare(x.ID, y.ID))
	})
	hs.members = slices.Insert(hs.members, i, m)
	return true
}

func (hs *homeState) index(id string) int {
	return slices.IndexFunc(hs.members, func(m viewMember) bool { return m.ID == id })
}

// remove takes out member id of node; it reports whether it was there.
func (hs *homeState) remove(id, node string) bool {
	i := hs.index(id)
	if i < 0 || hs.members[i].Node != node {
		return false
	}
	hs.members = slices.Delete(hs.members, i, i+1)
	return true
}

// removeNode takes out every member of node; it reports whether there
// was one.
func (hs *homeState) removeNode(node string) bool {
	n := len(hs.members)
	hs.members = slices.DeleteFunc(hs.members, func(m viewMember) bool { return m.Node == node })
	return len(hs.members) != n
}

// youngest returns the largest seniority key, 0 with no member.
func (hs *homeState) youngest() int64 {
	var k int64
	for _, m := range hs.members {
		k = max(k, m.Key)
	}
	return k
}

// Fence is a leader's fencing token: the home's epoch, then the
// exchange's term. Tokens compare in that order and only grow.
type Fence struct {
	Epoch, Term uint64
}

// Leadership reports whether member, attached to this node, leads
// exchange as this node knows it now, and its fencing token: the view
// comes from the exchange's current home, its link has stayed up, and
// the node's lease holds. On a node alone the token is zero. An
// embedded member reads its lease here rather than trusting the last
// event it received.
func (b *Broker) Leadership(exchange, member string) (Fence, bool) {
	ex := b.Exchange(exchange)
	if ex == nil {
		return Fence{}, false
	}
	ex.mu.Lock()
	defer ex.mu.Unlock()
	v := ex.view.Load()
	if v.leader == nil || v.leader.member != member || v.leader.s.peer != nil {
		return Fence{}, false
	}
	if !v.fenced {
		return Fence{}, true
	}
	cl := ex.cl
	return Fence{Epoch: cl.epoch, Term: cl.term}, ex.viewValid()
}
