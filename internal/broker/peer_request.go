package broker

import (
	"math/rand/v2"
	"strings"
	"time"

	"github.com/courier-mq/courier/wire"
)

// Request-response across nodes: views from each exchange's home node,
// requests routed at the entry node (docs/cluster.md).
//
// The entry node routes a request from its view of the exchange, whose
// members include stand-ins of other nodes' handlers: attachments of the
// peer session of the handler's node (see peer_view.go). A request for a
// stand-in goes over the link as RREQ: Ref is its slot in the peer
// session's handling table, Name the member id, Aux the time left in ms
// (never a clock value), Attach the fencing term for a leader. The
// handler's node makes it a request of the entry node's peer session
// there, so that responses, chunks, asks and failures come back as that
// session's, straight to the entry node, which hands them to the
// requester as from a local handler. Cancels and answers take the same
// path the other way.

// peerRequest handles a request-response node-link frame from p.
func (b *Broker) peerRequest(p *peer, f *wire.Frame) {
	switch f.Type {
	case wire.TypeRReq:
		b.servePeerRequest(p, f)
	case wire.TypeRView:
		b.peerView(p, f)
	case wire.TypeRAttach:
		b.peerAttach(p, f)
	case wire.TypeRDetach:
		b.peerDetach(p, f)
	case wire.TypeRViewAck:
		b.peerViewAck(p, f)
	default:
		f.Release()
	}
}

// servePeerRequest delivers a request routed by p to one of this node's
// handlers, as a request of p's session.
func (b *Broker) servePeerRequest(p *peer, f *wire.Frame) {
	start := monoNow()
	p.s.stats.Requests.Add(f.Ref, 1)
	member, requester, _ := strings.Cut(f.Name, "\x00")
	a := b.member(member)
	if a == nil || a.s.peer != nil || a.role != wire.RoleHandler || a.gone.Load() {
		p.s.failRequest(f, wire.Errorf(wire.CodeHandlerGone, "handler %s left node %s", member, b.cfg.Node))
		return
	}
	if f.Attach != 0 && !a.ex.fencedLeader(a, f.Attach) {
		p.s.failRequest(f, wire.Errorf(wire.CodeNotLeader, "%s is not the leader of %q on node %s", a.member, a.ex.name, b.cfg.Node))
		return
	}
	f.Type, f.Attach, f.Name = wire.TypeRequest, 0, requester
	if err := p.s.sendOne(f, a, start); err != nil {
		p.s.failRequest(f, err)
	}
}

// fencedLeader reports whether a leads its exchange here under the term
// a request was routed with (its low 32 bits, as RREQ carries it).
func (ex *Exchange) fencedLeader(a *Attachment, term uint32) bool {
	v := ex.view.Load()
	return v.fenced && v.leader == a && uint32(v.term) == term
}

// leaderRetry is what the entry node keeps of a request sent to another
// node's leader, to route it again if that node answers not-leader.
type leaderRetry struct {
	f        *wire.Frame // a copy of the REQUEST as the requester sent it
	ex       *Exchange
	start    int64 // monoNow at its arrival
	deadline int64 // unix ns; 0: none
	tries    int
}

// Leader retries: how long the entry node waits for a newer view before
// it routes a request again, and how often it does for a request without
// a deadline.
const (
	leaderRetryWait = 20 * time.Millisecond
	leaderRetryMax  = 100
)

// sendRemote is sendOne for a stand-in a of another node's handler: the
// request leaves as RREQ on the link to a's node.
func (s *Session) sendRemote(f *wire.Frame, a *Attachment, start int64) error {
	return s.sendRemoteRetry(f, a, start, nil)
}

// sendRemoteRetry is sendRemote; rt, if not nil, is the record of the
// request's earlier tries at a leader.
func (s *Session) sendRemoteRetry(f *wire.Frame, a *Attachment, start int64, rt *leaderRetry) error {
	h := a.s
	var fence uint32
	sl := slot{r: s, reqID: f.Ref, w: f.Waiter, a: a, start: start}
	if v := a.ex.view.Load(); v.fenced && v.leader == a && f.Tag == "" && a.ex.cfg.Strategy == Leader {
		fence = uint32(v.term)
		if fence == 0 {
			fence = 1 // never sent as "no fence"
		}
		if rt == nil {
			rt = &leaderRetry{f: f.Clone(), ex: a.ex, start: start, deadline: deadlineOf(f, start)}
			// A retry runs from a timer, long after the read loop that
			// owns f's batch flushed it: it must write at once.
			rt.f.Batch = nil
		}
		sl.retry = rt
	}
	epoch := h.handling.epoch.Load()
	id, ok := h.handling.put(sl, f.Ref)
	if !ok {
		return wire.Errorf(wire.CodeHandlerGone, "the handler's node left")
	}
	a.addBusy(1)
	if err := s.register(f.Ref, pending{a: a, id: id, deadline: deadlineOf(f, start), w: f.Waiter}); err != nil {
		if _, ok := h.handling.get(id, true); ok {
			a.addBusy(-1)
		}
		return err
	}
	if h.handling.sweptSince(epoch) && !h.handling.live(id) {
		if _, ok := s.take(f.Ref, func(p pending) bool { return p.id == id && p.a == a }); ok {
			return wire.Errorf(wire.CodeHandlerGone, "the handler's node left")
		}
		f.Release()
		return nil
	}
	h.stats.Delivered.Add(f.Ref, 1)
	f.Ref, f.Name, f.Waiter = id, s.id, nil
	toRReq(f, a, fence, start)
	h.sink.Deliver(f)
	return nil
}

