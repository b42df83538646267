package clustertest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// reg builds a registry operation for synthetic histories.
func reg(client int, kind RegistryKind, name string, out Outcome, call, ret int64) RegistryOp {
	return RegistryOp{Client: client, Kind: kind, Name: name, Outcome: out, Call: call, Return: ret}
}

func wantOK(t *testing.T, r Result) {
	t.Helper()
	if !r.OK() {
		t.Fatalf("%s: want no violation, got %d: %v (notes %v)", r.Checker, r.Count, r.Violations, r.Notes)
	}
	if r.Checked == "" {
		t.Fatalf("%s: says nothing of what it checked", r.Checker)
	}
}

func wantViolation(t *testing.T, r Result, substr string) {
	t.Helper()
	if r.Count == 0 {
		t.Fatalf("%s: want a violation with %q, got none (checked %s)", r.Checker, substr, r.Checked)
	}
	for _, v := range r.Violations {
		if strings.Contains(v, substr) {
			return
		}
	}
	t.Fatalf("%s: no violation mentions %q: %v", r.Checker, substr, r.Violations)
}

func TestCheckRegistryLinearizable(t *testing.T) {
	s := Snapshot{Duration: 100, Registry: []RegistryOp{
		reg(0, Declare, "a", OutcomeCreated, 0, 10),
		reg(1, Get, "a", OutcomeExists, 5, 15), // concurrent with the declare
		reg(2, Get, "a", OutcomeExists, 20, 25),
		reg(0, Delete, "a", OutcomeDeleted, 30, 40),
		reg(1, Get, "a", OutcomeNotFound, 41, 45),
		reg(2, Declare, "b", OutcomeOK, 0, 5),
		reg(2, Declare, "b", OutcomeOK, 6, 7), // idempotent
		reg(1, Get, "b", OutcomeExists, 8, 9),
		// Unknown outcome: may take effect late (the get at 60 sees it).
		reg(0, Declare, "c", OutcomeUnknown, 50, 55),
		reg(1, Get, "c", OutcomeNotFound, 56, 57),
		reg(2, Get, "c", OutcomeExists, 60, 61),
		// Failed operations had no effect.
		reg(0, Declare, "d", OutcomeFailed, 0, 1),
		reg(1, Get, "d", OutcomeNotFound, 2, 3),
	}}
	r := CheckRegistry(s, 10*time.Second)
	wantOK(t, r)
	if !strings.Contains(r.Checked, "4 exchanges") || !strings.Contains(r.Checked, "1 of unknown") {
		t.Fatalf("checked: %s", r.Checked)
	}
}

func TestCheckRegistryStaleRead(t *testing.T) {
	// A get after the declare returned, on another node, sees nothing:
	// the stale read a replica without read-your-writes gives.
	s := Snapshot{Duration: 100, Registry: []RegistryOp{
		reg(0, Declare, "a", OutcomeCreated, 0, 10),
		reg(1, Get, "a", OutcomeNotFound, 20, 30),
	}}
	wantViolation(t, CheckRegistry(s, 10*time.Second), `"a"`)
}

func TestCheckRegistryLostDelete(t *testing.T) {
	// Two deletes both report removing the exchange: only one can have.
	s := Snapshot{Duration: 100, Registry: []RegistryOp{
		reg(0, Declare, "x", OutcomeOK, 0, 1),
		reg(0, Delete, "x", OutcomeDeleted, 10, 20),
		reg(1, Delete, "x", OutcomeDeleted, 25, 30),
		reg(2, Declare, "y", OutcomeOK, 0, 1),
	}}
	r := CheckRegistry(s, 10*time.Second)
	wantViolation(t, r, `"x"`)
	if r.Count != 1 {
		t.Fatalf("want exactly the exchange x, got %v", r.Violations)
	}
}

func TestCheckRegistryDoubleCreate(t *testing.T) {
	// Two declares both say they created the exchange, one after the
	// other with no delete between: a split brain of the registry.
	s := Snapshot{Duration: 100, Registry: []RegistryOp{
		reg(0, Declare, "a", OutcomeCreated, 0, 10),
		reg(1, Declare, "a", OutcomeCreated, 20, 30),
	}}
	wantViolation(t, CheckRegistry(s, 10*time.Second), "not linearizable")
}

