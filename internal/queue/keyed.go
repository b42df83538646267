package queue

import "math/bits"

// keyState is the state of one key of a keyed queue: the messages of the
// key that are due, in order, and the one message that blocks the key
// (in flight, or backing off after a failure). It exists while the key
// has such messages; delayed messages join their key when due. Guarded
// by Queue.mu.
//
// A key is schedulable when nothing blocks it and it has a waiting
// message; it then sits in exactly one keyQueue: its owner's (the
// consumer the ring maps it to), or the queue's orphans when no consumer
// can take it.
type keyState struct {
	name    string
	hash    uint64
	waiting msgList  // due messages, in order; the head goes next
	busy    *message // in flight or backing off: the key waits for it
	owner   *Consumer
	kq      *keyQueue // the keyQueue holding the key, nil if not schedulable
	level   uint8     // its level in kq: the priority of waiting.head

	prev, next *keyState // links in kq
}

// keyList is an intrusive doubly linked list of keys.
type keyList struct {
	head, tail *keyState
	n          int
}

func (l *keyList) pushBack(k *keyState) {
	k.prev, k.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = k
	} else {
		l.head = k
	}
	l.tail = k
	l.n++
}

func (l *keyList) remove(k *keyState) {
	if k.prev != nil {
		k.prev.next = k.next
	} else {
		l.head = k.next
	}
	if k.next != nil {
		k.next.prev = k.prev
	} else {
		l.tail = k.prev
	}
	k.prev, k.next = nil, nil
	l.n--
}

// keyQueue holds schedulable keys by the priority of their next message,
// FIFO within a level.
type keyQueue struct {
	levels [numPriorities]keyList
	mask   uint16 // bit p: levels[p] is not empty
	n      int
}

func (kq *keyQueue) push(k *keyState) {
	k.kq = kq
	k.level = k.waiting.head.prio
	kq.levels[k.level].pushBack(k)
	kq.mask |= 1 << k.level
	kq.n++
}

func (kq *keyQueue) remove(k *keyState) {
	l := &kq.levels[k.level]
	l.remove(k)
	if l.n == 0 {
		kq.mask &^= 1 << k.level
	}
	k.kq = nil
	kq.n--
}

// best returns the first key of the highest level, or nil.
func (kq *keyQueue) best() *keyState {
	if kq.mask == 0 {
		return nil
	}
	return kq.levels[bits.Len16(kq.mask)-1].head
}

// each calls fn with every key, level by level; fn may remove the key it
// is given.
func (kq *keyQueue) each(fn func(*keyState)) {
	for p := range kq.levels {
		for k := kq.levels[p].head; k != nil; {
			next := k.next
			fn(k)
			k = next
		}
	}
}

// joinKey adds m, just due, at the end of its key's waiting list,
// creating the key if needed. q.mu is held.
func (q *Queue) joinKey(m *message, front bool) {
	k := q.keys[m.key]
	if k == nil {
		k = q.newKey(m.key)
	}
	m.ks = k
	m.st = stReady
	wasEmpty := k.waiting.n == 0
	if front {
		k.waiting.pushFront(m)
	} else {
		k.waiting.pushBack(m)
	}
	if k.busy == nil && (wasEmpty || front) {
		q.routeKey(k)
	}
}

// routeKey puts k where it belongs after a change: in its ring owner's
// keyQueue if it is schedulable, nowhere if it is blocked, and forgotten
// if it has no message left. The owner is asked to serve. q.mu is held.
func (q *Queue) routeKey(k *keyState) {
	if k.kq != nil {
		k.kq.remove(k)
	}
	if k.busy != nil {
		return // blocked: routed again when it settles or is due
	}
	if k.waiting.n == 0 {
		delete(q.keys, k.name)
		q.cold.keys.Add(-1)
		if len(q.freeKeys) < maxFree {
			*k = keyState{}
			q.freeKeys = append(q.freeKeys, k)
		}
		return
	}
	k.owner = q.ring.pick(k.hash)
	if k.owner == nil {
		if q.orphans == nil {
			q.orphans = new(keyQueue)
		}
		q.orphans.push(k)
		return
	}
	k.owner.keys.push(k)
	q.kick(k.owner)
}

// rerouteAll moves every schedulable key whose ring owner changed (a
// consumer joined, or the active one changed). Keys blocked by a message
// in flight stay with their consumer until it settles. q.mu is held.
func (q *Queue) rerouteAll() {
	move := func(k *keyState) {
		if q.ring.pick(k.hash) != k.owner {
			q.routeKey(k)
		}
	}
	if q.orphans != nil {
		q.orphans.each(move)
	}
	for _, c := range q.consumers {
		c.keys.each(move)
	}
}

// rerouteFrom moves the schedulable keys of c, which left the ring, to
// their new owners: only its keys move. (Orphans exist only while the
// ring is empty, and a ring only becomes non-empty in rerouteAll's
// callers.) q.mu is held.
func (q *Queue) rerouteFrom(c *Consumer) {
	c.keys.each(q.routeKey)
}

// newKey creates the state of key, recycled if possible. q.mu is held.
func (q *Queue) newKey(key string) *keyState {
	var k *keyState
	if n := len(q.freeKeys); n > 0 {
		k = q.freeKeys[n-1]
		q.freeKeys[n-1] = nil
		q.freeKeys = q.freeKeys[:n-1]
	} else {
		k = new(keyState)
	}
	k.name, k.hash = key, keyHash(key)
	q.keys[key] = k
	q.cold.keys.Add(1)
	return k
}
