package broker

import (
	"cmp"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/courier-mq/courier/wire"
)

// Inverted pub-sub across nodes (docs/cluster.md). The controllers of a
// controlled exchange decide for its subscribers on every node: a
// subscription request goes to the controllers' leader wherever it is
// (RSUBREQ), and its decision comes back (RDECIDE) to the subscriber's
// node, which installs it. A controller's SUBSCRIBE or UNSUBSCRIBE of a
// member of another node goes to that node (RMEMBER), whose answer
// comes back as an RDECIDE.
//
// Each node advertises its oldest controller of each controlled
// exchange, with its attach time (RCTRL), when it changes and when a
// link comes up; the leader is chosen from these by controllersLeader, the same
// rule on every node. Leaders across nodes will come from the
// exchange's home node (views, peer_request.go): controllersLeader is the one
// function to switch to them.

// ctrlAd is a node's advertised controller of an exchange: its member
// id and attach time (unix ns on that node's clock).
type ctrlAd struct {
	node, member string
	since        int64
}

// controllersLeader returns the controllers' leader among candidates: the
// oldest, by attach time, then member id. Every node applies it to the
// same advertisements, so all agree once these have arrived.
func controllersLeader(candidates []ctrlAd) (ctrlAd, bool) {
	var best ctrlAd
	found := false
	for _, c := range candidates {
		if !found || cmpAds(c, best) < 0 {
			best, found = c, true
		}
	}
	return best, found
}

// controlState is an exchange's controllers across nodes;
// Exchange.pendMu guards it.
type controlState struct {
	ads        map[string]ctrlAd     // other nodes' oldest controllers, by node
	since      map[*Attachment]int64 // local controllers' attach times
	advertised *Attachment           // the local controller last advertised
}

// sinceLocked returns when the local controller a attached (the first
// time it is asked, at the latest); ex.pendMu is held.
func (ex *Exchange) sinceLocked(a *Attachment) int64 {
	cs := &ex.ctrl
	if t, ok := cs.since[a]; ok {
		return t
	}
	if cs.since == nil {
		cs.since = make(map[*Attachment]int64)
	}
	t := time.Now().UnixNano()
	cs.since[a] = t
	return t
}

// psQualified returns a member id of this node as other nodes know it:
// with the node's name before a '/'.
func (b *Broker) psQualified(id string) string {
	if strings.Contains(id, "/") {
		return id
	}
	return b.cfg.Node + "/" + id
}

// psLocalMember returns this node's member of a qualified id, or nil.
func (b *Broker) psLocalMember(id string) *Attachment {
	if a := b.member(id); a != nil {
		return a
	}
	if rest, ok := strings.CutPrefix(id, b.cfg.Node+"/"); ok {
		return b.member(rest)
	}
	return nil
}

// psNodeOf returns the node of a qualified member id, "" for none.
func psNodeOf(id string) string {
	node, _, ok := strings.Cut(id, "/")
	if !ok {
		return ""
	}
	return node
}

// remoteController returns the node and member id of the controllers'
// leader when it is another node's; "" when it is local, or none is
// known elsewhere.
func (ex *Exchange) remoteController() (node, member string) {
	if !ex.b.hasPeerLinks() {
		return "", ""
	}
	ex.pendMu.Lock()
	defer ex.pendMu.Unlock()
	if len(ex.ctrl.ads) == 0 {
		return "", ""
	}
	candidates := make([]ctrlAd, 0, len(ex.ctrl.ads)+1)
	for _, ad := range ex.ctrl.ads {
		candidates = append(candidates, ad)
	}
	if l := ex.view.Load().leader; l != nil {
		candidates = append(candidates, ctrlAd{member: ex.b.psQualified(l.member), since: ex.sinceLocked(l)})
	}
	best, _ := controllersLeader(candidates)
	return best.node, best.member
}

