package clustertest

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Publish is one publication: publisher, its sequence number (1, 2, ...
// per publisher), the topic, and the time Publish returned (or, for a
// publication whose outcome is unknown, the time it was called).
type Publish struct {
	Publisher string `json:"publisher"`
	Seq       uint64 `json:"seq"`
	Topic     string `json:"topic,omitempty"`
	// Start is when the publish was called, Time when it returned. A
	// subscription expects the publications that started after its
	// Subscribe returned: one under way meanwhile may miss it.
	Start int64 `json:"start_ns,omitempty"`
	Time  int64 `json:"t_ns"`
	// Failed is set when Publish returned an error: the message may or
	// may not have gone out, so its loss is no violation.
	Failed bool `json:"failed,omitempty"`
}

// started is when p was called (its return for a history without it).
func (p Publish) started() int64 {
	if p.Start > 0 {
		return p.Start
	}
	return p.Time
}

// Delivery is one message a subscriber received.
type Delivery struct {
	Subscriber string `json:"subscriber"`
	Publisher  string `json:"publisher"`
	Seq        uint64 `json:"seq"`
	Time       int64  `json:"t_ns"`
}

// Subscription is the time during which a subscriber was subscribed to
// every topic its publishers use: From when Subscribe returned, To when
// it stopped (0: at the end of the history). Messages published inside
// it are expected, outside fault windows.
type Subscription struct {
	Subscriber string `json:"subscriber"`
	From       int64  `json:"from_ns"`
	To         int64  `json:"to_ns"`
	// Publishers are the publishers whose messages it expects; none:
	// every publisher.
	Publishers []string `json:"publishers,omitempty"`
}

// PubSubOptions tune [CheckPubSub].
type PubSubOptions struct {
	// Grace widens each fault window after the fault ends: the time the
	// cluster may take to heal. Default: 5s.
	Grace time.Duration
	// Settle is how long before a subscription ends a publication must
	// have been published to be expected (the delivery's own time in
	// flight). Default: 1s.
	Settle time.Duration
}

// CheckPubSub checks, per subscriber and publisher, that sequence numbers
// arrive in increasing order without duplicates, that nothing arrives
// that was not published, and that every successful publication made
// while the subscriber was subscribed arrived, unless it was published
// inside a fault window (losses there are counted as notes: pub-sub is
// at most once). A fault window runs from Settle before the fault to
// Grace after it.
func CheckPubSub(s Snapshot, o PubSubOptions) Result {
	if o.Grace <= 0 {
		o.Grace = 5 * time.Second
	}
	if o.Settle <= 0 {
		o.Settle = time.Second
	}
	r := Result{Checker: "pubsub"}
	// A publication confirmed just before a fault may still be on a
	// link when the fault takes it: the window begins Settle earlier.
	windows := s.FaultWindows(o.Grace)
	for i := range windows {
		windows[i][0] -= int64(o.Settle)
	}
	published := map[string]map[uint64]Publish{}
	for _, p := range s.Publishes {
		if published[p.Publisher] == nil {
			published[p.Publisher] = map[uint64]Publish{}
		}
		published[p.Publisher][p.Seq] = p
	}
	ds := append([]Delivery(nil), s.Deliveries...)
	slices.SortStableFunc(ds, func(a, b Delivery) int { return cmp.Compare(a.Time, b.Time) })
	got := map[[2]string]map[uint64]bool{}
	last := map[[2]string]uint64{}
	for _, d := range ds {
		k := [2]string{d.Subscriber, d.Publisher}
		if got[k] == nil {
			got[k] = map[uint64]bool{}
		}
		if _, ok := published[d.Publisher][d.Seq]; !ok {
			r.violate("%s received %s#%d, never published", d.Subscriber, d.Publisher, d.Seq)
		}
		switch {
		case got[k][d.Seq]:
			r.violate("%s received %s#%d twice (again at %s)", d.Subscriber, d.Publisher, d.Seq, ms(d.Time))
		case d.Seq < last[k]:
			r.violate("%s received %s#%d after #%d: out of order", d.Subscriber, d.Publisher, d.Seq, last[k])
		}
		got[k][d.Seq] = true
		last[k] = max(last[k], d.Seq)
	}
	expected, lostInFaults := 0, 0
	for _, sub := range s.Subscriptions {
		to := sub.To
		if to == 0 {
			to = s.Duration
		}
		for _, p := range s.Publishes {
			if p.Failed || p.started() < sub.From || p.Time > to-int64(o.Settle) {
				continue
			}
			if len(sub.Publishers) > 0 && !slices.Contains(sub.Publishers, p.Publisher) {
				continue
			}
			expected++
			if got[[2]string{sub.Subscriber, p.Publisher}][p.Seq] {
				continue
			}
			if inWindows(windows, p.Time) {
				lostInFaults++
				continue
			}
			r.violate("%s lost %s#%d, published at %s outside any fault window", sub.Subscriber, p.Publisher, p.Seq, ms(p.Time))
		}
	}
	if lostInFaults > 0 {
		r.note("%d expected deliveries lost inside fault windows (pub-sub is at most once)", lostInFaults)
	}
	r.Checked = fmt.Sprintf("%d publications by %d publishers, %d deliveries to %d subscriptions (%d expected): order per publisher, no duplicates, losses only in fault windows (+%v)",
		len(s.Publishes), len(published), len(s.Deliveries), len(s.Subscriptions), expected, o.Grace)
	return r
}
