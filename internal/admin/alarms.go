package admin

import (
	"fmt"
	"strconv"
)

// Alarm kinds. An alarm is on while its condition holds; the API lists
// the alarms on now (GET /api/overview, "alarms"), /metrics has
// courier_alarm{kind} for every kind (1 while one is on), and the
// dashboard shows a banner.
const (
	// AlarmMemory: the queues reached the node's memory high watermark
	// (queue.Memory): every publisher waits for credit until the queues
	// are back under 95% of it.
	AlarmMemory = "memory"
	// AlarmDisk: the store's disk has less free space than its minimum
	// (store.Log.DiskAlarm): publishers of durable queues wait.
	AlarmDisk = "disk"
	// AlarmStore: the store met a write or sync error; durable queues
	// take no more messages until the node restarts.
	AlarmStore = "store"
	// AlarmComponent: a supervised component crashed more often than its
	// restart intensity allows and was given up.
	AlarmComponent = "component"
	// AlarmDamage: the store found records that no longer check (at
	// start, or in its background check): the disk changed data it had
	// synced, and their messages are lost. On until the node restarts.
	AlarmDamage = "damage"
)

// alarmKinds lists every kind, for the metrics.
var alarmKinds = []string{AlarmMemory, AlarmDisk, AlarmStore, AlarmComponent, AlarmDamage}

// Alarm is a condition an operator must see.
type Alarm struct {
	// Kind is one of the Alarm* constants.
	Kind string
	// Resource names what the alarm is about: a component's name; ""
	// for the node's memory and disk.
	Resource string
	// Message says what is wrong and what the node does about it.
	Message string
}

// alarms returns the alarms on now: the memory watermark's and the store's
// from their atomics, the components' from the supervisor's status
// (comps, read by the caller).
func (s *Server) alarms(comps []Component) []Alarm {
	var out []Alarm
	if m := s.b.Memory(); m != nil && m.Alarm() {
		out = append(out, Alarm{Kind: AlarmMemory, Message: fmt.Sprintf(
			"the queues hold %s, the memory high watermark of %s: publishers wait for credit until they are under 95%% of it",
			bytesText(m.Used()), bytesText(m.Limit()))})
	}
	if l := s.b.Store(); l != nil {
		if l.DiskAlarm() {
			out = append(out, Alarm{Kind: AlarmDisk, Message: fmt.Sprintf(
				"the data directory's disk has %s free, under the store's minimum: publishers of durable queues wait for credit",
				bytesText(l.DiskFree()))})
		}
		st := l.Stats()
		if st.Failed {
			out = append(out, Alarm{Kind: AlarmStore, Message: "the store met a write or sync error: durable queues take no more messages until the node restarts"})
		}
		if st.DamagedRecords > 0 {
			out = append(out, Alarm{Kind: AlarmDamage, Message: fmt.Sprintf(
				"the store found %d damaged records (%s) that fail their checksum: the disk changed data it had synced, and their messages are lost; the log names the segments",
				st.DamagedRecords, bytesText(st.DamagedBytes))})
		}
	}
	for _, c := range comps {
		if c.State != "failed" {
			continue
		}
		msg := fmt.Sprintf("component %s crashed more often than its restart intensity allows and is no longer restarted", c.Name)
		if c.LastError != "" {
			msg += "; last error: " + c.LastError
		}
		out = append(out, Alarm{Kind: AlarmComponent, Resource: c.Name, Message: msg})
	}
	return out
}

// bytesText writes a size for people: "512 B", "3.2 MiB".
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

func appendAlarms(b []byte, as []Alarm) []byte {
	b = append(b, '[')
	for i, a := range as {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"kind":`...)
		b = appendString(b, a.Kind)
		b = append(b, `,"resource":`...)
		b = appendString(b, a.Resource)
		b = append(b, `,"message":`...)
		b = appendString(b, a.Message)
		b = append(b, '}')
	}
	return append(b, ']')
}
