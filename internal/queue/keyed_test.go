package queue

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

// keyRun drives workers synchronously: it takes each worker's deliveries,
// checks that no key has two messages in flight, and settles them with
// settle (ack by default) in a shuffled order, until nothing moves.
type keyRun struct {
	t        *testing.T
	q        *Queue
	ws       []*worker
	rng      *rand.Rand
	inflight map[string]string           // key -> worker holding one of its messages
	seq      map[string][]string         // key -> bodies in delivery order
	owner    map[string]string           // key -> worker of its last delivery
	moved    map[string]int              // key -> times its worker changed
	per      map[string]int              // worker -> deliveries
	settle   func(w *worker, d Delivery) // nil: ack
}

func newKeyRun(t *testing.T, q *Queue, ws ...*worker) *keyRun {
	return &keyRun{t: t, q: q, ws: ws, rng: rand.New(rand.NewPCG(1, 2)),
		inflight: map[string]string{}, seq: map[string][]string{}, owner: map[string]string{},
		moved: map[string]int{}, per: map[string]int{}}
}

// run settles deliveries until none is left, and returns how many it saw.
func (r *keyRun) run() int {
	r.t.Helper()
	total := 0
	for {
		n := 0
		for _, w := range r.ws {
			got := w.take()
			for _, d := range got {
				if d.Key == "" {
					continue
				}
				if h, ok := r.inflight[d.Key]; ok {
					r.t.Fatalf("key %s delivered to %s while in flight with %s", d.Key, w.ID(), h)
				}
				r.inflight[d.Key] = w.ID()
				r.seq[d.Key] = append(r.seq[d.Key], string(d.Body))
				if o, ok := r.owner[d.Key]; ok && o != w.ID() {
					r.moved[d.Key]++
				}
				r.owner[d.Key] = w.ID()
				r.per[w.ID()]++
			}
			r.rng.Shuffle(len(got), func(i, j int) { got[i], got[j] = got[j], got[i] })
			for _, d := range got {
				delete(r.inflight, d.Key)
				if r.settle != nil {
					r.settle(w, d)
				} else if err := r.q.Ack(w.Consumer, d.ID); err != nil {
					r.t.Fatal(err)
				}
			}
			n += len(got)
		}
		if err := r.q.check(); err != nil {
			r.t.Fatal(err)
		}
		if n == 0 {
			return total
		}
		total += n
	}
}

func keyName(i int) string { return "key-" + strconv.Itoa(i) }

func enqueueKeys(t *testing.T, q *Queue, keys, per int, tag string) {
	for i := range per {
		for k := range keys {
			mustEnqueue(t, q, Message{Key: keyName(k), Body: fmt.Appendf(nil, "%s%d", tag, i)})
		}
	}
}

func workers(t *testing.T, q *Queue, n, prefetch int) []*worker {
	var ws []*worker
	for i := range n {
		ws = append(ws, addWorker(t, q, fmt.Sprintf("w%d", i), prefetch))
	}
	return ws
}

func TestKeyedOneAtATimeInOrderInParallel(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	ws := workers(t, q, 4, 50)
	const keys, per = 500, 8
	enqueueKeys(t, q, keys, per, "")
	r := newKeyRun(t, q, ws...)
	if n := r.run(); n != keys*per {
		t.Fatalf("%d deliveries, want %d", n, keys*per)
	}
	for k := range keys {
		want := make([]string, per)
		for i := range want {
			want[i] = strconv.Itoa(i)
		}
		if got := r.seq[keyName(k)]; !slices.Equal(got, want) {
			t.Fatalf("key %d delivered %v, want %v", k, got, want)
		}
	}
	if len(r.moved) != 0 {
		t.Fatalf("%d keys changed consumer with no membership change", len(r.moved))
	}
	// Keys spread over all consumers by the ring: about 125 each.
	share := map[string]int{}
	for _, o := range r.owner {
		share[o]++
	}
	for _, w := range ws {
		if s := share[w.ID()]; s < keys/4/2 || s > keys/4*2 {
			t.Fatalf("%s owns %d of %d keys: %v", w.ID(), s, keys, share)
		}
	}
	if s := q.Stats(); s.Keys != 0 || s.Messages() != 0 {
		t.Fatalf("left over: %+v", s)
	}
}

