package clustertest

import (
	"fmt"
	"time"
)

// RequestOutcome is one end of a request its requester saw: a response
// (the last chunk of a chunked one), an error, or the deadline.
type RequestOutcome struct {
	Kind   string `json:"kind"` // "response", "error", "deadline"
	Detail string `json:"detail,omitempty"`
	Time   int64  `json:"t_ns"`
}

// Request is one request and every outcome its requester saw. Deadline
// is absolute, in history time.
type Request struct {
	ID       string           `json:"id"`
	Client   string           `json:"client,omitempty"`
	Node     string           `json:"node,omitempty"`
	Start    int64            `json:"start_ns"`
	Deadline int64            `json:"deadline_ns"`
	Outcomes []RequestOutcome `json:"outcomes"`
}

// DefaultMargin is how late after its deadline a request's outcome may
// come: the promise is one outcome by deadline + 100 ms.
const DefaultMargin = 100 * time.Millisecond

// CheckRequests checks that every request has exactly one outcome, and
// that it came by its deadline plus margin (0: [DefaultMargin]). A
// request without an outcome is a violation once the history has run
// past its deadline plus margin. An outcome seen late while the test
// process itself was stalled (see [History.WatchStalls]) for at least
// as long as it was late is a note, not a violation: the observer, not
// the broker, was late.
func CheckRequests(s Snapshot, margin time.Duration) Result {
	if margin <= 0 {
		margin = DefaultMargin
	}
	r := Result{Checker: "requests"}
	kinds := map[string]int{}
	excused := 0
	for _, q := range s.Requests {
		limit := q.Deadline + int64(margin)
		switch len(q.Outcomes) {
		case 0:
			if s.Duration > limit {
				r.violate("request %s (started %s, deadline %s) has no outcome", q.ID, ms(q.Start), ms(q.Deadline))
			} else {
				r.note("request %s still pending when the history ended, before its deadline", q.ID)
			}
			continue
		case 1:
		default:
			r.violate("request %s has %d outcomes: %s", q.ID, len(q.Outcomes), describeOutcomes(q.Outcomes))
		}
		o := q.Outcomes[0]
		kinds[o.Kind]++
		if o.Time > limit {
			// A test process that was not scheduled could not see the
			// outcome in time, whatever the broker did: lateness that a
			// stall of its own covers is told in a note, the rest is a
			// violation.
			if d := s.stallIn(q.Deadline, o.Time); d >= o.Time-limit {
				excused++
				r.note("request %s: %s at %s, %s after its deadline, while the test process stalled %s",
					q.ID, o.Kind, ms(o.Time), ms(o.Time-q.Deadline), ms(d))
				continue
			}
			r.violate("request %s: %s at %s, %s after its deadline (%s), past the %v margin",
				q.ID, o.Kind, ms(o.Time), ms(o.Time-q.Deadline), ms(q.Deadline), margin)
		}
	}
	if len(s.Stalls) > 0 {
		var longest int64
		for _, x := range s.Stalls {
			longest = max(longest, x[1]-x[0])
		}
		r.note("the test process stalled (woke over 50 ms late) %d times, at most %s; %d late outcomes fell in such stalls", len(s.Stalls), ms(longest), excused)
	}
	r.Checked = fmt.Sprintf("%d requests (%d responses, %d errors, %d deadlines): exactly one outcome each, by deadline + %v",
		len(s.Requests), kinds["response"], kinds["error"], kinds["deadline"], margin)
	return r
}

// describeOutcomes lists outcomes for a violation.
func describeOutcomes(os []RequestOutcome) string {
	s := ""
	for i, o := range os {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s at %s", o.Kind, ms(o.Time))
	}
	return s
}