// controllerJoined runs once controller a joined its exchange, and then
// runs then, once the other nodes know of it if it is the exchange's
// oldest local controller now (every live node acknowledged the RCTRL,
// or went down, or maxInterestWait passed): a subscriber attaching on
// another node after the controller's OK is asked of a controller.
func (ex *Exchange) controllerJoined(a *Attachment, then func()) {
	ex.pendMu.Lock()
	ex.sinceLocked(a)
	ex.pendMu.Unlock()
	w := ex.advertise()
	if w == nil {
		then()
		return
	}
	var once sync.Once
	wait := cmp.Or(ex.b.ps.maxWait, maxInterestWait)
	timer := time.AfterFunc(wait, func() {
		ex.b.log.Warn("a controller's attach answers without every node's acknowledgement", "exchange", ex.name, "waited", wait)
		once.Do(then)
	})
	w.onDone(func() {
		timer.Stop()
		once.Do(then)
	})
}

// advertise tells the other nodes of the exchange's oldest local
// controller when it changed. It returns the wait for their
// acknowledgements, or nil when nothing was sent.
func (ex *Exchange) advertise() *interestWait {
	if !ex.b.hasPeerLinks() {
		return nil
	}
	ex.pendMu.Lock()
	l := ex.view.Load().leader
	if l == ex.ctrl.advertised {
		ex.pendMu.Unlock()
		return nil
	}
	ex.ctrl.advertised = l
	w := newInterestWait()
	for _, pp := range ex.b.psLivePeers() {
		ex.b.psSend(pp, ex.ctrlFrameLocked(l), w)
	}
	ex.pendMu.Unlock()
	w.release() // the creator's hold
	return w
}

// advertiseTo tells pp, whose link just came up, of the exchange's
// oldest local controller.
func (ex *Exchange) advertiseTo(pp *psPeer) {
	if !ex.cfg.Controlled {
		return
	}
	ex.pendMu.Lock()
	defer ex.pendMu.Unlock()
	if l := ex.view.Load().leader; l != nil {
		ex.ctrl.advertised = l
		ex.b.psSend(pp, ex.ctrlFrameLocked(l), nil)
	}
}

// ctrlFrameLocked is the RCTRL advertising l (nil: no controller here);
// ex.pendMu is held.
func (ex *Exchange) ctrlFrameLocked(l *Attachment) *wire.Frame {
	f := wire.NewFrame(wire.TypeRCtrl)
	f.Name = ex.name
	if l != nil {
		f.Tag, f.Aux = ex.b.psQualified(l.member), uint64(ex.sinceLocked(l))
	}
	return f
}

// askRemote sends subscription request p to the controller member of
// node; false if node's link is down.
func (ex *Exchange) askRemote(p *subRequest, node, member string) bool {
	pp := ex.b.psPeer(node)
	if pp == nil {
		return false
	}
	p.controller, p.remote = nil, node
	p.tries++
	token := ex.b.nextSubReq.Add(1)
	ex.pendMu.Lock()
	ex.pending[token] = p
	ex.pendMu.Unlock()
	info := p.a.info()
	info.ID = ex.b.psQualified(info.ID)
	f := wire.NewFrame(wire.TypeRSubReq)
	f.Ref, f.Name, f.Tag = token, ex.name, member
	f.Body = jsonBody(wire.SubRequestBody{Member: info, Patterns: p.patterns})
	if !ex.b.psSend(pp, f, nil) {
		ex.pendMu.Lock()
		delete(ex.pending, token)
		ex.pendMu.Unlock()
		return false
	}
	return true
}

// remoteAsk is another node's subscription request, waiting for a local
// controller's decision.
type remoteAsk struct {
	pp         *psPeer
	ref        uint64 // the asking node's token
	controller *Attachment
	body       []byte // the SUBREQUEST's
	member     string
	// weight is what it counts in psPeer.asks: its patterns, at least 1.
	weight int64
}

// maxAskTries bounds the times a subscription request is sent to another
// node's controller that is gone: then it is refused.
const maxAskTries = 4

// Verdicts of RDECIDE besides DECISION's: ask again (the controller
// asked is gone), and the error of an RMEMBER.
const (
	verdictAgain = 2
	verdictError = 3
)