func TestKeyedJoinMovesOnlyItsShare(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	ws := workers(t, q, 4, 100)
	const keys = 2000
	enqueueKeys(t, q, keys, 1, "a")
	r := newKeyRun(t, q, ws...)
	r.run()
	before := copyMap(r.owner)

	ws = append(ws, addWorker(t, q, "new", 100))
	r.ws = ws
	enqueueKeys(t, q, keys, 1, "b")
	r.run()
	moved := 0
	for k, o := range r.owner {
		if o == before[k] {
			continue
		}
		if o != "new" {
			t.Fatalf("key %s moved from %s to %s, not to the new consumer", k, before[k], o)
		}
		moved++
	}
	// The new consumer takes about a fifth.
	if moved < keys/10 || moved > keys*35/100 {
		t.Fatalf("%d of %d keys moved to the new consumer", moved, keys)
	}
}

func TestKeyedLeaveMovesOnlyItsKeys(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	ws := workers(t, q, 4, 100)
	const keys = 2000
	enqueueKeys(t, q, keys, 1, "a")
	r := newKeyRun(t, q, ws...)
	r.run()
	before := copyMap(r.owner)

	gone := ws[1]
	must(t, q.RemoveConsumer(gone.Consumer))
	r.ws = slices.Delete(ws, 1, 2)
	enqueueKeys(t, q, keys, 1, "b")
	r.run()
	spread := map[string]int{}
	for k, o := range r.owner {
		switch {
		case o == gone.ID():
			t.Fatalf("key %s still on the removed consumer", k)
		case before[k] == gone.ID():
			spread[o]++
		case o != before[k]:
			t.Fatalf("key %s moved from %s to %s though its consumer stayed", k, before[k], o)
		}
	}
	if len(spread) != 3 {
		t.Fatalf("the removed consumer's keys went to %v, want all three others", spread)
	}
}

func TestKeyedInFlightKeyStaysUntilSettled(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	a := addWorker(t, q, "a", 1000)
	const keys = 300
	enqueueKeys(t, q, keys, 1, "first")
	first := a.take()
	if len(first) != keys {
		t.Fatalf("a got %d", len(first))
	}
	b := addWorker(t, q, "b", 1000)
	var toB []Delivery
	for _, d := range first {
		if q.keyOwner(d.Key) == "b" {
			toB = append(toB, d)
		}
	}
	if len(toB) < keys/4 {
		t.Fatalf("only %d keys would move to b", len(toB))
	}
	enqueueKeys(t, q, keys, 1, "second")
	if n := b.n() + a.n(); n != 0 {
		t.Fatalf("%d second messages delivered while their keys are in flight", n)
	}
	// Settle the keys that move: their next message goes to b, in order.
	for _, d := range toB {
		must(t, q.Ack(a.Consumer, d.ID))
	}
	got := b.take()
	if len(got) != len(toB) || a.n() != 0 {
		t.Fatalf("b got %d of %d, a %d", len(got), len(toB), a.n())
	}
	for i, d := range got {
		if d.Key != toB[i].Key || string(d.Body) != "second0" {
			t.Fatalf("b got %s %q, want %s second0", d.Key, d.Body, toB[i].Key)
		}
	}
	// The others stay with a.
	for _, d := range first {
		if q.keyOwner(d.Key) == "a" {
			must(t, q.Ack(a.Consumer, d.ID))
		}
	}
	if n := a.n(); n != keys-len(toB) {
		t.Fatalf("a got %d second messages, want %d", n, keys-len(toB))
	}
	if err := q.check(); err != nil {
		t.Fatal(err)
	}
}