func TestCheckLeadersOK(t *testing.T) {
	s := Snapshot{Duration: 1000, Leaders: []LeaderInterval{
		{Exchange: "e", Member: "n1/c1.1", Node: "n1", Fenced: true, Token: Token{1, 1}, Start: 0, End: 100},
		{Exchange: "e", Member: "n2/c2.1", Node: "n2", Fenced: true, Token: Token{1, 2}, Start: 150, End: 400},
		{Exchange: "e", Member: "n2/c2.1", Node: "n2", Fenced: true, Token: Token{1, 2}, Start: 200, End: 300}, // same member, re-announced
		{Exchange: "e", Member: "n3/c3.1", Node: "n3", Fenced: true, Token: Token{2, 1}, Start: 500},           // still leading
		{Exchange: "f", Member: "n1/c1.2", Node: "n1", Fenced: true, Token: Token{1, 1}, Start: 0, End: 600},   // another exchange overlaps freely
	}}
	wantOK(t, CheckLeaders(s, LeaderOptions{}))
}

// sec is n seconds in the history's nanoseconds.
func sec(n float64) int64 { return int64(n * 1e9) }

func TestCheckLeadersFencedOverlap(t *testing.T) {
	// A leader paused during a fault goes on believing it leads after
	// its successor was appointed: the tokens tell them apart.
	s := Snapshot{Duration: sec(30), Nemeses: []NemesisRecord{{Name: "pause", Start: sec(5), End: sec(10)}},
		Leaders: []LeaderInterval{
			{Exchange: "e", Member: "a", Node: "n1", Fenced: true, Token: Token{1, 1}, Start: 0, End: sec(10)},
			{Exchange: "e", Member: "b", Node: "n2", Fenced: true, Token: Token{1, 2}, Start: sec(7), End: sec(20)},
		}}
	r := CheckLeaders(s, LeaderOptions{})
	wantOK(t, r)
	if len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "1 overlaps") {
		t.Errorf("notes %q, want the overlap counted", r.Notes)
	}
	// The same without a fault: longer than the slack, a violation.
	s.Nemeses = nil
	wantViolation(t, CheckLeaders(s, LeaderOptions{}), "outside any fault window")
	// Within the slack it is the time a view takes to arrive.
	s.Leaders[1].Start = sec(9.5)
	wantOK(t, CheckLeaders(s, LeaderOptions{}))
}

func TestCheckLeadersOverlap(t *testing.T) {
	// Without tokens an overlap is a violation, fault or not.
	s := Snapshot{Duration: 1000, Nemeses: []NemesisRecord{{Name: "pause", Start: 0, End: 1000}}, Leaders: []LeaderInterval{
		{Exchange: "e", Member: "a", Start: 0, End: 200},
		{Exchange: "e", Member: "b", Fenced: true, Token: Token{1, 2}, Start: 150, End: 400},
	}}
	wantViolation(t, CheckLeaders(s, LeaderOptions{}), "without fencing tokens")
}

func TestCheckLeadersOpenIntervalOverlaps(t *testing.T) {
	// A leader that never learnt it lost the lead overlaps its successor,
	// with no fault to explain it.
	s := Snapshot{Duration: sec(10), Leaders: []LeaderInterval{
		{Exchange: "e", Member: "a", Node: "n1", Fenced: true, Token: Token{1, 1}, Start: 0},
		{Exchange: "e", Member: "b", Node: "n2", Fenced: true, Token: Token{2, 1}, Start: sec(5), End: sec(8)},
	}}
	wantViolation(t, CheckLeaders(s, LeaderOptions{}), "overlap")
}

func TestCheckLeadersUnfenced(t *testing.T) {
	// Without tokens only overlaps count.
	s := Snapshot{Duration: 1000, Leaders: []LeaderInterval{
		{Exchange: "e", Member: "a", Start: 0, End: 100},
		{Exchange: "e", Member: "b", Start: 200, End: 300},
	}}
	wantOK(t, CheckLeaders(s, LeaderOptions{}))
	s.Leaders[1].Start = 50
	wantViolation(t, CheckLeaders(s, LeaderOptions{}), "overlap")
}

