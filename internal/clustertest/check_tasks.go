package clustertest

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// TaskEvent says what happened to a task, or to a worker.
type TaskEvent string

// Task events.
const (
	// TaskConfirmed: the broker confirmed the submit.
	TaskConfirmed TaskEvent = "confirmed"
	// TaskFailed: the broker refused the submit; the task may still be
	// there (a refusal after the record committed), or not.
	TaskFailed TaskEvent = "failed"
	// TaskUnknown: the submit timed out, or its connection was lost, or
	// the answer was "unavailable" (code 29): its outcome is unknown.
	TaskUnknown TaskEvent = "unknown"
	// TaskDelivered: a worker received the task.
	TaskDelivered TaskEvent = "delivered"
	// TaskAcked: the worker sent the delivery's ack (recorded just before
	// the ack was sent: the broker settles it later, if at all).
	TaskAcked TaskEvent = "acked"
	// TaskWorkerEnded: a worker's attachment ended; what it held and had
	// not acked is no longer in flight there. Detail says why:
	// "connection" (its connection ended), "detached" (the broker
	// detached it) or "stopped" (the run ended).
	TaskWorkerEnded TaskEvent = "worker-ended"
)

// Reasons a worker ended, in [TaskRecord.Detail].
const (
	WorkerLostConnection = "connection"
	WorkerDetached       = "detached"
	WorkerStopped        = "stopped"
)

// TaskRecord is one task event; ID is the task's identity as the test
// chose it (its body, say), the same in every event of the task.
type TaskRecord struct {
	ID    string    `json:"id,omitempty"`
	Event TaskEvent `json:"event"`
	// Key is the task's key (scoped by broker where brokers are
	// separate); "" for an unkeyed task.
	Key string `json:"key,omitempty"`
	// Node is the node the producer or worker was connected to.
	Node string `json:"node,omitempty"`
	// Worker names the worker's attachment (one per attach: a worker
	// that attaches again is another), for deliveries, acks and ends.
	Worker string `json:"worker,omitempty"`
	// Delivery numbers a delivery, unique in the history; an ack carries
	// the number of the delivery it settles.
	Delivery int64 `json:"delivery,omitempty"`
	// Attempts is the delivery's failed attempts so far (courier.Job).
	Attempts int `json:"attempts,omitempty"`
	// Call is when a submit was called (its outcome's Time is when it
	// returned).
	Call int64 `json:"call_ns,omitempty"`
	// Time is when the event was seen.
	Time int64 `json:"t_ns"`
	// Detail says more: a submit's error, why a worker ended.
	Detail string `json:"detail,omitempty"`
}

// submitted reports whether the record is a submit's outcome.
func (t TaskRecord) submitted() bool {
	return t.Event == TaskConfirmed || t.Event == TaskFailed || t.Event == TaskUnknown
}

// CheckTasks checks that every confirmed task was delivered at least
// once. Duplicates, which at-least-once allows, are counted in a note;
// so are deliveries of tasks never confirmed (a submit whose confirm was
// lost may still have been enqueued), and submits that failed or whose
// outcome is unknown, which may or may not be there.
func CheckTasks(s Snapshot) Result {
	r := Result{Checker: "tasks"}
	confirmed := map[string]int64{}
	var order []string
	delivered := map[string]int{}
	uncertain := map[TaskEvent]int{}
	for _, t := range s.Tasks {
		switch t.Event {
		case TaskConfirmed:
			if _, ok := confirmed[t.ID]; !ok {
				order = append(order, t.ID)
			}
			confirmed[t.ID] = t.Time
		case TaskFailed, TaskUnknown:
			uncertain[t.Event]++
		case TaskDelivered:
			delivered[t.ID]++
		}
	}
	dups, unconfirmed := 0, 0
	for _, id := range order {
		if delivered[id] == 0 {
			r.violate("task %s confirmed at %s, never delivered", id, ms(confirmed[id]))
		}
	}
	for id, n := range delivered {
		if n > 1 {
			dups += n - 1
		}
		if _, ok := confirmed[id]; !ok {
			unconfirmed++
		}
	}
	if dups > 0 {
		r.note("%d duplicate deliveries (at-least-once allows them)", dups)
	}
	if unconfirmed > 0 {
		r.note("%d tasks delivered without a confirm (a confirm lost in a fault)", unconfirmed)
	}
	if n := uncertain[TaskFailed] + uncertain[TaskUnknown]; n > 0 {
		r.note("%d submits failed and %d of unknown outcome: each may or may not be there", uncertain[TaskFailed], uncertain[TaskUnknown])
	}
	if f := firstConfirms(s); f != "" {
		r.note("first confirmed submit called after each fault began: %s", f)
	}
	r.Checked = fmt.Sprintf("%d confirmed tasks, %d delivered: every confirmed task delivered at least once", len(order), len(delivered))
	return r
}

