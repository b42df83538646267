package queue

// Peek returns up to n of the messages next in line for delivery, without
// delivering them: the queue, its counters and the messages' attempts are
// left as they are. It walks the shared ready list from the highest
// priority down, retried messages before the others, as a consumer would
// receive them, and stops at the first message of a level whose index is
// paged out to the journal's runs (the messages behind it are in RAM but
// not next). Keyed messages waiting behind their key, delayed messages
// and messages in flight are not shown. Bodies paged out are read back
// from the journal, with the queue's lock held: n should be small (the
// management API asks for at most 100).
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
	return out, nil
}
