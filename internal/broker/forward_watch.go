package broker

import (
	"fmt"

	"github.com/courier-mq/courier/wire"
)

// Forwarded watches (docs/replication.md, "In the broker", step 3). A
// WATCH, or a SUBMIT with FlagWatch, made on a node that does not serve
// its replicated queue goes over the data link to the node whose replica
// leads, as a forwarded submit does, under a Ref of the entry node's
// forward table: there it is the peer session's, and its OK (flag
// Watch) and then its TASKEVENT frames come back on the link with that
// Ref, until the last. The entry stays in the table until then, so the
// forward table's bound (maxForwarded) bounds the watches too.
//
// The client's CANCEL, and the end of its session, send a CANCEL with
// the queue's name to the leader's node (a CANCEL without a name over a
// link is a forwarded request's). When the link to the leader's node is
// lost, or that node stops serving the queue (its queue closes, and its
// watchers get TASKEVENT lost), the client gets TASKEVENT lost, the last
// event: the task itself is not affected, and the client may watch it
// again, wherever the queue is served now.

// forwardWatch sends f, a client's WATCH or SUBMIT with FlagWatch and a
// Ref, to node, which serves its replicated queue, and takes ownership
// of f.
func (s *Session) forwardWatch(node string, f *wire.Frame) {
	b := s.b
	ref, name := f.Ref, f.Name
	what := "submit to " + name
	if f.Type == wire.TypeWatch {
		what = fmt.Sprintf("watch of task %d of %s", f.Aux, name)
	}
	id, ok := b.forwardCall(node, s, ref, what, nil)
	if !ok {
		f.Release()
		s.sendError(ref, wire.Errorf(wire.CodeLimit, "%s: %d calls already wait for node %s or others", what, maxForwarded, node))
		return
	}
	b.fwd.markWatch(node, id, f.Aux)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		b.fwd.take(node, id).timer.Stop()
		f.Release()
		return
	}
	if s.watches == nil {
		s.watches = make(map[uint64]func())
	}
	s.watches[ref] = func() { b.cancelForwardedWatch(node, id, name) }
	s.mu.Unlock()
	if f.Type == wire.TypeSubmit {
		s.stats.Publishes.Add(1)
	}
	f.Ref = id
	if err := (*b.peerLinks.Load()).Send(node, f); err != nil {
		if fw := b.fwd.take(node, id); fw != nil {
			s.unwatch(ref)
			fw.fail(wire.Errorf(wire.CodeUnavailable, "%s: the link to node %s, its queue's leader, is down; try again", what, node))
		}
	}
}

// cancelForwardedWatch ends the watch forwarded to node under id: the
// client cancelled it, or its session ended.
func (b *Broker) cancelForwardedWatch(node string, id uint64, name string) {
	fw := b.fwd.take(node, id)
	if fw == nil {
		return // ended meanwhile
	}
	fw.timer.Stop()
	c := wire.NewFrame(wire.TypeCancel)
	c.Ref, c.Name = id, name
	if err := (*b.peerLinks.Load()).Send(node, c); err != nil {
		c.Release() // the link is down: so is the watch there
	}
}

// forwardEvent hands a TASKEVENT from node, of a watch forwarded there,
// to its client, and takes ownership of f.
func (b *Broker) forwardEvent(node string, f *wire.Frame) {
	last := f.Flags&wire.FlagLast != 0
	fw := b.fwd.event(node, f.Ref, last)
	if fw == nil {
		f.Release() // cancelled meanwhile
		return
	}
	if last {
		fw.s.unwatch(fw.ref) // its entry is gone: nothing is sent
	}
	f.Ref = fw.ref
	fw.s.sink.Deliver(f)
}

// lostWatch ends a forwarded watch whose node went away after its OK.
func (fw *forwarded) lostWatch(node string) {
	fw.s.unwatch(fw.ref)
	f := wire.NewFrame(wire.TypeTaskEvent)
	f.Ref, f.Aux, f.Flags = fw.ref, wire.TaskLost, wire.FlagLast
	f.Body = jsonBody(wire.TaskEventBody{ID: fw.task, Reason: fmt.Sprintf("the link to node %s, which served the queue, was lost; watch the task again", node)})
	fw.s.sink.Deliver(f)
}

// markWatch makes the call forwarded to node under id a watch of task
// (0 for a submit's, whose id comes with its OK).
func (t *forwardTable) markWatch(node string, id, task uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if fw := t.byNode[node][id]; fw != nil {
		fw.watch, fw.task = true, task
	}
}

// answer finds the call forwarded to node under f.Ref, f its OK or
// ERROR: it leaves the table unless it is a watch's OK, whose events
// follow.
func (t *forwardTable) answer(node string, f *wire.Frame) *forwarded {
	t.mu.Lock()
	defer t.mu.Unlock()
	fw := t.byNode[node][f.Ref]
	if fw == nil {
		return nil
	}
	if fw.watch && f.Type == wire.TypeOK && f.Flags&wire.FlagWatch != 0 {
		fw.answered, fw.task = true, f.Aux
		return fw
	}
	delete(t.byNode[node], f.Ref)
	t.n--
	return fw
}

// event finds the watch forwarded to node under id for one of its
// events; last takes it out of the table. Events of a watch not yet
// answered are dropped (its OK comes first).
func (t *forwardTable) event(node string, id uint64, last bool) *forwarded {
	t.mu.Lock()
	defer t.mu.Unlock()
	fw := t.byNode[node][id]
	if fw == nil || !fw.watch || !fw.answered {
		return nil
	}
	if last {
		delete(t.byNode[node], id)
		t.n--
	}
	return fw
}

// expire takes the call forwarded to node under id when its wait for
// an answer timed out: not a watch that was answered, which waits for
// its events as long as the task lasts.
func (t *forwardTable) expire(node string, id uint64) *forwarded {
	t.mu.Lock()
	defer t.mu.Unlock()
	fw := t.byNode[node][id]
	if fw == nil || fw.answered {
		return nil
	}
	delete(t.byNode[node], id)
	t.n--
	return fw
}
