package broker

import (
	"sync"
	"time"

	"github.com/courier-mq/courier/wire"
)

// Forwarded submits (docs/replication.md, "In the broker", step 3). A
// SUBMIT made on a node that does not serve its replicated queue goes,
// unchanged but for its Ref, over the data link to the node whose
// replica leads: there it is the SUBMIT of that node's peer session, as
// a client's, and its OK (the confirm: the task committed in the
// queue's group) or ERROR comes back on the link with the same Ref. The
// entry node keeps, per peer, the submits waiting for an answer, and
// hands the answer to the client under the client's Ref. Only SUBMIT is
// forwarded yet: workers and watches still need the leader's node.

// Bounds of forwarded submits.
const (
	// maxForwarded bounds the submits a broker has waiting for another
	// node's answer; beyond it a submit to be forwarded is refused with
	// CodeLimit.
	maxForwarded = 1 << 16
	// forwardTimeout bounds the wait for the answer: after it the client
	// gets CodeUnavailable (the outcome is unknown; resend).
	forwardTimeout = 30 * time.Second
)

// forwardTable holds the forwarded submits waiting for an answer.
type forwardTable struct {
	mu     sync.Mutex
	next   uint64
	n      int
	byNode map[string]map[uint64]*forwarded
}

// forwarded is one submit (or a forwarded worker's ATTACH) waiting for
// its answer from node.
type forwarded struct {
	s     *Session
	ref   uint64 // the client's
	timer *time.Timer
	// done, when set, takes the answer instead of the client: the OK
	// frame (ownership with it), or the error (an ERROR from node, the
	// link's loss, the timeout).
	done func(ok *wire.Frame, err error)
	// watch: a WATCH or watched SUBMIT (forward_watch.go), whose OK
	// (answered) leaves it in the table until its last event; task is
	// its task's id, once known.
	watch, answered bool
	task            uint64
}

// fail hands fw the error err: to done, or to its client.
func (fw *forwarded) fail(err error) {
	if fw.timer != nil {
		fw.timer.Stop()
	}
	if fw.done != nil {
		fw.done(nil, err)
		return
	}
	fw.s.sendError(fw.ref, err)
}

// add records a submit of s with the client's ref, forwarded to node,
// and returns the Ref it travels with; ok is false when the table is
// full.
func (t *forwardTable) add(node string, s *Session, ref uint64) (uint64, *forwarded, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n >= maxForwarded {
		return 0, nil, false
	}
	if t.byNode == nil {
		t.byNode = map[string]map[uint64]*forwarded{}
	}
	m := t.byNode[node]
	if m == nil {
		m = map[uint64]*forwarded{}
		t.byNode[node] = m
	}
	t.next++
	fw := &forwarded{s: s, ref: ref}
	m[t.next] = fw
	t.n++
	return t.next, fw, true
}

// take removes and returns the submit forwarded to node under id.
func (t *forwardTable) take(node string, id uint64) *forwarded {
	t.mu.Lock()
	defer t.mu.Unlock()
	fw := t.byNode[node][id]
	if fw != nil {
		delete(t.byNode[node], id)
		t.n--
	}
	return fw
}

// takeNode removes and returns every submit forwarded to node.
func (t *forwardTable) takeNode(node string) []*forwarded {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.byNode[node]
	delete(t.byNode, node)
	t.n -= len(m)
	out := make([]*forwarded, 0, len(m))
	for _, fw := range m {
		out = append(out, fw)
	}
	return out
}

// forwardTarget returns the node a SUBMIT to name should be forwarded
// to: the leader of the replicated queue name when it is another node
// whose link is up; "" otherwise.
func (b *Broker) forwardTarget(name string) string {
	r := b.replicated()
	if r == nil {
		return ""
	}
	_, leader, ok := r.Queue(name)
	if !ok || leader == "" || leader == b.cfg.Node || b.peer(leader) == nil {
		return ""
	}
	return leader
}

// forwardCall records a call to node whose answer goes to done (or,
// with done nil, to s under the client's ref), and arms its timeout; it
// returns the Ref the call travels with, and false when the table is
// full. what names the call in the timeout's error.
func (b *Broker) forwardCall(node string, s *Session, ref uint64, what string, done func(*wire.Frame, error)) (uint64, bool) {
	id, fw, ok := b.fwd.add(node, s, ref)
	if !ok {
		return 0, false
	}
	fw.done = done
	fw.timer = time.AfterFunc(forwardTimeout, func() {
		if fw := b.fwd.expire(node, id); fw != nil {
			if fw.watch {
				fw.s.unwatch(fw.ref)
			}
			fw.fail(wire.Errorf(wire.CodeUnavailable, "%s: node %s, its queue's leader, did not answer within %s; the outcome is unknown: resend (deduplicated by pid and seq)", what, node, forwardTimeout))
		}
	})
	return id, true
}

// forwardSubmit sends f, a client's SUBMIT to a replicated queue led by
// node, to that node, and takes ownership of f.
func (s *Session) forwardSubmit(node string, f *wire.Frame) {
	b := s.b
	links := b.peerLinks.Load()
	ref := f.Ref
	wantReply := ref != 0 && f.Flags&wire.FlagReply != 0
	var id uint64
	if wantReply {
		var ok bool
		id, ok = b.forwardCall(node, s, ref, "submit to "+f.Name, nil)
		if !ok {
			f.Release()
			s.sendError(ref, wire.Errorf(wire.CodeLimit, "submit to %s: %d submits already wait for node %s or others", f.Name, maxForwarded, node))
			return
		}
	}
	f.Ref = id
	s.stats.Publishes.Add(1)
	if err := (*links).Send(node, f); err != nil && wantReply {
		if fw := b.fwd.take(node, id); fw != nil {
			fw.fail(wire.Errorf(wire.CodeUnavailable, "submit: the link to node %s, its queue's leader, is down; resend", node))
		}
	}
}

// forwardAnswer hands an OK or ERROR from node, the answer to a
// forwarded submit, to its client, and takes ownership of f.
func (b *Broker) forwardAnswer(node string, f *wire.Frame) {
	fw := b.fwd.answer(node, f)
	if fw == nil {
		f.Release() // timed out, or its node went down and back
		return
	}
	fw.timer.Stop()
	if fw.watch && !fw.answered {
		fw.s.unwatch(fw.ref) // refused: its entry is gone, nothing is sent
	}
	if fw.done != nil {
		if f.Type == wire.TypeError {
			err := wire.Errorf(wire.Code(f.Aux), "%s", f.Tag)
			f.Release()
			fw.done(nil, err)
			return
		}
		fw.done(f, nil)
		return
	}
	f.Ref = fw.ref
	fw.s.sink.Deliver(f)
}

// forwardPeerDown fails the submits waiting for node, which went away:
// their outcome is unknown.
func (b *Broker) forwardPeerDown(node string) {
	for _, fw := range b.fwd.takeNode(node) {
		if fw.watch {
			if fw.answered {
				fw.lostWatch(node)
				continue
			}
			fw.s.unwatch(fw.ref)
		}
		fw.fail(wire.Errorf(wire.CodeUnavailable, "node %s, the queue's leader, went away before it answered; the outcome is unknown: resend (a submit is deduplicated by pid and seq)", node))
	}
}
