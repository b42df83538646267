package queue

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// msgDump is a message's state as tests compare it.
type msgDump struct {
	ID       uint64
	Body     string
	Headers  string
	Key      string
	Prio     uint8
	Attempts uint32
	State    string
	Due      int64 // delayed and backing off only
	Expires  int64
}

// queueDump is a queue's state: its messages, the order of each
// priority level and of each key.
type queueDump struct {
	Msgs   []msgDump
	Levels [numPriorities][]uint64
	Keys   map[string][]uint64 // busy message first, then waiting ones
	NextID uint64
}

var stateNames = map[state]string{stReady: "ready", stDelayed: "delayed", stBackoff: "backoff", stInflight: "inflight"}

// dump returns q's state; inflightAsReady describes messages in flight
// as ready again, as a restart finds them.
func (q *Queue) dump(inflightAsReady bool) queueDump {
	q.mu.Lock()
	defer q.mu.Unlock()
	d := queueDump{Keys: map[string][]uint64{}, NextID: q.nextID}
	for _, m := range q.index {
		b, h := m.body, m.headers
		if m.paged {
			b, h = q.readBack(m)
		}
		md := msgDump{ID: m.id, Body: string(b), Key: m.key, Prio: m.prio, Attempts: m.attempts, State: stateNames[m.st], Expires: m.expires}
		var hs []string
		for _, k := range slices.Sorted(maps.Keys(h)) {
			hs = append(hs, k+"="+h[k])
		}
		md.Headers = strings.Join(hs, ",")
		if m.st == stDelayed || m.st == stBackoff {
			md.Due = m.due
		}
		if inflightAsReady && m.st == stInflight {
			md.State = "ready"
		}
		d.Msgs = append(d.Msgs, md)
	}
	for p := range q.ready {
		lv := &q.ready[p]
		for _, l := range []*msgList{&lv.retry, &lv.main} {
			for m := l.head; m != nil; m = m.next {
				d.Levels[p] = append(d.Levels[p], m.id)
			}
		}
		for _, m := range q.spilledMessages(p) {
			if _, released := q.runReleased[m.ref]; released {
				continue
			}
			d.Levels[p] = append(d.Levels[p], m.id)
			md := msgDump{ID: m.id, Prio: uint8(p), State: "ready", Expires: m.expires}
			if a, ok := q.runAttempts[m.id]; ok {
				md.Attempts = a.attempts
			}
			b, h := q.readBack(m)
			md.Body = string(b)
			var hs []string
			for _, k := range slices.Sorted(maps.Keys(h)) {
				hs = append(hs, k+"="+h[k])
			}
			md.Headers = strings.Join(hs, ",")
			d.Msgs = append(d.Msgs, md)
		}
		for m := lv.tail.head; m != nil; m = m.next {
			d.Levels[p] = append(d.Levels[p], m.id)
		}
	}
	slices.SortFunc(d.Msgs, func(a, b msgDump) int { return int(a.ID - b.ID) })
	for name, k := range q.keys {
		var order []uint64
		if k.busy != nil && k.busy.st == stBackoff {
			order = append(order, k.busy.id)
		}
		for m := k.waiting.head; m != nil; m = m.next {
			order = append(order, m.id)
		}
		if len(order) > 0 {
			d.Keys[name] = order
		}
	}
	return d
}

// spilledMessages reads the entries of level p's runs that are still to
// be read, in order, without changing the queue. q.mu is held.
func (q *Queue) spilledMessages(p int) []*message {
	var out []*message
	for _, r := range q.ready[p].runs {
		buf := make([]byte, r.left()*runEntrySize)
		n, err := q.spiller.ReadRun(r.num, runHeaderSize+int64(r.next)*runEntrySize, buf)
		if err != nil || n != len(buf) {
			panic(fmt.Sprintf("read run %d: %d bytes, %v", r.num, n, err))
		}
		for i := 0; i < len(buf); i += runEntrySize {
			m := &message{hidx: -1}
			if !decodeRunEntry(buf[i:i+runEntrySize], m) {
				panic("bad run entry")
			}
			out = append(out, m)
		}
	}
	return out
}

