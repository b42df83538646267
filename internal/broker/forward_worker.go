package broker

import (
	"bytes"
	"fmt"
	"sync"
	"time"

	"github.com/courier-mq/courier/wire"
)

// Forwarded workers (docs/replication.md, "In the broker", step 3). A
// worker that attaches on a node that does not serve its replicated
// queue is attached, over the data link, to the node whose replica
// leads: the entry node sends the client's ATTACH there under an
// attachment id of its own (a link id, below 1<<31: the ids above are
// request-response stand-ins), the leader makes it an attachment of
// the entry node's peer session, with the worker's prefetch, and the
// TASK and EVENT frames it sends it come back on the link, where the
// entry node hands them to the client under the client's id. ACK, NACK
// and PROGRESS go the other way, DETACH too. The leader's queue bounds
// what is in flight by the prefetch, as for any worker.
//
// When the leader stops serving the queue (its worker gets EVENT
// detached) or the link to it drops, the entry node attaches the worker
// again, to the new leader (or to itself, if it became the leader),
// without telling the client: at most the client's unsettled tasks are
// delivered again. On the leader, a forwarded worker whose link dropped
// gives its unsettled tasks back without a failed attempt
// (queue.ReturnConsumer): its node went away, not the worker.

const (
	// maxLinkWorkers bounds the workers a node forwards to one other
	// node; beyond it an ATTACH to be forwarded there is refused with
	// CodeLimit.
	maxLinkWorkers = 4096
	// linkIDs bounds the link ids of forwarded workers: the ids above
	// are stand-ins of handlers (peer_view.go).
	linkIDs = 1 << 31
	// rehomeRetry is the pause between two tries to attach a worker
	// again after its leader moved.
	rehomeRetry = 50 * time.Millisecond
	// rehomeTimeout bounds the search for a new leader: after it the
	// client gets EVENT detached and attaches again itself.
	rehomeTimeout = 60 * time.Second
)

// fwdWorker is a client's worker attached to a replicated queue that
// another node serves.
type fwdWorker struct {
	s      *Session
	id     uint32 // the client's attachment id
	name   string // the queue
	tag    string // the service tag
	body   []byte // the ATTACH body
	spec   wire.AttachSpec
	mu     sync.Mutex
	node   string // the node it is attached (or being attached) to, "" while none
	link   uint32 // its id on that node's link, 0 while none
	ref    uint64 // the client's ATTACH ref, until answered
	answer bool   // the client has its OK
	closed bool
	since  time.Time // when its current search for a leader began
}

// linkWorkers indexes forwarded workers by link id.
type linkWorkers struct {
	mu     sync.Mutex
	next   uint32
	byLink map[uint32]*fwdWorker
	nodes  map[string]int
}

// add gives w a link id on node; ok is false past maxLinkWorkers.
func (t *linkWorkers) add(w *fwdWorker, node string) (uint32, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nodes[node] >= maxLinkWorkers {
		return 0, false
	}
	if t.byLink == nil {
		t.byLink, t.nodes = map[uint32]*fwdWorker{}, map[string]int{}
	}
	for {
		t.next = (t.next + 1) % linkIDs
		if t.next != 0 && t.byLink[t.next] == nil {
			break
		}
	}
	t.byLink[t.next] = w
	t.nodes[node]++
	return t.next, true
}

// remove forgets link id, on node.
func (t *linkWorkers) remove(link uint32, node string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byLink[link]; ok {
		delete(t.byLink, link)
		if t.nodes[node]--; t.nodes[node] <= 0 {
			delete(t.nodes, node)
		}
	}
}

// get returns the worker with link id.
func (t *linkWorkers) get(link uint32) *fwdWorker {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byLink[link]
}

// onNode returns the workers with a link id on node.
func (t *linkWorkers) onNode(node string) []*fwdWorker {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*fwdWorker
	for _, w := range t.byLink {
		w.mu.Lock()
		if w.node == node {
			out = append(out, w)
		}
		w.mu.Unlock()
	}
	return out
}

