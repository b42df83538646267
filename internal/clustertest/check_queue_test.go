package clustertest

import (
	"strings"
	"testing"
)

// The task histories below are in milliseconds (ms is 1e6 ns), so that
// the windows the checkers allow (250 ms around a kill, 10 s of ack lag)
// have room.
const msNS = int64(1e6)

// submit is a submit's outcome, called at call ms and returned at ret.
func qSubmit(id, key, node string, ev TaskEvent, call, ret int64) TaskRecord {
	return TaskRecord{ID: id, Event: ev, Key: key, Node: node, Call: call * msNS, Time: ret * msNS}
}

// deliver is delivery number d of task id to worker on node at t ms.
func qDeliver(d int64, id, key, node, worker string, attempts int, t int64) TaskRecord {
	return TaskRecord{ID: id, Event: TaskDelivered, Key: key, Node: node, Worker: worker, Delivery: d, Attempts: attempts, Time: t * msNS}
}

// ack is the ack of delivery d at t ms.
func qAck(d int64, id, worker string, t int64) TaskRecord {
	return TaskRecord{ID: id, Event: TaskAcked, Worker: worker, Delivery: d, Time: t * msNS}
}

// ended is the end of worker on node at t ms.
func qEnded(worker, node, why string, t int64) TaskRecord {
	return TaskRecord{Event: TaskWorkerEnded, Worker: worker, Node: node, Detail: why, Time: t * msNS}
}

// kill is a kill of node at t ms, restarted at end ms.
func qKill(node string, t, end int64) NemesisRecord {
	return NemesisRecord{Name: "kill-queue-leader", Nodes: []string{node}, Start: t * msNS, End: end * msNS}
}

// goodQueue is a history a replicated queue may give: keyed tasks in
// order across a kill of the leader's node (n1), a task in flight on a
// worker of n1 back without an attempt, a task failed by a worker that
// lost its connection back with one, an unknown submit delivered.
func goodQueue() Snapshot {
	return Snapshot{Duration: 60000 * msNS, Nemeses: []NemesisRecord{qKill("n1", 1000, 6000)}, Tasks: []TaskRecord{
		qSubmit("a", "k", "n1", TaskConfirmed, 0, 10),
		qSubmit("b", "k", "n2", TaskConfirmed, 20, 30),
		qSubmit("c", "k", "n3", TaskConfirmed, 40, 50),
		qSubmit("u", "", "n2", TaskConfirmed, 60, 70),
		qSubmit("x", "k", "n2", TaskUnknown, 80, 2080), // maybe there
		qSubmit("y", "", "n3", TaskFailed, 90, 95),
		qDeliver(1, "a", "k", "n1", "w1#1", 0, 100),
		qAck(1, "a", "w1#1", 120),
		qDeliver(2, "b", "k", "n2", "w2#1", 0, 130),
		qAck(2, "b", "w2#1", 140),
		qDeliver(3, "c", "k", "n1", "w1#1", 0, 900), // in flight at the kill
		qDeliver(4, "u", "", "n3", "w3#1", 0, 910),  // its worker will lose its connection
		qEnded("w1#1", "n1", WorkerLostConnection, 1001),
		qEnded("w3#1", "n3", WorkerLostConnection, 1500),
		qDeliver(5, "c", "k", "n2", "w2#1", 0, 3000), // back without an attempt
		qAck(5, "c", "w2#1", 3010),
		qDeliver(6, "x", "k", "n2", "w2#1", 0, 3020), // the unknown one, after c
		qAck(6, "x", "w2#1", 3030),
		qDeliver(7, "u", "", "n2", "w2#1", 1, 3040), // failed once: w3 lost its connection
		qAck(7, "u", "w2#1", 3050),
	}}
}

func TestQueueCheckersPassAGoodHistory(t *testing.T) {
	s := goodQueue()
	for _, r := range []Result{CheckTasks(s), CheckKeyedTasks(s), CheckAttempts(s), CheckMinority(s)} {
		wantOK(t, r)
	}
	if r := CheckKeyedTasks(s); !strings.Contains(r.Checked, "3 ordered pairs") {
		t.Fatalf("keyed: %s", r.Checked)
	}
	if r := CheckAttempts(s); !strings.Contains(r.Checked, "2 redeliveries (1 without a new attempt)") {
		t.Fatalf("attempts: %s", r.Checked)
	}
	if r := CheckTasks(s); !strings.Contains(strings.Join(r.Notes, ";"), "1 submits failed and 1 of unknown") {
		t.Fatalf("tasks notes: %v", r.Notes)
	}
}