// firstConfirms says, per fault, how long after it began the first
// submit called since was confirmed (whichever node took it): for a
// kill of a queue's leader node, its failover as clients see it.
func firstConfirms(s Snapshot) string {
	var parts []string
	for _, n := range s.Nemeses {
		first := int64(-1)
		for _, t := range s.Tasks {
			if t.Event == TaskConfirmed && t.Call >= n.Start && (first < 0 || t.Time < first) {
				first = t.Time
			}
		}
		d := "none"
		if first >= 0 {
			d = time.Duration(first - n.Start).Round(time.Millisecond).String()
		}
		parts = append(parts, fmt.Sprintf("%s %s %s", n.Name, strings.Join(n.Nodes, ","), d))
	}
	return strings.Join(parts, "; ")
}

// delivery is one delivery with the time it stopped being in flight.
type delivery struct {
	TaskRecord
	end    int64  // acked, its worker ended, or its node killed
	acked  int64  // when the ack was sent; 0 if never
	ended  string // how its worker ended ("" while it lasts)
	killed bool   // its worker's node was killed while it was in flight
	// mayFail: its worker lost its connection (not to a kill) before an
	// ack got through, so the broker may count a failed attempt.
	mayFail bool
}

// workerEnd is how and when a worker's attachment ended.
type workerEnd struct {
	time   int64
	detail string
	node   string
}

// killWindow is how far around a kill of its node a worker's lost
// connection is taken for the kill's doing: the client sees the reset
// at once, but the kill is recorded only once the process is gone, and
// the test process may stall between the two.
const killWindow = 250 * time.Millisecond

// killNotice is how long after a kill of its node is recorded a worker
// may see its connection end and still owe it to the kill (the test
// process may stall in between).
const killNotice = 2 * time.Second

// ackLag is how long before its worker's connection ended an ack may
// have been sent and still not reached the broker (a connection to a
// stopped node holds it until the client gives up).
const ackLag = 10 * time.Second

// unseenLag is how long after a worker lost its connection a task it
// may have failed unseen (its TASK lost with the connection) comes
// again: its backoff after one attempt is 100 ms, but a node stopped
// (SIGSTOP, up to 6 s in the scenarios) sees the loss only once it
// runs again.
const unseenLag = 10 * time.Second

// kills lists, per node, the times it was killed (nemeses named
// "kill...").
func (s Snapshot) kills() map[string][]int64 {
	k := map[string][]int64{}
	for _, n := range s.Nemeses {
		if strings.HasPrefix(n.Name, "kill") {
			for _, node := range n.Nodes {
				k[node] = append(k[node], n.Start)
			}
		}
	}
	for _, ts := range k {
		slices.Sort(ts)
	}
	return k
}

// killAfter returns the first kill of node at or after t (less the
// kill window), or 0.
func killAfter(kills map[string][]int64, node string, t int64) int64 {
	for _, k := range kills[node] {
		if k >= t-int64(killWindow) {
			return k
		}
	}
	return 0
}