// toRReq turns f, a REQUEST with Ref set to its slot and Name to the
// requester's connection id, into the RREQ for stand-in a: the member id
// and the requester's in Name, the deadline as the time left.
func toRReq(f *wire.Frame, a *Attachment, fence uint32, start int64) {
	f.Type, f.Name, f.Attach = wire.TypeRReq, a.member+"\x00"+f.Name, fence
	if f.Aux != 0 {
		left := int64(f.Aux) - (monoNow()-start)/int64(time.Millisecond)
		f.Aux = uint64(max(left, 1))
	}
}

// peerResponse handles, on the entry node, what a RESPONSE from the
// node of stand-in sl.a carries for the entry node alone: the handler's
// load, and not-leader. It reports whether it took f.
func (s *Session) peerResponse(sl slot, f *wire.Frame, final bool) bool {
	if f.Attach != 0 {
		if sl.a.countBusy {
			sl.a.reported.Store(int64(f.Attach) - 1)
		}
		f.Attach = 0
	}
	if !final || sl.retry == nil || f.Flags&wire.FlagError == 0 || wire.Code(f.Aux) != wire.CodeNotLeader {
		return false
	}
	r, rt, id := sl.r, sl.retry, f.Ref
	sl.a.addBusy(-1)
	f.Release()
	if _, ok := r.take(sl.reqID, func(p pending) bool { return p.a == sl.a && p.id == id }); !ok {
		return true // cancelled or expired meanwhile
	}
	time.AfterFunc(leaderRetryWait, func() { r.rerouteLeader(rt) })
	return true
}

// rerouteLeader routes again a request that the node of the leader it
// was sent to refused as not-leader: by now the entry node may have a
// newer view.
func (s *Session) rerouteLeader(rt *leaderRetry) {
	f := rt.f.Clone()
	rt.tries++
	start := monoNow()
	if f.Aux != 0 {
		// What is left of the deadline, so that the entry node's own
		// expiry stays where it was.
		f.Aux = uint64(max(int64(f.Aux)-(start-rt.start)/int64(time.Millisecond), 1))
	}
	var err error
	switch one := rt.ex.view.Load().leader; {
	case rt.deadline != 0 && monoNow() >= rt.deadline:
		err = wire.Errorf(wire.CodeTimeout, "the request's deadline passed while its exchange's leader changed")
	case rt.deadline == 0 && rt.tries > leaderRetryMax:
		err = wire.Errorf(wire.CodeNoHandler, "no leader of %q took the request: the leader kept changing", rt.ex.name)
	case one == nil:
		err = wire.Errorf(wire.CodeNoHandler, "no leader on exchange %q: none is appointed, or this node lost its exchange's home node", rt.ex.name)
	case one.s.peer != nil:
		err = s.sendRemoteRetry(f, one, start, rt)
	default:
		err = s.sendOne(f, one, start)
	}
	if err != nil {
		s.failRequest(f, err)
	}
}

// twoChoices picks the less busy of two members of g drawn at random,
// for least-busy across nodes: a stand-in's load is what this node has
// in flight to it or what its node last reported, the larger.
func twoChoices(g *group) *Attachment {
	n := len(g.members)
	if n == 1 {
		return g.members[0]
	}
	i := rand.IntN(n)
	j := rand.IntN(n - 1)
	if j >= i {
		j++
	}
	a, b := g.members[i], g.members[j]
	if load(b) < load(a) {
		return b
	}
	return a
}

// load is a handler's requests in flight as this node knows them.
func load(a *Attachment) int64 {
	n := a.busy.Load()
	if a.s.peer != nil {
		n = max(n, a.reported.Load())
	}
	return n
}
