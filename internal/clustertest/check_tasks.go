package clustertest

import "fmt"

// TaskEvent says what happened to a task.
type TaskEvent string

// Task events.
const (
	// TaskConfirmed: the broker confirmed the submit.
	TaskConfirmed TaskEvent = "confirmed"
	// TaskDelivered: a worker received the task.
	TaskDelivered TaskEvent = "delivered"
)

// TaskRecord is one task event; ID is the task's identity as the test
// chose it (its body, say), the same in both events.
type TaskRecord struct {
	ID     string    `json:"id"`
	Event  TaskEvent `json:"event"`
	Worker string    `json:"worker,omitempty"`
	Time   int64     `json:"t_ns"`
}

// CheckTasks checks that every confirmed task was delivered at least
// once. Duplicates, which at-least-once allows, are counted in a note;
// so are deliveries of tasks never confirmed (a submit whose confirm was
// lost may still have been enqueued).
func CheckTasks(s Snapshot) Result {
	r := Result{Checker: "tasks"}
	confirmed := map[string]int64{}
	var order []string
	delivered := map[string]int{}
	for _, t := range s.Tasks {
		switch t.Event {
		case TaskConfirmed:
			if _, ok := confirmed[t.ID]; !ok {
				order = append(order, t.ID)
			}
			confirmed[t.ID] = t.Time
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
	r.Checked = fmt.Sprintf("%d confirmed tasks, %d delivered: every confirmed task delivered at least once", len(order), len(delivered))
	return r
}