// forwardAttach attaches a client's worker, spec its ATTACH body, to the
// replicated queue f.Name served by node; f stays the caller's.
func (s *Session) forwardAttach(node string, f *wire.Frame, spec wire.AttachSpec) {
	switch {
	case f.Attach == 0:
		s.sendError(f.Ref, wire.Errorf(wire.CodeProtocol, "attach: attachment id 0 is reserved"))
		return
	case spec.Prefetch < 0 || spec.Prefetch > wire.MaxPrefetch:
		s.sendError(f.Ref, wire.Errorf(wire.CodeBadOptions, "attach: prefetch %d out of range: 0 to %d", spec.Prefetch, wire.MaxPrefetch))
		return
	case spec.Durable != "":
		s.sendError(f.Ref, wire.Errorf(wire.CodeBadOptions, "attach: only pub-sub subscribers can be durable"))
		return
	}
	w := &fwdWorker{s: s, id: f.Attach, name: f.Name, tag: f.Tag, body: bytes.Clone(f.Body), spec: spec, ref: f.Ref}
	s.mu.Lock()
	err := s.roomForID(f.Name, f.Attach)
	if err == nil && !s.closed {
		if s.fwdWorkers == nil {
			s.fwdWorkers = map[uint32]*fwdWorker{}
		}
		s.fwdWorkers[w.id] = w
	}
	closed := s.closed
	s.mu.Unlock()
	if err != nil || closed {
		if !closed {
			s.sendError(f.Ref, err)
		}
		return
	}
	w.attachTo(node)
}

// attachTo sends w's ATTACH to node.
func (w *fwdWorker) attachTo(node string) {
	b := w.s.b
	link, ok := b.linkWorkers.add(w, node)
	if !ok {
		w.fail(wire.Errorf(wire.CodeLimit, "attach to %s: node %s has %d workers from this node already", w.name, node, maxLinkWorkers))
		return
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		b.linkWorkers.remove(link, node)
		return
	}
	w.node, w.link = node, link
	w.mu.Unlock()
	id, ok := b.forwardCall(node, w.s, 0, "attach to "+w.name, func(ok *wire.Frame, err error) {
		w.attached(node, link, ok, err)
	})
	if !ok {
		w.lost(node, link, wire.Errorf(wire.CodeLimit, "attach to %s: %d calls already wait for other nodes", w.name, maxForwarded))
		return
	}
	f := wire.NewFrame(wire.TypeAttach)
	f.Ref, f.Attach, f.Name, f.Aux, f.Tag, f.Body = id, link, w.name, wire.RoleWorker, w.tag, w.body
	if err := w.s.b.sendLink(node, f); err != nil {
		if fw := b.fwd.take(node, id); fw != nil {
			fw.fail(err)
		}
	}
}

// sendLink sends f on the data link to node.
func (b *Broker) sendLink(node string, f *wire.Frame) error {
	links := b.peerLinks.Load()
	if links == nil {
		f.Release()
		return wire.Errorf(wire.CodeUnavailable, "no link to node %s", node)
	}
	if err := (*links).Send(node, f); err != nil {
		return wire.Errorf(wire.CodeUnavailable, "the link to node %s is down: %v", node, err)
	}
	return nil
}

// attached takes node's answer to w's ATTACH under link.
func (w *fwdWorker) attached(node string, link uint32, ok *wire.Frame, err error) {
	w.mu.Lock()
	current := w.link == link && w.node == node && !w.closed
	w.mu.Unlock()
	if !current {
		// It detached meanwhile (its DETACH went to node), or moved.
		if ok != nil {
			ok.Release()
		}
		return
	}
	if err != nil {
		w.lost(node, link, err)
		return
	}
	w.mu.Lock()
	first := !w.answer
	w.answer, w.since = true, time.Time{}
	ref := w.ref
	w.mu.Unlock()
	if !first {
		ok.Release() // attached again after a move: the client knows nothing
		return
	}
	ok.Ref = ref
	w.s.sink.Deliver(ok)
}