// mutate returns goodQueue with its task record i replaced by rec (or
// appended, i < 0).
func mutate(i int, rec TaskRecord) Snapshot {
	s := goodQueue()
	if i < 0 {
		s.Tasks = append(s.Tasks, rec)
	} else {
		s.Tasks[i] = rec
	}
	return s
}

func TestCheckKeyedTasksOrder(t *testing.T) {
	// b delivered before a, though a was confirmed before b was
	// submitted.
	s := goodQueue()
	s.Tasks[6].Time, s.Tasks[8].Time = 130*msNS, 100*msNS
	s.Tasks[7].Time, s.Tasks[9].Time = 140*msNS, 120*msNS
	wantViolation(t, CheckKeyedTasks(s), "b delivered at 100.0ms before a")
	// a delivered again after b was.
	wantViolation(t, CheckKeyedTasks(mutate(-1, qDeliver(9, "a", "k", "n3", "w3#2", 0, 4000))), "a delivered again at 4000.0ms after b")
	// a never delivered while b was.
	s = goodQueue()
	s.Tasks = append(s.Tasks[:6], s.Tasks[8:]...)
	wantViolation(t, CheckKeyedTasks(s), "but a, confirmed before b was submitted, never")
	// Concurrent submits may be delivered in either order: b submitted
	// before a's confirm.
	s = goodQueue()
	s.Tasks[1].Call = 5 * msNS
	s.Tasks[6].Time, s.Tasks[8].Time = 130*msNS, 100*msNS
	s.Tasks[7].Time, s.Tasks[9].Time = 140*msNS, 120*msNS
	if r := CheckKeyedTasks(s); r.Count != 0 {
		t.Fatalf("concurrent submits: %v", r.Violations)
	}
	// Of two concurrent submits both confirmed before c was submitted,
	// the one confirmed first is delivered after c.
	s = goodQueue()
	s.Tasks[1].Call = 5 * msNS
	s.Tasks[6].Time, s.Tasks[7].Time = 1500*msNS, 1510*msNS // a, after c's first delivery at 900
	wantViolation(t, CheckKeyedTasks(s), "c delivered at 900.0ms before a at 1500.0ms")
}

func TestCheckKeyedTasksOneInFlight(t *testing.T) {
	// b delivered to w2 while w1 still held a (acked only at 200).
	s := goodQueue()
	s.Tasks[7].Time = 200 * msNS
	wantViolation(t, CheckKeyedTasks(s), "b delivered to w2#1 at 130.0ms while a was in flight on w1#1")
	// c delivered again on n2 at 3000 while still held on n1: but n1
	// was killed at 1000, which ends its delivery.
	wantOK(t, CheckKeyedTasks(goodQueue()))
	// Without the kill, w1#1 holds c until its connection ended at 1001;
	// c again before that is a violation.
	s = goodQueue()
	s.Tasks[14].Time = 950 * msNS
	s.Nemeses = nil
	wantViolation(t, CheckKeyedTasks(s), "c delivered to w2#1 at 950.0ms while c was in flight on w1#1")
	// The same overlap during a stall of the test process as long is a
	// note.
	s.Stalls = [][2]int64{{900 * msNS, 1100 * msNS}}
	r := CheckKeyedTasks(s)
	if r.Count != 0 || len(r.Notes) == 0 {
		t.Fatalf("stall: %d violations %v, notes %v", r.Count, r.Violations, r.Notes)
	}
}

func TestCheckAttempts(t *testing.T) {
	// c, in flight on n1 when n1 was killed, back with an attempt (and
	// no other worker lost its connection).
	s := goodQueue()
	s.Tasks[14].Attempts = 1
	s.Tasks[13].Detail, s.Tasks[18].Attempts = WorkerStopped, 0
	wantViolation(t, CheckAttempts(s), "task c delivered to w2#1 at 3000.0ms with 1 failed attempts after a delivery to w1#1 at 900.0ms with 0, whose node was killed")
	// The same when w1's connection was lost before n1 was killed (a
	// heartbeat, not the kill): the node may have failed it.
	s.Tasks[12].Time = 500 * msNS
	s.Tasks[10].Time = 400 * msNS
	wantOK(t, CheckAttempts(s))
	// A worker detached by a leader that stepped down fails nothing.
	s = goodQueue()
	s.Nemeses = nil
	s.Tasks[12].Detail = WorkerDetached
	s.Tasks[14].Attempts = 1
	s.Tasks[13].Detail, s.Tasks[18].Attempts = WorkerStopped, 0
	wantViolation(t, CheckAttempts(s), "which the broker detached")
	// Two attempts where one failure was seen.
	s = goodQueue()
	s.Tasks[18].Attempts = 2
	wantViolation(t, CheckAttempts(s), "task u delivered to w2#1 at 3040.0ms with 2 failed attempts")
	// A first delivery with an attempt, no worker lost: a violation; a
	// worker lost meanwhile may have had it unseen.
	s = goodQueue()
	s.Tasks[16].Attempts = 1
	wantOK(t, CheckAttempts(s)) // w3#1 lost its connection at 1500, after x's submit
	s.Tasks[13].Detail = WorkerStopped
	wantViolation(t, CheckAttempts(s), "task x delivered to w2#1 at 3020.0ms with 1 failed attempts")
}