func TestCheckLeadersTokenBack(t *testing.T) {
	// On one node tokens only grow.
	s := Snapshot{Duration: 1000, Leaders: []LeaderInterval{
		{Exchange: "e", Member: "a", Node: "n1", Fenced: true, Token: Token{2, 1}, Start: 0, End: 100},
		{Exchange: "e", Member: "b", Node: "n1", Fenced: true, Token: Token{1, 9}, Start: 200, End: 300},
	}}
	wantViolation(t, CheckLeaders(s, LeaderOptions{}), "went back on node n1")
	// On different nodes the events of the old view may reach the
	// member of a node that lagged after those of another node.
	s.Leaders[1].Node = "n2"
	wantOK(t, CheckLeaders(s, LeaderOptions{}))
	// One member's own tokens only grow.
	s.Leaders[1].Member = "a"
	wantViolation(t, CheckLeaders(s, LeaderOptions{}), "went back on member a")
}

func TestCheckLeadersTokenReused(t *testing.T) {
	s := Snapshot{Duration: 1000, Leaders: []LeaderInterval{
		{Exchange: "e", Member: "a", Node: "n1", Fenced: true, Token: Token{1, 1}, Start: 0, End: 100},
		{Exchange: "e", Member: "b", Node: "n2", Fenced: true, Token: Token{1, 1}, Start: 200, End: 300},
	}}
	wantViolation(t, CheckLeaders(s, LeaderOptions{}), "given to a and to b")
}

// pubsubHistory: publisher p publishes 1..10 every 100 ms from 0; the
// subscriber s is subscribed throughout.
func pubsubHistory() Snapshot {
	s := Snapshot{Duration: int64(5 * time.Second)}
	for i := uint64(1); i <= 10; i++ {
		s.Publishes = append(s.Publishes, Publish{Publisher: "p", Seq: i, Time: int64(i) * int64(100*time.Millisecond)})
	}
	s.Subscriptions = []Subscription{{Subscriber: "s", From: 0}}
	return s
}

func deliver(s *Snapshot, seqs ...uint64) {
	for _, q := range seqs {
		s.Deliveries = append(s.Deliveries, Delivery{Subscriber: "s", Publisher: "p", Seq: q, Time: int64(q)*int64(100*time.Millisecond) + 1})
	}
}

