package clustertest

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// Report is what a run checked and found, as text ([Report.WriteText])
// and JSON.
type Report struct {
	Scenario string          `json:"scenario"`
	Seed     uint64          `json:"seed"`
	Mode     Mode            `json:"mode"`
	Nodes    int             `json:"nodes"`
	Started  time.Time       `json:"started"`
	Duration time.Duration   `json:"duration_ns"`
	Nemeses  []NemesisRecord `json:"nemeses"`
	Notes    []Note          `json:"notes,omitempty"`
	Results  []Result        `json:"results"`
	// History is the whole history the checkers judged, kept for a
	// closer look at a failed run (scripts/chaos writes it next to the
	// report as chaos-SCENARIO-SEED-history.json).
	History Snapshot `json:"-"`
}

// NewReport makes the report of a run from its history and the results
// of its checkers.
func NewReport(scenario string, seed uint64, mode Mode, nodes int, h *History, results ...Result) Report {
	s := h.Snapshot()
	return Report{Scenario: scenario, Seed: seed, Mode: mode, Nodes: nodes, Started: h.Started(),
		Duration: time.Duration(s.Duration), Nemeses: s.Nemeses, Notes: s.Notes, Results: results, History: s}
}

// OK reports whether every checker decided and found no violation.
func (r Report) OK() bool {
	for _, x := range r.Results {
		if !x.OK() {
			return false
		}
	}
	return true
}

// Violations counts the violations of every checker.
func (r Report) Violations() int {
	n := 0
	for _, x := range r.Results {
		n += x.Count
	}
	return n
}

// WriteText writes the report for people.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "scenario %s  seed %d  mode %s  nodes %d  started %s  duration %v: %s, %d violations\n",
		r.Scenario, r.Seed, r.Mode, r.Nodes, r.Started.UTC().Format(time.RFC3339), r.Duration.Round(time.Millisecond), verdict, r.Violations())
	fmt.Fprintf(&b, "\nnemeses (%d%s):\n", len(r.Nemeses), kinds(r.Nemeses))
	for _, n := range r.Nemeses {
		fmt.Fprintf(&b, "  %10s – %-10s %-9s %-8s %s\n", ms(n.Start), ms(n.End), n.Name, strings.Join(n.Nodes, ","), n.Detail)
	}
	if len(r.Notes) > 0 {
		fmt.Fprintf(&b, "\nnotes:\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "  %10s %s\n", ms(n.Time), n.Text)
		}
	}
	fmt.Fprintf(&b, "\ncheckers:\n")
	for _, x := range r.Results {
		v := "ok"
		switch {
		case x.Unknown:
			v = "UNKNOWN"
		case x.Count > 0:
			v = fmt.Sprintf("%d VIOLATIONS", x.Count)
		}
		fmt.Fprintf(&b, "  %-9s %s: %s\n", x.Checker, v, x.Checked)
		for _, s := range x.Violations {
			fmt.Fprintf(&b, "      violation: %s\n", s)
		}
		if x.Count > len(x.Violations) {
			fmt.Fprintf(&b, "      ... and %d more\n", x.Count-len(x.Violations))
		}
		for _, s := range x.Notes {
			fmt.Fprintf(&b, "      note: %s\n", s)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as indented JSON.
func (r Report) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}

// kinds counts faults by kind, in order of first appearance: ": kill 3,
// pause 2".
func kinds(ns []NemesisRecord) string {
	count := map[string]int{}
	var order []string
	for _, n := range ns {
		if count[n.Name] == 0 {
			order = append(order, n.Name)
		}
		count[n.Name]++
	}
	if len(order) == 0 {
		return ""
	}
	parts := make([]string, len(order))
	for i, k := range order {
		parts[i] = fmt.Sprintf("%s %d", k, count[k])
	}
	return ": " + strings.Join(parts, ", ")
}