// deliveries pairs every delivery with its ack and its worker's end,
// in order of delivery.
func (s Snapshot) deliveries() []*delivery {
	kills := s.kills()
	ends := map[string]workerEnd{}
	acks := map[int64]int64{}
	for _, t := range s.Tasks {
		switch t.Event {
		case TaskWorkerEnded:
			ends[t.Worker] = workerEnd{time: t.Time, detail: t.Detail, node: t.Node}
		case TaskAcked:
			acks[t.Delivery] = t.Time
		}
	}
	var out []*delivery
	for _, t := range s.Tasks {
		if t.Event != TaskDelivered {
			continue
		}
		d := &delivery{TaskRecord: t, end: s.Duration, acked: acks[t.Delivery]}
		if d.acked > 0 {
			d.end = d.acked
		}
		we, ended := ends[t.Worker]
		if ended && we.time < d.end {
			d.end, d.ended = we.time, we.detail
		}
		if k := killAfter(kills, t.Node, t.Time); k > 0 && k < d.end+int64(killWindow) && (d.acked == 0 || k < d.acked) {
			d.end, d.killed = min(d.end, k), true
		}
		// The worker's connection ended, not to a kill of its node:
		// the node fails what the worker held unacked (an attempt
		// each), an ack still on the way included.
		if ended && we.detail == WorkerLostConnection && !d.killed {
			lostAt := we.time
			byKill := false
			for _, k := range kills[t.Node] {
				if lostAt >= k-int64(killWindow) && lostAt <= k+int64(killNotice) {
					byKill = true
				}
			}
			d.mayFail = !byKill && (d.acked == 0 || lostAt-d.acked < int64(ackLag))
		}
		out = append(out, d)
	}
	slices.SortStableFunc(out, func(a, b *delivery) int { return cmp.Compare(a.Time, b.Time) })
	return out
}

// lostWorkers lists the times of the workers' ends that may have failed
// tasks the history never saw delivered (a TASK on its way when the
// connection ended): connections lost, not to a kill.
func (s Snapshot) lostWorkers() []TaskRecord {
	kills := s.kills()
	var out []TaskRecord
	for _, t := range s.Tasks {
		if t.Event != TaskWorkerEnded || t.Detail != WorkerLostConnection {
			continue
		}
		byKill := false
		for _, k := range kills[t.Node] {
			if t.Time >= k-int64(killWindow) && t.Time <= k+int64(killNotice) {
				byKill = true
			}
		}
		if !byKill {
			out = append(out, t)
		}
	}
	return out
}

// CheckKeyedTasks checks what a queue promises of keyed tasks, per key:
//
//   - order: of two confirmed tasks of a key, the one confirmed before
//     the other was submitted is delivered first, and never again once
//     the other was delivered;
//   - one at a time: two deliveries of one key are never in flight at
//     once. A delivery is in flight from when its worker got it until
//     its worker sent the ack, its worker ended, or its worker's node
//     was killed, whichever comes first. An overlap no longer than a
//     stall of the test process at that time (which records both) is a
//     note.
func CheckKeyedTasks(s Snapshot) Result {
	r := Result{Checker: "keyed"}
	ds := s.deliveries()
	byKey := map[string][]*delivery{}
	var keys []string
	for _, d := range ds {
		if d.Key == "" {
			continue
		}
		if _, ok := byKey[d.Key]; !ok {
			keys = append(keys, d.Key)
		}
		byKey[d.Key] = append(byKey[d.Key], d)
	}
	slices.Sort(keys)
	pairs := checkKeyOrder(s, byKey, &r)
	overlaps := 0
	for _, k := range keys {
		overlaps += checkOneInFlight(s, k, byKey[k], &r)
	}
	if overlaps > 0 {
		r.note("%d overlaps of one key's deliveries no longer than a stall of the test process", overlaps)
	}
	n := 0
	for _, k := range keys {
		n += len(byKey[k])
	}
	r.Checked = fmt.Sprintf("%d deliveries of %d keys, %d ordered pairs: per key, in confirm order and one at a time", n, len(keys), pairs)
	return r
}