// lost handles the end of w's attachment (or attempt) link on node, with
// err: the first attach fails to the client unless the link is at
// fault; a worker attached before looks for its queue's leader again.
func (w *fwdWorker) lost(node string, link uint32, err error) {
	w.mu.Lock()
	if w.closed || w.link != link || w.node != node {
		w.mu.Unlock()
		return
	}
	w.node, w.link = "", 0
	first := !w.answer
	w.mu.Unlock()
	w.s.b.linkWorkers.remove(link, node)
	if first && !linkFault(err) {
		w.fail(err)
		return
	}
	w.s.b.log.Debug("forwarded worker: attaching again", "queue", w.name, "from", node, "why", err)
	w.rehome()
}

// linkFault reports whether err is the loss of a link or of a leader
// (code 29), after which the worker is attached again elsewhere.
func linkFault(err error) bool {
	e, ok := err.(*wire.Error)
	return ok && e.Code == wire.CodeUnavailable
}

// rehome starts (or goes on with) the search for w's queue's leader.
func (w *fwdWorker) rehome() {
	w.mu.Lock()
	if w.since.IsZero() {
		w.since = time.Now()
	}
	w.mu.Unlock()
	time.AfterFunc(rehomeRetry, w.tryHome)
}

// tryHome attaches w to its queue's leader once one is known: on this
// node, as a worker of its own, or on another, forwarded again.
func (w *fwdWorker) tryHome() {
	b := w.s.b
	w.mu.Lock()
	waiting, since := !w.closed && w.link == 0, w.since
	w.mu.Unlock()
	if !waiting {
		return
	}
	r := b.replicated()
	if r == nil {
		w.fail(wire.Errorf(wire.CodeUnavailable, "queue %q: this node left the cluster", w.name))
		return
	}
	if _, _, ok := r.Queue(w.name); !ok {
		w.fail(wire.Errorf(wire.CodeExchangeDeleted, "exchange %q was deleted", w.name))
		return
	}
	if ex, err := b.lookup(w.name); err == nil && ex.tq != nil && ex.tq.replicated {
		if w.attachHere(ex) {
			return
		}
	} else if node := b.forwardTarget(w.name); node != "" {
		w.attachTo(node)
		return
	}
	if time.Since(since) > rehomeTimeout {
		w.fail(wire.Errorf(wire.CodeUnavailable, "queue %q: no leader of its replicas took this worker within %s; attach again", w.name, rehomeTimeout))
		return
	}
	time.AfterFunc(rehomeRetry, w.tryHome)
}

// attachHere makes w a worker of ex, the queue this node now serves,
// under the client's id; false if it should try again later.
func (w *fwdWorker) attachHere(ex *Exchange) bool {
	s := w.s
	a := &Attachment{
		s: s, id: w.id, member: fmt.Sprintf("%s.%d", s.id, w.id), ex: ex, role: wire.RoleWorker,
		serviceTag: w.tag, connTag: w.spec.ConnTag, options: w.spec.Options,
		stripe: uint32(s.n) + w.id, tq: ex.tq,
	}
	w.mu.Lock()
	if w.closed || w.link != 0 {
		w.mu.Unlock()
		return true
	}
	s.mu.Lock()
	if s.closed || s.fwdWorkers[w.id] != w {
		s.mu.Unlock()
		w.mu.Unlock()
		return true
	}
	delete(s.fwdWorkers, w.id)
	s.attachments[a.id] = a
	s.mu.Unlock()
	w.closed = true
	first := !w.answer
	w.answer = true
	w.mu.Unlock()
	s.b.mu.Lock()
	s.b.members[a.member] = a
	s.b.mu.Unlock()
	if err := a.tq.attachConsumer(a, w.spec.Prefetch); err != nil {
		s.forget(a)
		if first {
			s.sendError(w.ref, err)
		} else {
			a.sendDetached(fmt.Sprintf("attached again on this node, the queue's new leader, and refused: %v", err))
		}
		return true
	}
	if first {
		s.reply(w.ref, jsonBody(wire.AttachResult{Member: a.member}), nil)
	}
	s.b.log.Info("forwarded worker: attached on this node, the queue's leader now", "queue", w.name)
	return true
}

