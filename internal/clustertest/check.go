package clustertest

import "fmt"

// maxListed bounds the violations a result lists; the rest are counted.
const maxListed = 20

// Result is what one checker checked and found.
type Result struct {
	// Checker names the checker ("registry", "leaders", ...).
	Checker string `json:"checker"`
	// Checked says what was checked, with counts.
	Checked string `json:"checked"`
	// Violations lists what broke a promise (at most 20, see Count).
	Violations []string `json:"violations,omitempty"`
	// Count is the number of violations, listed or not.
	Count int `json:"violation_count"`
	// Notes says what is worth knowing but breaks no promise
	// (duplicates at-least-once allows, outcomes unknown, losses inside
	// fault windows).
	Notes []string `json:"notes,omitempty"`
	// Unknown is set when the checker could not decide (porcupine ran
	// out of time); it is not a pass.
	Unknown bool `json:"unknown,omitempty"`
}

// OK reports whether the checker decided and found no violation.
func (r *Result) OK() bool { return r.Count == 0 && !r.Unknown }

// violate records a violation.
func (r *Result) violate(format string, args ...any) {
	r.Count++
	if len(r.Violations) < maxListed {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
}

// note records a note.
func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// ms formats nanoseconds of the history as milliseconds.
func ms(ns int64) string {
	if ns == Forever {
		return "never"
	}
	return fmt.Sprintf("%.1fms", float64(ns)/1e6)
}