func TestKeyedFailureDelaysOnlyItsKey(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.BackoffBase = 10 * time.Second; c.BackoffMax = time.Minute })
	ws := workers(t, q, 3, 20)
	const keys, per = 300, 5
	enqueueKeys(t, q, keys, per, "")
	bad := keyName(7)
	failed := false
	r := newKeyRun(t, q, ws...)
	r.settle = func(w *worker, d Delivery) {
		if d.Key == bad && !failed {
			failed = true
			must(t, q.Nack(w.Consumer, d.ID, true))
			return
		}
		must(t, q.Ack(w.Consumer, d.ID))
	}
	r.run() // no time passes
	for k := range keys {
		name := keyName(k)
		if name == bad {
			if got := r.seq[name]; !slices.Equal(got, []string{"0"}) {
				t.Fatalf("failing key delivered %v while backing off", got)
			}
			continue
		}
		if n := len(r.seq[name]); n != per {
			t.Fatalf("key %s: %d of %d delivered while another key backs off", name, n, per)
		}
	}
	checkStats(t, q, per-1, 0, 1)
	e.clk.Advance(10*time.Second - 1)
	if r.run() != 0 {
		t.Fatal("redelivered before the backoff ended")
	}
	e.clk.Advance(1)
	r.run()
	if got, want := r.seq[bad], []string{"0", "0", "1", "2", "3", "4"}; !slices.Equal(got, want) {
		t.Fatalf("failing key delivered %v, want %v", got, want)
	}
}

func TestKeyedConsumerGoneKeepsOrder(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	a := addWorker(t, q, "a", 10)
	for i := range 3 {
		mustEnqueue(t, q, Message{Key: "k", Body: body(i)})
	}
	if got := a.take(); len(got) != 1 || string(got[0].Body) != "m0" {
		t.Fatalf("a got %v", got)
	}
	b := addWorker(t, q, "b", 10)
	must(t, q.RemoveConsumer(a.Consumer))
	if b.n() != 0 {
		t.Fatal("the key's next message overtook the failed one")
	}
	e.clk.Advance(100 * time.Millisecond)
	r := newKeyRun(t, q, b)
	r.run()
	if got := r.seq["k"]; !slices.Equal(got, []string{"m0", "m1", "m2"}) {
		t.Fatalf("after the failover: %v", got)
	}
}

func TestKeyedDelayedJoinsWhenDue(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	w := addWorker(t, q, "w", 10)
	mustEnqueue(t, q, Message{Key: "k", Body: []byte("later"), DueAt: epoch.Add(10 * time.Second)})
	mustEnqueue(t, q, Message{Key: "k", Body: []byte("now")})
	got := w.take()
	if len(got) != 1 || string(got[0].Body) != "now" {
		t.Fatalf("got %v", got)
	}
	e.clk.Advance(10 * time.Second)
	if w.n() != 0 {
		t.Fatal("due message overtook the key's message in flight")
	}
	must(t, q.Ack(w.Consumer, got[0].ID))
	if got := w.take(); len(got) != 1 || string(got[0].Body) != "later" {
		t.Fatalf("got %v", got)
	}
}

func TestKeyedAndPlainMessagesShareCredit(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	for i := range 4 {
		mustEnqueue(t, q, Message{Body: body(i)})
		mustEnqueue(t, q, Message{Key: "k", Body: body(100 + i)})
	}
	mustEnqueue(t, q, Message{Key: "urgent", Body: []byte("u"), Priority: 5})
	w := addWorker(t, q, "w", 3)
	// The high-priority key first, then the oldest: plain 1, key k's first.
	got := ids(w.take())
	if !slices.Equal(got, []uint64{9, 1, 2}) {
		t.Fatalf("got %v", got)
	}
	r := newKeyRun(t, q, w)
	for _, id := range got {
		must(t, q.Ack(w.Consumer, id))
	}
	r.run()
	if got := r.seq["k"]; !slices.Equal(got, []string{"m101", "m102", "m103"}) {
		t.Fatalf("key k after the first: %v", got)
	}
}