// peerControl handles an inverted pub-sub node-link frame from pp.
func (b *Broker) peerControl(pp *psPeer, f *wire.Frame) {
	defer f.Release()
	switch f.Type {
	case wire.TypeRCtrl:
		if ex := b.Exchange(f.Name); ex != nil && ex.cfg.Controlled {
			ex.learnController(pp, f.Tag, int64(f.Aux))
		} else if ex != nil || !b.holdEarlyCtrl(pp, f) {
			pp.c.unknown.Add(1)
		}
		b.ackInterest(pp, f.Ref)
	case wire.TypeRSubReq:
		b.remoteSubRequest(pp, f)
	case wire.TypeRDecide:
		b.remoteDecided(pp, f)
	case wire.TypeRMember:
		b.remoteMemberOp(pp, f)
	}
}

// learnController records pp's oldest controller of ex ("" for none).
func (ex *Exchange) learnController(pp *psPeer, member string, since int64) {
	ex.pendMu.Lock()
	defer ex.pendMu.Unlock()
	if member == "" || psNodeOf(member) != pp.p.node {
		delete(ex.ctrl.ads, pp.p.node)
		return
	}
	if ex.ctrl.ads == nil {
		ex.ctrl.ads = make(map[string]ctrlAd)
	}
	ex.ctrl.ads[pp.p.node] = ctrlAd{node: pp.p.node, member: member, since: since}
}

// remoteSubRequest asks the local controllers' leader about another
// node's subscriber.
func (b *Broker) remoteSubRequest(pp *psPeer, f *wire.Frame) {
	answer := func(verdict uint64, reason string) {
		d := wire.NewFrame(wire.TypeRDecide)
		d.Ref, d.Name, d.Aux, d.Tag = f.Ref, f.Name, verdict, reason
		b.psSend(pp, d, nil)
	}
	ex := b.Exchange(f.Name)
	if ex == nil || !ex.cfg.Controlled {
		pp.c.unknown.Add(1)
		answer(wire.VerdictRefuse, "exchange "+f.Name+" is not a controlled exchange on node "+b.cfg.Node)
		return
	}
	var sr wire.SubRequestBody
	if err := json.Unmarshal(f.Body, &sr); err != nil || checkPatterns(sr.Patterns) != nil || psNodeOf(sr.Member.ID) != pp.p.node {
		pp.c.refused.Add(1)
		answer(wire.VerdictRefuse, "bad subscription request")
		return
	}
	if len(sr.Patterns) > b.cfg.MaxPatternsPerAttachment {
		answer(wire.VerdictRefuse, "more patterns than a subscriber may have")
		return
	}
	ra := &remoteAsk{pp: pp, ref: f.Ref, body: jsonBody(sr), member: sr.Member.ID, weight: int64(max(1, len(sr.Patterns)))}
	if pp.asks.Add(ra.weight) > int64(b.cfg.MaxPatternsPerPeer) {
		pp.asks.Add(-ra.weight)
		answer(wire.VerdictRefuse, "too many subscription requests from node "+pp.p.node+" wait for a controller")
		return
	}
	if !ex.deliverAsk(ra) {
		pp.asks.Add(-ra.weight)
		answer(verdictAgain, "")
	}
}

// deliverAsk hands ra to the local controllers' leader; false if there
// is none.
func (ex *Exchange) deliverAsk(ra *remoteAsk) bool {
	ctrl := ex.view.Load().leader
	if ctrl == nil {
		return false
	}
	ra.controller = ctrl
	token := ex.b.nextSubReq.Add(1)
	ex.pendMu.Lock()
	if ex.asks == nil {
		ex.asks = make(map[uint64]*remoteAsk)
	}
	ex.asks[token] = ra
	ex.pendMu.Unlock()
	f := wire.NewFrame(wire.TypeSubRequest)
	f.Ref, f.Attach, f.Name, f.Body = token, ctrl.id, ra.member, ra.body
	ctrl.s.sink.Deliver(f)
	return true
}