// checkKeyOrder checks, per key, that tasks confirmed one after the
// other are delivered in that order; it returns the number of ordered
// pairs looked at.
func checkKeyOrder(s Snapshot, byKey map[string][]*delivery, r *Result) int {
	type conf struct {
		id         string
		call, time int64
	}
	confirmed := map[string][]conf{}
	var keys []string
	for _, t := range s.Tasks {
		if t.Event == TaskConfirmed && t.Key != "" {
			if _, ok := confirmed[t.Key]; !ok {
				keys = append(keys, t.Key)
			}
			confirmed[t.Key] = append(confirmed[t.Key], conf{t.ID, t.Call, t.Time})
		}
	}
	slices.Sort(keys)
	pairs := 0
	for _, key := range keys {
		cs := confirmed[key]
		first, last := map[string]int64{}, map[string]int64{}
		for _, d := range byKey[key] {
			if _, ok := first[d.ID]; !ok {
				first[d.ID] = d.Time
			}
			last[d.ID] = d.Time
		}
		slices.SortFunc(cs, func(a, b conf) int { return cmp.Compare(a.time, b.time) })
		// Over the tasks confirmed so far (in confirm order): the one
		// first delivered last, the one delivered last, the first never
		// delivered.
		type upTo struct{ firstID, lastID, missing string }
		pre := make([]upTo, len(cs))
		var cur upTo
		for i, c := range cs {
			f, ok := first[c.id]
			switch {
			case !ok:
				if cur.missing == "" {
					cur.missing = c.id
				}
			default:
				if cur.firstID == "" || f > first[cur.firstID] {
					cur.firstID = c.id
				}
				if cur.lastID == "" || last[c.id] > last[cur.lastID] {
					cur.lastID = c.id
				}
			}
			pre[i] = cur
		}
		reported := map[string]bool{}
		for _, b := range cs {
			// The tasks confirmed before b was submitted.
			n, _ := slices.BinarySearchFunc(cs, b.call, func(c conf, t int64) int { return cmp.Compare(c.time, t) })
			if n == 0 {
				continue
			}
			pairs += n
			fb, ok := first[b.id]
			if !ok {
				continue // b lost: the tasks checker says so
			}
			p := pre[n-1]
			switch {
			case p.missing != "" && !reported[p.missing]:
				reported[p.missing] = true
				r.violate("key %s: %s delivered at %s, but %s, confirmed before %s was submitted, never", key, b.id, ms(fb), p.missing, b.id)
			case p.firstID != "" && first[p.firstID] > fb:
				r.violate("key %s: %s delivered at %s before %s at %s, confirmed before %s was submitted", key, b.id, ms(fb), p.firstID, ms(first[p.firstID]), b.id)
			case p.lastID != "" && last[p.lastID] > fb:
				r.violate("key %s: %s delivered again at %s after %s was delivered at %s", key, p.lastID, ms(last[p.lastID]), b.id, ms(fb))
			}
		}
	}
	return pairs
}

// checkOneInFlight checks that no two deliveries of key (in order of
// delivery) are in flight at once; it returns the overlaps excused by
// stalls of the test process.
func checkOneInFlight(s Snapshot, key string, ds []*delivery, r *Result) int {
	excused := 0
	var held *delivery // the delivery in flight that ends last
	for _, d := range ds {
		if held != nil && d.Time < held.end {
			if over := held.end - d.Time; s.stallIn(d.Time, held.end) >= over {
				excused++
			} else {
				r.violate("key %s: %s delivered to %s at %s while %s was in flight on %s (delivered at %s, in flight until %s)",
					key, d.ID, d.Worker, ms(d.Time), held.ID, held.Worker, ms(held.Time), ms(held.end))
			}
		}
		if held == nil || d.end > held.end {
			held = d
		}
	}
	return excused
}