func copyMap(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// TestKeyWaitsForDurableAck checks that the next task of a key is not
// delivered before the ack of the one before is durable: a crash (a
// failover, on a replicated queue) that lost the ack would deliver the
// first again after the second, out of order. The chaos suite found it
// (cluster-queue-kill, seed 11): a key's task delivered again after the
// next one, once the leader that had taken the ack was killed.
func TestKeyWaitsForDurableAck(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	a := mustEnqueue(t, q, Message{Key: "k", Body: body(0)})
	b := mustEnqueue(t, q, Message{Key: "k", Body: body(1)})
	u := mustEnqueue(t, q, Message{Body: body(2)})
	e.j.Manual = true
	w := addWorker(t, q, "w", 10)
	if got := ids(w.take()); !slices.Equal(got, []uint64{a, u}) {
		t.Fatalf("delivered %v, want %v", got, []uint64{a, u})
	}
	must(t, q.Ack(w.Consumer, a))
	must(t, q.Ack(w.Consumer, u))
	if got := w.take(); len(got) != 0 {
		t.Fatalf("delivered %v before the ack of %d was durable", ids(got), a)
	}
	e.j.Sync()
	deadline := time.Now().Add(10 * time.Second)
	for w.n() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := ids(w.take()); !slices.Equal(got, []uint64{b}) {
		t.Fatalf("after the sync: delivered %v, want [%d]", got, b)
	}
	// Where the journal answers at once, the key is freed at once.
	e.j.Manual = false
	c := mustEnqueue(t, q, Message{Key: "k", Body: body(3)})
	must(t, q.Ack(w.Consumer, b))
	if got := ids(w.take()); !slices.Equal(got, []uint64{c}) {
		t.Fatalf("with a synchronous journal: delivered %v, want [%d]", got, c)
	}
}

// TestPullerAckFreesKeyAtOnce: a puller's ack (AMQP basic.get) frees its
// key at once, durable or not, so that the next get finds the key's next
// message.
func TestPullerAckFreesKeyAtOnce(t *testing.T) {
	e := newEnv(t)
	q := e.queue(nil)
	a := mustEnqueue(t, q, Message{Key: "k", Body: body(0)})
	b := mustEnqueue(t, q, Message{Key: "k", Body: body(1)})
	e.j.Manual = true
	p, err := q.AddPuller("p")
	must(t, err)
	d, ok, err := q.Take(p)
	must(t, err)
	if !ok || d.ID != a {
		t.Fatalf("take: %d %v, want %d", d.ID, ok, a)
	}
	must(t, q.Ack(p, a))
	d, ok, err = q.Take(p)
	must(t, err)
	if !ok || d.ID != b {
		t.Fatalf("take after the ack: %d %v, want %d", d.ID, ok, b)
	}
}

// lostReleases is a journal whose releases fail: as a replica's, once it
// no longer leads.
type lostReleases struct{ *MemJournal }

func (j lostReleases) Release(refs []Ref, done func(error)) error {
	if err := j.MemJournal.Release(refs, nil); err != nil {
		return err
	}
	if done != nil {
		done(errors.New("no longer the leader"))
	}
	return nil
}

// TestKeyStaysBlockedWhenAckLost: an ack whose release failed may be
// lost, so the key's next task is not delivered (the chaos suite found
// an isolated leader delivering it as it stepped down, its ack never
// committed, and the new leader then delivering the first again).
func TestKeyStaysBlockedWhenAckLost(t *testing.T) {
	e := newEnv(t)
	q := e.queue(func(c *Config) { c.Journal = lostReleases{e.j} })
	a := mustEnqueue(t, q, Message{Key: "k", Body: body(0)})
	mustEnqueue(t, q, Message{Key: "k", Body: body(1)})
	w := addWorker(t, q, "w", 10)
	if got := ids(w.take()); !slices.Equal(got, []uint64{a}) {
		t.Fatalf("delivered %v, want [%d]", got, a)
	}
	must(t, q.Ack(w.Consumer, a))
	if got := w.take(); len(got) != 0 {
		t.Fatalf("delivered %v after the ack of %d was lost", ids(got), a)
	}
}