// remoteDecision sends a controller's DECISION f about another node's
// subscriber to that node; nothing if the token is not such a request's.
func (ex *Exchange) remoteDecision(f *wire.Frame) error {
	ex.pendMu.Lock()
	ra := ex.asks[f.Ref]
	delete(ex.asks, f.Ref)
	ex.pendMu.Unlock()
	if ra == nil {
		return nil // the subscriber went away meanwhile
	}
	ra.pp.asks.Add(-ra.weight)
	d := wire.NewFrame(wire.TypeRDecide)
	d.Ref, d.Name, d.Aux, d.Tag = ra.ref, ex.name, f.Aux, f.Tag
	patterns, err := checkDecision(f.Aux, f.Body)
	if err != nil {
		d.Aux, d.Tag = wire.VerdictRefuse, "the controller sent a bad decision"
	} else if patterns != nil {
		d.Body = jsonBody(wire.PatternsBody{Patterns: patterns})
	}
	ex.b.psSend(ra.pp, d, nil)
	return err
}

// remoteDecided applies an RDECIDE: a decision about a local
// subscriber, or the answer to a controller's RMEMBER.
func (b *Broker) remoteDecided(pp *psPeer, f *wire.Frame) {
	if b.memberOpDone(pp, f) {
		return
	}
	ex := b.Exchange(f.Name)
	if ex == nil || ex.subs == nil {
		return
	}
	ex.pendMu.Lock()
	p := ex.pending[f.Ref]
	if p != nil && p.remote == pp.p.node {
		delete(ex.pending, f.Ref)
	} else {
		p = nil
	}
	ex.pendMu.Unlock()
	if p == nil {
		return // the subscriber went away meanwhile
	}
	if f.Aux == verdictError {
		// The exchange was deleted on the controller's node: it is, or
		// is about to be, here too.
		ex.unreserve(p)
		ex.fail(p, wire.Errorf(wire.Code(f.Attach), "%s", f.Tag))
		return
	}
	if f.Aux == verdictAgain {
		if p.tries >= maxAskTries {
			ex.refuse(p, "no controller answered")
			return
		}
		ex.ask(p)
		return
	}
	if err := ex.settle(p, f.Aux, f.Tag, f.Body); err != nil {
		b.log.Warn("a remote controller's decision was not applied", "node", pp.p.node, "exchange", ex.name, "member", p.a.member, "err", err)
	}
}

// controllerGone, for another node's subscription requests: those the
// controller left undecided go to the new local leader, or back to
// their node to ask again. Then the other nodes learn of the new local
// leader.
func (ex *Exchange) remoteControllerGone(ctrl *Attachment) {
	ex.advertise()
	var redo []*remoteAsk
	ex.pendMu.Lock()
	for t, ra := range ex.asks {
		if ra.controller == ctrl {
			delete(ex.asks, t)
			redo = append(redo, ra)
		}
	}
	ex.pendMu.Unlock()
	for _, ra := range redo {
		if ex.deliverAsk(ra) {
			continue
		}
		ra.pp.asks.Add(-ra.weight)
		d := wire.NewFrame(wire.TypeRDecide)
		d.Ref, d.Name, d.Aux = ra.ref, ex.name, verdictAgain
		ex.b.psSend(ra.pp, d, nil)
	}
	ex.pendMu.Lock()
	delete(ex.ctrl.since, ctrl)
	ex.pendMu.Unlock()
}

// controlPeerDown forgets pp's controller and subscription requests;
// local subscription requests that waited for its controller are asked
// again.
func (ex *Exchange) controlPeerDown(pp *psPeer) {
	var redo []*subRequest
	ex.pendMu.Lock()
	delete(ex.ctrl.ads, pp.p.node)
	for t, ra := range ex.asks {
		if ra.pp == pp {
			delete(ex.asks, t)
		}
	}
	for t, p := range ex.pending {
		if p.remote == pp.p.node {
			delete(ex.pending, t)
			redo = append(redo, p)
		}
	}
	ex.pendMu.Unlock()
	for _, p := range redo {
		ex.ask(p)
	}
}

