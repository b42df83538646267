package clustertest

import (
	"cmp"
	"encoding/json"
	"slices"
	"sync"
	"time"
)

// Forever is the return time of an operation whose outcome is unknown (a
// timeout, a lost connection): it may take effect at any time after its
// call, or never, which a linearizability checker models by letting it
// return after everything else.
const Forever = int64(1<<63 - 1)

// History records what clients did and saw and what nemeses did, in
// nanoseconds of the test process's monotonic clock since the history
// began. It is safe for concurrent use; records are appended in the
// order they are recorded, and checkers sort what they need.
type History struct {
	start time.Time

	mu       sync.Mutex // guards the slices below
	nemeses  []NemesisRecord
	registry []RegistryOp
	leaders  []LeaderInterval
	pubs     []Publish
	delivers []Delivery
	subs     []Subscription
	requests []Request
	tasks    []TaskRecord
	notes    []Note
	stalls   [][2]int64
}

// NewHistory starts a history now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the time since the history began, in nanoseconds of the
// monotonic clock.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Started is the wall-clock time the history began, for reports.
func (h *History) Started() time.Time { return h.start }

// NemesisRecord is one fault: what, against which nodes, from when to
// when. End is 0 while the fault lasts (and for instant faults such as a
// kill, which set End = Start).
type NemesisRecord struct {
	Name   string   `json:"name"`
	Nodes  []string `json:"nodes,omitempty"`
	Detail string   `json:"detail,omitempty"`
	Start  int64    `json:"start_ns"`
	End    int64    `json:"end_ns"`
	// Healing is when its healing began (End is when it was done): a
	// cut may let traffic through from then on. 0 if not recorded.
	Healing int64 `json:"healing_ns,omitempty"`
	// Minority lists the nodes the fault cut off from a majority of the
	// cluster (an isolated node, a split's minority), which must not
	// confirm anything until healing (see [CheckMinority]).
	Minority []string `json:"minority,omitempty"`
}

// Note is a free line in the history, for what a scenario wants in the
// report (a node restarted, a phase began).
type Note struct {
	Time int64  `json:"t_ns"`
	Text string `json:"text"`
}

// BeginNemesis records the start of a fault and returns its index for
// [History.EndNemesis].
func (h *History) BeginNemesis(name, detail string, nodes ...string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nemeses = append(h.nemeses, NemesisRecord{Name: name, Nodes: nodes, Detail: detail, Start: h.Now()})
	return len(h.nemeses) - 1
}

// EndNemesis records the end of the fault i.
func (h *History) EndNemesis(i int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i >= 0 && i < len(h.nemeses) && h.nemeses[i].End == 0 {
		h.nemeses[i].End = h.Now()
	}
}

// HealingNemesis records that the healing of fault i begins now.
func (h *History) HealingNemesis(i int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i >= 0 && i < len(h.nemeses) && h.nemeses[i].Healing == 0 {
		h.nemeses[i].Healing = h.Now()
	}
}

// SetMinority records the nodes fault i cut off from a majority.
func (h *History) SetMinority(i int, nodes ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i >= 0 && i < len(h.nemeses) {
		h.nemeses[i].Minority = append([]string(nil), nodes...)
	}
}

// Notef records a note.
func (h *History) Notef(text string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notes = append(h.notes, Note{Time: h.Now(), Text: text})
}

// AddRegistry records a registry operation.
func (h *History) AddRegistry(op RegistryOp) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.registry = append(h.registry, op)
}

// AddLeader records one leader interval as a client saw it.
func (h *History) AddLeader(l LeaderInterval) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leaders = append(h.leaders, l)
}

// AddPublish records a publication.
func (h *History) AddPublish(p Publish) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pubs = append(h.pubs, p)
}

// AddDelivery records a delivery to a subscriber.
func (h *History) AddDelivery(d Delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.delivers = append(h.delivers, d)
}

// AddSubscription records a subscriber's active interval.
func (h *History) AddSubscription(s Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs = append(h.subs, s)
}

// AddRequest records a request with every outcome its requester saw.
func (h *History) AddRequest(r Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.requests = append(h.requests, r)
}

// AddTask records a task event (confirmed or delivered).
func (h *History) AddTask(t TaskRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tasks = append(h.tasks, t)
}