// CheckAttempts checks that a task comes back without a failed attempt
// when it was in flight on a worker whose node died, or on a leader that
// lost its leadership: a delivery's Attempts may exceed those of the
// task's previous delivery only by the failures of workers seen since
// (a worker whose connection ended, not to a kill of its node, fails
// what it held; one may have held a delivery the history never saw,
// its TASK lost with the connection).
func CheckAttempts(s Snapshot) Result {
	r := Result{Checker: "attempts"}
	ds := s.deliveries()
	lost := s.lostWorkers()
	byTask := map[string][]*delivery{}
	var ids []string
	for _, d := range ds {
		if _, ok := byTask[d.ID]; !ok {
			ids = append(ids, d.ID)
		}
		byTask[d.ID] = append(byTask[d.ID], d)
	}
	redelivered, returned := 0, 0
	for _, id := range ids {
		// budget is the most failed attempts the deliveries seen so far
		// can explain: the attempts one came with, and one more for
		// each that may have failed since.
		budget := 0
		for k, d := range byTask[id] {
			// Workers lost shortly before this delivery that never
			// showed it: each may have had it on the way and failed it
			// once. Not only tasks submitted before the client lost the
			// connection: a node that was stopped sees the loss (and
			// fails what it took for the worker meanwhile) only when it
			// runs again.
			unseen := 0
			for _, w := range lost {
				showed := slices.ContainsFunc(byTask[id][:k], func(p *delivery) bool { return p.Worker == w.Worker })
				if !showed && w.Time < d.Time && d.Time-w.Time < int64(unseenLag) {
					unseen++
				}
			}
			if k > 0 {
				redelivered++
			}
			if d.Attempts > budget+unseen {
				var why []string
				if k > 0 {
					p := byTask[id][k-1]
					why = append(why, fmt.Sprintf("after a delivery to %s at %s with %d", p.Worker, ms(p.Time), p.Attempts))
					if p.killed {
						why = append(why, "whose node was killed")
					}
					if p.ended == WorkerDetached {
						why = append(why, "which the broker detached")
					}
				}
				r.violate("task %s delivered to %s at %s with %d failed attempts %s (worker failures seen: %d)",
					id, d.Worker, ms(d.Time), d.Attempts, strings.Join(why, ", "), budget+unseen)
			} else if k > 0 && d.Attempts == byTask[id][k-1].Attempts {
				returned++
			}
			budget = max(budget, d.Attempts)
			if d.mayFail {
				budget++
			}
		}
	}
	r.Checked = fmt.Sprintf("%d tasks delivered, %d redeliveries (%d without a new attempt): attempts grow only by workers' own failures", len(ids), redelivered, returned)
	return r
}

// CheckMinority checks that the minority side of a partition accepts
// nothing it cannot confirm: no submit made through a node while that
// node was cut off from a majority ([NemesisRecord.Minority]) is
// confirmed before the cut began to heal.
func CheckMinority(s Snapshot) Result {
	r := Result{Checker: "minority"}
	windows, tried := 0, 0
	for _, n := range s.Nemeses {
		if len(n.Minority) == 0 {
			continue
		}
		windows++
		healing := n.End
		if n.Healing > 0 {
			healing = n.Healing
		}
		for _, t := range s.Tasks {
			if !t.submitted() || !slices.Contains(n.Minority, t.Node) || t.Call <= n.Start || t.Call >= healing {
				continue
			}
			tried++
			if t.Event == TaskConfirmed && t.Time < healing {
				r.violate("task %s submitted through %s at %s, cut off from the majority (%s from %s to %s), confirmed at %s",
					t.ID, t.Node, ms(t.Call), n.Detail, ms(n.Start), ms(healing), ms(t.Time))
			}
		}
	}
	r.Checked = fmt.Sprintf("%d partitions, %d submits through their minority: none confirmed while cut off", windows, tried)
	return r
}