// closeControl refuses the other nodes' subscription requests that
// waited for a controller of ex, deleted, and forgets their controllers.
func (ex *Exchange) closeControl() {
	ex.pendMu.Lock()
	asks := ex.asks
	ex.asks = nil
	ex.ctrl = controlState{}
	ex.pendMu.Unlock()
	for _, ra := range asks {
		ra.pp.asks.Add(-ra.weight)
		d := wire.NewFrame(wire.TypeRDecide)
		d.Ref, d.Name, d.Aux, d.Attach = ra.ref, ex.name, verdictError, uint32(wire.CodeExchangeDeleted)
		d.Tag = "exchange " + ex.name + " was deleted"
		ex.b.psSend(ra.pp, d, nil)
	}
}

// memberOp is a local controller's SUBSCRIBE or UNSUBSCRIBE of another
// node's member, waiting for that node's answer.
type memberOp struct {
	s    *Session
	ref  uint64
	node string
}

// maxMemberOps bounds the memberOps waiting, node-wide: past it, a
// controller's SUBSCRIBE of another node's member fails at once.
const maxMemberOps = 65536

// subscribeElsewhere sends a controller's SUBSCRIBE or UNSUBSCRIBE f of
// another node's member to that node; false if f.Name is no member of
// another node whose link is up.
func (s *Session) subscribeElsewhere(f *wire.Frame, self *Attachment, patterns []string) bool {
	b := s.b
	node := psNodeOf(f.Name)
	if node == "" || node == b.cfg.Node || !b.hasPeerLinks() {
		return false
	}
	pp := b.psPeer(node)
	if pp == nil {
		return false
	}
	if need := attachNeeds(self.role); !s.allowed(need, self.ex.name) {
		s.sendError(f.Ref, s.deny(strings.ToLower(f.Type.String()), need, self.ex.name))
		return true
	}
	token := b.nextSubReq.Add(1)
	b.ps.mu.Lock()
	if len(b.ps.ops) >= maxMemberOps {
		b.ps.mu.Unlock()
		s.sendError(f.Ref, wire.Errorf(wire.CodeLimit, "%s %s: %d subscriptions of other nodes' members wait for an answer, the limit", f.Type, f.Name, maxMemberOps))
		return true
	}
	if b.ps.ops == nil {
		b.ps.ops = make(map[uint64]*memberOp)
	}
	b.ps.ops[token] = &memberOp{s: s, ref: f.Ref, node: node}
	b.ps.mu.Unlock()
	m := wire.NewFrame(wire.TypeRMember)
	m.Ref, m.Name, m.Tag = token, self.ex.name, f.Name
	if f.Type == wire.TypeUnsubscribe {
		m.Aux = 1
	}
	m.Body = jsonBody(wire.PatternsBody{Patterns: patterns})
	if !b.psSend(pp, m, nil) {
		b.takeMemberOp(token, "")
		s.sendError(f.Ref, wire.Errorf(wire.CodeNotFound, "%s: node %s is not reachable", f.Type, node))
	}
	return true
}

// takeMemberOp removes and returns the memberOp of token, if it waits
// for node ("" for any).
func (b *Broker) takeMemberOp(token uint64, node string) *memberOp {
	b.ps.mu.Lock()
	defer b.ps.mu.Unlock()
	op := b.ps.ops[token]
	if op == nil || node != "" && op.node != node {
		return nil
	}
	delete(b.ps.ops, token)
	return op
}

// memberOpDone answers a controller whose RMEMBER the RDECIDE f
// answers; false if f answers no RMEMBER.
func (b *Broker) memberOpDone(pp *psPeer, f *wire.Frame) bool {
	op := b.takeMemberOp(f.Ref, pp.p.node)
	if op == nil {
		return false
	}
	if f.Aux == verdictError {
		op.s.sendError(op.ref, &wire.Error{Code: wire.Code(f.Attach), Msg: f.Tag})
		return true
	}
	op.s.reply(op.ref, f.Body, nil)
	return true
}

