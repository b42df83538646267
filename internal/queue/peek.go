package queue

import (
	"cmp"
	"container/heap"
	"slices"
)

// Peek returns up to n of the messages waiting for delivery, without
// delivering them: the queue, its counters and the messages' attempts are
// left as they are. It shows first the shared ready list, from the
// highest priority down, retried messages before the others, as a
// consumer would receive them, stopping at the first message of a level
// whose index is paged out to the journal's runs (the messages behind it
// are in RAM but not next); then keyed messages waiting for their turn,
// the oldest first (which key goes next depends on the consumers).
// Delayed messages and messages in flight are not shown. Bodies paged out
// are read back from the journal, with the queue's lock held: n should be
// small (the management API asks for at most 100).
func (q *Queue) Peek(n int) ([]Delivery, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, ErrClosed
	}
	var out []Delivery
	for p := numPriorities - 1; p >= 0 && len(out) < n; p-- {
		lv := &q.ready[p]
		for _, l := range []*msgList{&lv.retry, &lv.main} {
			for m := l.head; m != nil && len(out) < n; m = m.next {
				out = append(out, q.delivery(m))
			}
		}
		if len(lv.runs) > 0 || lv.spilled > 0 {
			break // the next messages of this level are in runs
		}
		for m := lv.tail.head; m != nil && len(out) < n; m = m.next {
			out = append(out, q.delivery(m))
		}
	}
	for _, m := range q.oldestKeyed(n - len(out)) {
		out = append(out, q.delivery(m))
	}
	return out, nil
}

// oldestKeyed returns the n oldest messages waiting behind their keys,
// oldest first. Each key's list is in order, so a key is left as soon as
// its next message is younger than the n found so far. q.mu is held.
func (q *Queue) oldestKeyed(n int) []*message {
	if n <= 0 {
		return nil
	}
	var h newest
	for _, k := range q.keys {
		for m := k.waiting.head; m != nil; m = m.next {
			if len(h) == n {
				if m.id > h[0].id {
					break
				}
				h[0] = m
				heap.Fix(&h, 0)
				continue
			}
			heap.Push(&h, m)
		}
	}
	slices.SortFunc(h, func(a, b *message) int { return cmp.Compare(a.id, b.id) })
	return h
}

// newest is a heap of messages, the youngest (highest id) on top.
type newest []*message

func (h newest) Len() int           { return len(h) }
func (h newest) Less(i, j int) bool { return h[i].id > h[j].id }
func (h newest) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *newest) Push(x any)        { *h = append(*h, x.(*message)) }
func (h *newest) Pop() any {
	old := *h
	m := old[len(old)-1]
	*h = old[:len(old)-1]
	return m
}