// fail ends w with err: an ERROR to the client's ATTACH if it had no OK
// yet, EVENT detached otherwise.
func (w *fwdWorker) fail(err error) {
	if !w.close() {
		return
	}
	w.mu.Lock()
	first := !w.answer
	w.mu.Unlock()
	if first {
		w.s.sendError(w.ref, err)
		return
	}
	f := wire.NewFrame(wire.TypeEvent)
	f.Attach, f.Aux, f.Name, f.Tag = w.id, wire.EventDetached, w.name, asWireError(err).Msg
	w.s.sink.Deliver(f)
}

// close ends w: it leaves its session, and its attachment on the
// leader's node is detached (its unsettled tasks fail there, as a
// worker's that detaches). It reports whether w was open.
func (w *fwdWorker) close() bool {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false
	}
	w.closed = true
	node, link := w.node, w.link
	w.node, w.link = "", 0
	w.mu.Unlock()
	s := w.s
	s.mu.Lock()
	if s.fwdWorkers[w.id] == w {
		delete(s.fwdWorkers, w.id)
	}
	s.mu.Unlock()
	if link != 0 {
		s.b.linkWorkers.remove(link, node)
		f := wire.NewFrame(wire.TypeDetach)
		f.Attach = link
		_ = s.b.sendLink(node, f) // a link down detached it there already
	}
	return true
}

// forwardedWorker returns the session's forwarded worker id, or nil.
func (s *Session) forwardedWorker(id uint32) *fwdWorker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fwdWorkers[id]
}

// settleForwarded sends a client's ACK, NACK or PROGRESS of w's task to
// its leader's node, and takes ownership of f. While w is between two
// leaders it is dropped: the new leader delivers the task again.
func (w *fwdWorker) settleForwarded(f *wire.Frame) {
	w.mu.Lock()
	node, link := w.node, w.link
	w.mu.Unlock()
	if link == 0 {
		f.Release()
		return
	}
	f.Attach = link
	_ = w.s.b.sendLink(node, f)
}

// fromLeader hands a TASK or EVENT that node sent one of this node's
// forwarded workers to its client, and takes ownership of f. EVENT
// detached (the leader stopped serving the queue) is not passed on: the
// worker is attached again to the next leader.
func (b *Broker) fromLeader(node string, f *wire.Frame) {
	w := b.linkWorkers.get(f.Attach)
	if w == nil {
		f.Release()
		return
	}
	w.mu.Lock()
	current := w.node == node && w.link == f.Attach && !w.closed
	w.mu.Unlock()
	if !current {
		f.Release()
		return
	}
	if f.Type == wire.TypeEvent && f.Aux == wire.EventDetached {
		why := f.Tag
		link := f.Attach
		f.Release()
		w.lost(node, link, wire.Errorf(wire.CodeUnavailable, "node %s detached it: %s", node, why))
		return
	}
	f.Attach = w.id
	if f.Type == wire.TypeTask {
		w.s.stats.Delivered.Add(f.Ref, 1)
	}
	w.s.sink.Deliver(f)
}

// forwardedWorkersDown looks for a new leader for the workers attached
// to node, whose link dropped.
func (b *Broker) forwardedWorkersDown(node string) {
	for _, w := range b.linkWorkers.onNode(node) {
		w.mu.Lock()
		link := w.link
		w.mu.Unlock()
		w.lost(node, link, wire.Errorf(wire.CodeUnavailable, "the link to node %s dropped", node))
	}
}

// fromWorkerNode handles a forwarded worker's frame (ATTACH, DETACH,
// ACK, NACK, PROGRESS) that node sent this node, its queue's leader, and
// takes ownership of f: the peer session's, as a client's would be. Only
// a worker's ATTACH is taken, with a link id below the stand-ins'.
func (b *Broker) fromWorkerNode(p *peer, f *wire.Frame) {
	if f.Attach == 0 || f.Attach >= linkIDs || (f.Type == wire.TypeAttach && f.Aux != wire.RoleWorker) {
		if f.Type == wire.TypeAttach || f.Type == wire.TypeDetach {
			p.s.sendError(f.Ref, wire.Errorf(wire.CodeProtocol, "%s from node %s: only workers with ids 1 to %d are forwarded", f.Type, p.node, linkIDs-1))
		}
		f.Release()
		return
	}
	p.s.Handle(f)
}