func TestCheckMinority(t *testing.T) {
	cut := NemesisRecord{Name: "isolate-queue-leader", Nodes: []string{"n1"}, Minority: []string{"n1"},
		Start: 1000 * msNS, Healing: 5000 * msNS, End: 5100 * msNS, Detail: "isolated from every other node"}
	s := Snapshot{Duration: 10000 * msNS, Nemeses: []NemesisRecord{cut}, Tasks: []TaskRecord{
		qSubmit("a", "", "n1", TaskConfirmed, 900, 1100),  // called before the cut
		qSubmit("b", "", "n1", TaskUnknown, 1200, 3200),   // not confirmed: fine
		qSubmit("c", "", "n2", TaskConfirmed, 1300, 1400), // the majority side
		qSubmit("d", "", "n1", TaskConfirmed, 4900, 5050), // confirmed after healing began
	}}
	r := CheckMinority(s)
	wantOK(t, r)
	if !strings.Contains(r.Checked, "1 partitions, 2 submits") {
		t.Fatalf("checked: %s", r.Checked)
	}
	s.Tasks = append(s.Tasks, qSubmit("e", "k", "n1", TaskConfirmed, 2000, 2100))
	wantViolation(t, CheckMinority(s), "task e submitted through n1 at 2000.0ms, cut off from the majority")
	// Faults that cut no minority are not looked at.
	s.Nemeses[0].Minority = nil
	wantOK(t, CheckMinority(s))
}

func TestCheckTasksFirstConfirms(t *testing.T) {
	s := goodQueue()
	s.Tasks = append(s.Tasks, qSubmit("v", "", "n2", TaskUnknown, 1010, 3010), qSubmit("w", "", "n2", TaskConfirmed, 1020, 2500))
	r := CheckTasks(s)
	if !strings.Contains(strings.Join(r.Notes, ";"), "kill-queue-leader n1 1.5s") {
		t.Fatalf("notes: %v", r.Notes)
	}
}

func TestCheckAttemptsPausedEntryNode(t *testing.T) {
	// n3 stopped: its worker's client gave up on the connection at
	// 2000; the leader went on sending tasks to n3 for the worker (a
	// task submitted at 2500 too), and when n3 ran again at 4000 it
	// saw the worker gone and the leader failed them: they come back
	// with an attempt, never seen delivered before.
	s := Snapshot{Duration: 20000 * msNS, Tasks: []TaskRecord{
		qSubmit("a", "", "n1", TaskConfirmed, 2500, 2510),
		qEnded("w3#1", "n3", WorkerLostConnection, 2000),
		qDeliver(1, "a", "", "n2", "w2#1", 1, 4100),
	}}
	wantOK(t, CheckAttempts(s))
	// A kill of n3 seconds before the loss did not cause it.
	s.Nemeses = []NemesisRecord{qKill("n3", -4000, -3000)}
	s.Tasks[1].Time = 1000 * msNS
	wantOK(t, CheckAttempts(s))
	// One just before it did: a killed node fails nothing.
	s.Nemeses = []NemesisRecord{qKill("n3", 900, 1900)}
	wantViolation(t, CheckAttempts(s), "task a delivered to w2#1 at 4100.0ms with 1 failed attempts")
	s.Nemeses, s.Tasks[1].Time = nil, 2000*msNS
	// Too long after the loss: not that worker's doing.
	s.Tasks[2].Time = 13000 * msNS
	wantViolation(t, CheckAttempts(s), "task a delivered to w2#1 at 13000.0ms with 1 failed attempts")
}