// AddStall records that the test process itself was not scheduled from
// start to end (see [History.WatchStalls]).
func (h *History) AddStall(start, end int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stalls = append(h.stalls, [2]int64{start, end})
}

// WatchStalls records, until stop is closed, every time the test
// process's own goroutines were held up longer than min: a ticker every
// 10 ms that woke late. On a loaded machine the clients' view of time
// lags behind the broker's, and a checker can tell a late outcome that
// the test process caused from one the broker did.
func (h *History) WatchStalls(min time.Duration, stop <-chan struct{}) {
	const period = 10 * time.Millisecond
	t := time.NewTicker(period)
	defer t.Stop()
	last := h.Now()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := h.Now()
		if late := now - last - int64(period); late > int64(min) {
			h.AddStall(last+int64(period), now)
		}
		last = now
	}
}

// Snapshot is a copy of a history, the input of the checkers, and what
// the JSON report carries.
type Snapshot struct {
	Duration      int64            `json:"duration_ns"`
	Nemeses       []NemesisRecord  `json:"nemeses"`
	Notes         []Note           `json:"notes,omitempty"`
	Registry      []RegistryOp     `json:"registry,omitempty"`
	Leaders       []LeaderInterval `json:"leaders,omitempty"`
	Publishes     []Publish        `json:"publishes,omitempty"`
	Deliveries    []Delivery       `json:"deliveries,omitempty"`
	Subscriptions []Subscription   `json:"subscriptions,omitempty"`
	Requests      []Request        `json:"requests,omitempty"`
	Tasks         []TaskRecord     `json:"tasks,omitempty"`
	// Stalls are times the test process was held up (start, end).
	Stalls [][2]int64 `json:"stalls,omitempty"`
}

// Snapshot copies the history as it is now. Faults still under way end
// at the snapshot's time.
func (h *History) Snapshot() Snapshot {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.Now()
	s := Snapshot{
		Duration:      now,
		Nemeses:       append([]NemesisRecord(nil), h.nemeses...),
		Notes:         append([]Note(nil), h.notes...),
		Registry:      append([]RegistryOp(nil), h.registry...),
		Leaders:       append([]LeaderInterval(nil), h.leaders...),
		Publishes:     append([]Publish(nil), h.pubs...),
		Deliveries:    append([]Delivery(nil), h.delivers...),
		Subscriptions: append([]Subscription(nil), h.subs...),
		Requests:      append([]Request(nil), h.requests...),
		Tasks:         append([]TaskRecord(nil), h.tasks...),
		Stalls:        append([][2]int64(nil), h.stalls...),
	}
	for i := range s.Nemeses {
		if s.Nemeses[i].End == 0 {
			s.Nemeses[i].End = now
		}
	}
	return s
}

// MarshalJSON writes the history as its snapshot.
func (h *History) MarshalJSON() ([]byte, error) { return json.Marshal(h.Snapshot()) }

// FaultWindows are the intervals during which a fault was under way,
// each widened by grace after its end (the time a cluster is allowed to
// take to heal), merged where they overlap, in order.
func (s Snapshot) FaultWindows(grace time.Duration) [][2]int64 {
	var w [][2]int64
	for _, n := range s.Nemeses {
		w = append(w, [2]int64{n.Start, n.End + int64(grace)})
	}
	return mergeWindows(w)
}

// stallIn returns the longest stall of the test process that overlaps
// [from, to], in nanoseconds; 0 if none.
func (s Snapshot) stallIn(from, to int64) int64 {
	var longest int64
	for _, x := range s.Stalls {
		if x[0] <= to && x[1] >= from {
			longest = max(longest, x[1]-x[0])
		}
	}
	return longest
}

// mergeWindows sorts and merges overlapping intervals.
func mergeWindows(w [][2]int64) [][2]int64 {
	slices.SortFunc(w, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var out [][2]int64
	for _, x := range w {
		if n := len(out); n > 0 && x[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], x[1])
			continue
		}
		out = append(out, x)
	}
	return out
}

// inWindows reports whether t falls inside one of the merged windows.
func inWindows(w [][2]int64, t int64) bool {
	for _, x := range w {
		if t >= x[0] && t <= x[1] {
			return true
		}
	}
	return false
}