// memberOpsPeerDown fails the controllers' RMEMBERs waiting for pp.
func (b *Broker) memberOpsPeerDown(pp *psPeer) {
	var gone []*memberOp
	b.ps.mu.Lock()
	for t, op := range b.ps.ops {
		if op.node == pp.p.node {
			delete(b.ps.ops, t)
			gone = append(gone, op)
		}
	}
	b.ps.mu.Unlock()
	for _, op := range gone {
		op.s.sendError(op.ref, wire.Errorf(wire.CodeNotFound, "subscribe: node %s went down before it answered", pp.p.node))
	}
}

// remoteMemberOp applies another node's controller's SUBSCRIBE or
// UNSUBSCRIBE of a local member, and answers with an RDECIDE.
func (b *Broker) remoteMemberOp(pp *psPeer, f *wire.Frame) {
	ref, name, sub := f.Ref, f.Name, f.Aux == 0
	answer := func(body []byte, err error) {
		d := wire.NewFrame(wire.TypeRDecide)
		d.Ref, d.Name = ref, name
		if err != nil {
			e := asWireError(err)
			d.Aux, d.Attach, d.Tag = verdictError, uint32(e.Code), e.Msg
		} else {
			d.Body = body
		}
		b.psSend(pp, d, nil)
	}
	what := "unsubscribe"
	if sub {
		what = "subscribe"
	}
	var pb wire.PatternsBody
	if err := json.Unmarshal(f.Body, &pb); err != nil || checkPatterns(pb.Patterns) != nil {
		pp.c.refused.Add(1)
		answer(nil, wire.Errorf(wire.CodeBadOptions, "%s: bad patterns", what))
		return
	}
	target := b.psLocalMember(f.Tag)
	if target == nil || target.ex.name != name || target.role != wire.RoleSubscriber {
		answer(nil, wire.Errorf(wire.CodeNotFound, "%s: %q is not a subscriber of exchange %q", what, f.Tag, name))
		return
	}
	ex := target.ex
	var now []string
	var err error
	switch {
	case target.tq != nil:
		now, err = b.resubscribe(target, sub, pb.Patterns)
	case sub:
		now, err = ex.addPatterns(target, pb.Patterns, true, 0)
	default:
		now = ex.removePatterns(target, pb.Patterns)
	}
	if err != nil {
		answer(nil, err)
		return
	}
	known := pb.Patterns
	if !sub {
		known = nil
	}
	ex.whenKnown(known, func() { answer(jsonBody(wire.PatternsBody{Patterns: now}), nil) })
	target.event(wire.EventSubscriptions, jsonBody(wire.EventBody{Patterns: now}))
}

// cmpAds orders advertisements, oldest first.
func cmpAds(a, b ctrlAd) int {
	return cmp.Or(cmp.Compare(a.since, b.since), cmp.Compare(a.member, b.member))
}

// holdEarlyCtrl keeps pp's controller ad f of an exchange this node does
// not know yet, for when it is declared here (see holdEarly); it reports
// whether it did. One ad per node and exchange, counted against the
// node's bound of held patterns.
func (b *Broker) holdEarlyCtrl(pp *psPeer, f *wire.Frame) bool {
	if !ValidName(f.Name) {
		return false
	}
	ps := &b.ps
	ps.earlyMu.Lock()
	defer ps.earlyMu.Unlock()
	if b.Exchange(f.Name) != nil {
		return false
	}
	node := pp.p.node
	key := [2]string{f.Name, node}
	_, had := ps.earlyCtrl[key]
	if f.Tag == "" || psNodeOf(f.Tag) != node {
		if had {
			delete(ps.earlyCtrl, key)
			ps.earlyN[node]--
		}
		return true
	}
	if !had {
		if ps.earlyN[node]+1 > b.cfg.MaxPatternsPerPeer {
			pp.c.refused.Add(1)
			return false
		}
		if ps.earlyCtrl == nil {
			ps.earlyCtrl = make(map[[2]string]ctrlAd)
		}
		if ps.earlyN == nil {
			ps.earlyN = make(map[string]int)
		}
		ps.earlyN[node]++
	}
	ps.earlyCtrl[key] = ctrlAd{node: node, member: f.Tag, since: int64(f.Aux)}
	return true
}
