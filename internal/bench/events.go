package bench

import (
	"fmt"
	"slices"
	"sync"
)

// eventCounts counts the asynchronous errors and disconnects a peer's
// client library reports during a run, by text, for the report's notes.
type eventCounts struct {
	mu     sync.Mutex // guards counts
	counts map[string]int
}

func (e *eventCounts) event(what string) {
	e.mu.Lock()
	if e.counts == nil {
		e.counts = make(map[string]int)
	}
	e.counts[what]++
	e.mu.Unlock()
}

// notes returns "Nx what" for each event, sorted.
func (e *eventCounts) notes() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]string, 0, len(e.counts))
	for what, n := range e.counts {
		out = append(out, fmt.Sprintf("%dx %s", n, what))
	}
	slices.Sort(out)
	return out
}