// keyOwner returns the consumer the ring gives key to, or "".
func (q *Queue) keyOwner(key string) string {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c := q.ring.pick(keyHash(key)); c != nil {
		return c.id
	}
	return ""
}

// check verifies the queue's invariants and returns the first broken one.
func (q *Queue) check() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var ready, unacked, delayed int64
	for _, m := range q.index {
		switch m.st {
		case stReady:
			ready++
		case stInflight:
			unacked++
			if m.owner == nil || m.list != &m.owner.unacked {
				return fmt.Errorf("message %d in flight but not on its consumer's list", m.id)
			}
		case stDelayed, stBackoff:
			delayed++
			if m.hidx < 0 {
				return fmt.Errorf("message %d %s but not in the timer heap", m.id, stateNames[m.st])
			}
		default:
			return fmt.Errorf("message %d in state %d", m.id, m.st)
		}
	}
	var spilled int64
	for p := range q.ready {
		lv := &q.ready[p]
		n := int64(0)
		for _, r := range lv.runs {
			n += r.left()
		}
		if n != lv.spilled {
			return fmt.Errorf("level %d: %d spilled, runs hold %d", p, lv.spilled, n)
		}
		if len(lv.runs) == 0 && lv.tail.n > 0 {
			return fmt.Errorf("level %d: a tail of %d and no runs", p, lv.tail.n)
		}
		if !lv.empty() != (q.readyMask&(1<<p) != 0) {
			return fmt.Errorf("level %d: empty %v, mask %b", p, lv.empty(), q.readyMask)
		}
		spilled += n
	}
	ready += spilled
	var resident, paged int64
	for _, m := range q.index {
		resident += m.cost()
		if m.paged {
			paged++
		}
	}
	if resident != q.resident || paged != q.nPaged || spilled != q.nSpilled {
		return fmt.Errorf("accounting: resident %d paged %d spilled %d, counted %d %d %d", resident, paged, spilled, q.resident, q.nPaged, q.nSpilled)
	}
	s := q.Stats()
	if s.Ready != ready || s.Unacked != unacked || s.Delayed != delayed {
		return fmt.Errorf("counters %d/%d/%d, messages %d/%d/%d", s.Ready, s.Unacked, s.Delayed, ready, unacked, delayed)
	}
	inflightKeys := map[string]bool{}
	for _, c := range q.consumers {
		for m := c.unacked.head; m != nil; m = m.next {
			if m.key == "" {
				continue
			}
			if inflightKeys[m.key] {
				return fmt.Errorf("key %q has two messages in flight", m.key)
			}
			inflightKeys[m.key] = true
		}
	}
	if q.readyMask != 0 && q.hungry.head != nil {
		return fmt.Errorf("ready messages while consumer %s has credit", q.hungry.head.id)
	}
	for _, c := range q.consumers {
		if c.credit() && c.keys.n > 0 {
			return fmt.Errorf("consumer %s has credit and %d keys waiting", c.id, c.keys.n)
		}
	}
	if int64(len(q.keys)) != s.Keys {
		return fmt.Errorf("%d keys, counter %d", len(q.keys), s.Keys)
	}
	return nil
}

// smallRuns makes runs, refills and heads tiny for the test, so that a
// few hundred messages spill.
func smallRuns(t testing.TB) {
	old := [4]int64{int64(spillBatch), int64(refillLow), refillBatch, int64(keepMin)}
	spillBatch, refillLow, refillBatch, keepMin = 16, 4, 8, 8
	t.Cleanup(func() {
		spillBatch, refillLow, refillBatch, keepMin = int(old[0]), int(old[1]), old[2], int(old[3])
	})
}