func TestCheckPubSubOK(t *testing.T) {
	s := pubsubHistory()
	deliver(&s, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	wantOK(t, CheckPubSub(s, PubSubOptions{}))
}

func TestCheckPubSubDuplicate(t *testing.T) {
	s := pubsubHistory()
	deliver(&s, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10)
	wantViolation(t, CheckPubSub(s, PubSubOptions{}), "twice")
}

func TestCheckPubSubReorder(t *testing.T) {
	s := pubsubHistory()
	deliver(&s, 1, 2, 4, 5, 6, 7, 8, 9, 10)
	s.Deliveries = append(s.Deliveries, Delivery{Subscriber: "s", Publisher: "p", Seq: 3, Time: int64(2 * time.Second)})
	wantViolation(t, CheckPubSub(s, PubSubOptions{}), "out of order")
}

func TestCheckPubSubLossOutsideFaults(t *testing.T) {
	s := pubsubHistory()
	deliver(&s, 1, 2, 3, 5, 6, 7, 8, 9, 10)
	wantViolation(t, CheckPubSub(s, PubSubOptions{}), "lost p#4")
}

func TestCheckPubSubLossInsideFault(t *testing.T) {
	s := pubsubHistory()
	deliver(&s, 1, 2, 3, 6, 7, 8, 9, 10)
	// A partition from 350 ms to 380 ms; with 100 ms of grace it covers
	// #4 (400 ms) but not #5 (500 ms).
	s.Nemeses = []NemesisRecord{{Name: "partition", Start: int64(350 * time.Millisecond), End: int64(380 * time.Millisecond)}}
	r := CheckPubSub(s, PubSubOptions{Grace: 100 * time.Millisecond})
	wantViolation(t, r, "lost p#5")
	if r.Count != 1 || len(r.Notes) != 1 {
		t.Fatalf("want #5 alone as a violation and #4 as a note: %v %v", r.Violations, r.Notes)
	}
	// A failed publish may be lost anywhere.
	s.Publishes[4].Failed = true
	wantOK(t, CheckPubSub(s, PubSubOptions{Grace: 100 * time.Millisecond}))
}

func TestCheckPubSubExpectsOnlyItsPublishers(t *testing.T) {
	s := pubsubHistory()
	deliver(&s, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	s.Publishes = append(s.Publishes, Publish{Publisher: "q", Seq: 1, Time: 100})
	wantViolation(t, CheckPubSub(s, PubSubOptions{}), "lost q#1")
	s.Subscriptions[0].Publishers = []string{"p"}
	wantOK(t, CheckPubSub(s, PubSubOptions{}))
}

func TestCheckPubSubPhantom(t *testing.T) {
	s := pubsubHistory()
	deliver(&s, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
	wantViolation(t, CheckPubSub(s, PubSubOptions{}), "never published")
}

func TestCheckPubSubSettle(t *testing.T) {
	// A publication in the last second of a subscription is not expected.
	s := pubsubHistory()
	s.Subscriptions[0].To = int64(1450 * time.Millisecond)
	deliver(&s, 1, 2, 3, 4)
	wantOK(t, CheckPubSub(s, PubSubOptions{}))
	s.Subscriptions[0].To = int64(1600 * time.Millisecond)
	wantViolation(t, CheckPubSub(s, PubSubOptions{}), "lost p#5")
}

func TestCheckRequests(t *testing.T) {
	ms := int64(time.Millisecond)
	ok := Snapshot{Duration: 10000 * ms, Requests: []Request{
		{ID: "1", Start: 0, Deadline: 1000 * ms, Outcomes: []RequestOutcome{{Kind: "response", Time: 10 * ms}}},
		{ID: "2", Start: 0, Deadline: 1000 * ms, Outcomes: []RequestOutcome{{Kind: "deadline", Time: 1050 * ms}}},
		{ID: "3", Start: 0, Deadline: 1000 * ms, Outcomes: []RequestOutcome{{Kind: "error", Detail: "handler gone", Time: 300 * ms}}},
	}}
	r := CheckRequests(ok, 0)
	wantOK(t, r)
	if !strings.Contains(r.Checked, "1 responses, 1 errors, 1 deadlines") {
		t.Fatalf("checked: %s", r.Checked)
	}

	late := ok
	late.Requests = append([]Request(nil), ok.Requests...)
	late.Requests[1].Outcomes = []RequestOutcome{{Kind: "deadline", Time: 1101 * ms}}
	wantViolation(t, CheckRequests(late, 0), "past the 100ms margin")
	// A stall of the test process that covers the lateness excuses it;
	// a shorter one does not.
	late.Requests[1].Outcomes = []RequestOutcome{{Kind: "deadline", Time: 1300 * ms}}
	late.Stalls = [][2]int64{{1050 * ms, 1099 * ms}}
	wantViolation(t, CheckRequests(late, 0), "past the 100ms margin")
	late.Stalls = [][2]int64{{1000 * ms, 1290 * ms}}
	lr := CheckRequests(late, 0)
	wantOK(t, lr)
	if len(lr.Notes) != 2 || !strings.Contains(lr.Notes[0], "while the test process stalled 290.0ms") {
		t.Fatalf("want notes on the late outcome and the stall: %v", lr.Notes)
	}

	two := ok
	two.Requests = append([]Request(nil), ok.Requests...)
	two.Requests[0].Outcomes = []RequestOutcome{{Kind: "response", Time: 10 * ms}, {Kind: "error", Time: 20 * ms}}
	wantViolation(t, CheckRequests(two, 0), "2 outcomes")

	none := ok
	none.Requests = append([]Request(nil), ok.Requests...)
	none.Requests[2].Outcomes = nil
	wantViolation(t, CheckRequests(none, 0), "no outcome")
	// Still before its deadline when the history ended: pending, not lost.
	none.Duration = 500 * ms
	none.Requests = none.Requests[2:]
	r = CheckRequests(none, 0)
	wantOK(t, r)
	if len(r.Notes) != 1 {
		t.Fatalf("want a note on the pending request: %v", r.Notes)
	}
}

func TestCheckTasks(t *testing.T) {
	s := Snapshot{Tasks: []TaskRecord{
		{ID: "a", Event: TaskConfirmed, Time: 1},
		{ID: "b", Event: TaskConfirmed, Time: 2},
		{ID: "a", Event: TaskDelivered, Time: 3},
		{ID: "b", Event: TaskDelivered, Time: 4},
		{ID: "b", Event: TaskDelivered, Time: 5}, // duplicate: allowed
		{ID: "c", Event: TaskDelivered, Time: 6}, // confirm lost: allowed
	}}
	r := CheckTasks(s)
	wantOK(t, r)
	if len(r.Notes) != 2 {
		t.Fatalf("want notes on the duplicate and the unconfirmed task: %v", r.Notes)
	}
	s.Tasks = append(s.Tasks, TaskRecord{ID: "d", Event: TaskConfirmed, Time: 7})
	wantViolation(t, CheckTasks(s), "task d confirmed")
}

func TestFaultWindowsMerge(t *testing.T) {
	s := Snapshot{Nemeses: []NemesisRecord{
		{Start: 100, End: 200}, {Start: 0, End: 50}, {Start: 190, End: 300}, {Start: 1000, End: 1000},
	}}
	got := s.FaultWindows(10)
	want := [][2]int64{{0, 60}, {100, 310}, {1000, 1010}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestWatchStalls(t *testing.T) {
	h := NewHistory()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { h.WatchStalls(time.Hour, stop); close(done) }()
	time.Sleep(30 * time.Millisecond)
	close(stop)
	<-done
	if n := len(h.Snapshot().Stalls); n != 0 {
		t.Fatalf("%d stalls longer than an hour", n)
	}
}

func TestHistoryRecords(t *testing.T) {
	h := NewHistory()
	i := h.BeginNemesis("kill", "SIGKILL", "n2")
	h.Notef("restarted n2")
	s := h.Snapshot()
	if len(s.Nemeses) != 1 || s.Nemeses[0].End == 0 || s.Nemeses[0].End > s.Duration {
		t.Fatalf("an open fault ends at the snapshot: %+v (duration %d)", s.Nemeses, s.Duration)
	}
	h.EndNemesis(i)
	end := h.Snapshot().Nemeses[0].End
	h.EndNemesis(i) // a second end changes nothing
	if h.Snapshot().Nemeses[0].End != end || len(s.Notes) != 1 {
		t.Fatalf("end moved or note missing: %+v", h.Snapshot())
	}
}

func TestReport(t *testing.T) {
	h := NewHistory()
	h.EndNemesis(h.BeginNemesis("kill", "SIGKILL", "n2"))
	h.Notef("restarted")
	s := h.Snapshot()
	bad := Snapshot{Duration: 100, Leaders: []LeaderInterval{
		{Exchange: "e", Member: "a", Start: 0, End: 50}, {Exchange: "e", Member: "b", Fenced: true, Token: Token{0, 1}, Start: 10, End: 60},
	}}
	r := NewReport("smoke", 42, ModeProxy, 3, h, CheckTasks(s), CheckLeaders(bad, LeaderOptions{}))
	if r.OK() || r.Violations() != 1 {
		t.Fatalf("ok %v, violations %d", r.OK(), r.Violations())
	}
	var text, js strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"scenario smoke", "seed 42", "FAIL, 1 violations", "nemeses (1: kill 1)", "n2", "restarted", "leaders", "1 VIOLATIONS", "overlap"} {
		if !strings.Contains(text.String(), want) {
			t.Fatalf("text report lacks %q:\n%s", want, text.String())
		}
	}
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal([]byte(js.String()), &back); err != nil || back.Seed != 42 || len(back.Results) != 2 || back.Results[1].Count != 1 {
		t.Fatalf("JSON report: %v %+v", err, back)
	}
}

func TestCheckPubSubConcurrentWithSubscribe(t *testing.T) {
	// A publish that started before the subscription began and returned
	// after it may miss the subscriber; one that started after may not.
	s := pubsubHistory()
	s.Subscriptions[0].From = int64(250 * time.Millisecond)
	s.Publishes[2].Start = int64(240 * time.Millisecond) // #3 returns at 300 ms
	deliver(&s, 4, 5, 6, 7, 8, 9, 10)
	wantOK(t, CheckPubSub(s, PubSubOptions{}))
	s.Publishes[2].Start = int64(260 * time.Millisecond)
	wantViolation(t, CheckPubSub(s, PubSubOptions{}), "lost p#3")
}
