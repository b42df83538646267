package queue

import (
	"math"
	"sync/atomic"
)

// Memory is a node's memory budget, shared by all its queues
// ([Config.Memory]): every queue reports to it the bytes it keeps in RAM
// (message bodies and headers it holds, and its index: about
// [MessageOverhead] bytes a message), and reads from it how hard to page.
// All its methods read or write atomics: the broker may call them as
// often as it likes, from any goroutine, without waiting on a queue.
//
// It has two sizes. The budget ([Memory.Budget]) is what durable queues
// may keep in RAM by choice: as the accounted bytes fill it they page
// (see the package doc, "Memory and paging"). The limit ([Memory.Limit],
// at least the budget) is what the queues may hold at all, paged or not
// (transient queues, keyed and delayed messages cannot page): as the
// accounted bytes fill it, publishers are slowed, then stopped.
//
//	page fill = Used / Budget
//	0 ─────────── PageAt (0.5) ───────────────────────── 1
//	  all in RAM    │ bodies, then the index of deep queues go to disk,
//	                │ more the fuller; at 1 a small working set only
//
//	fill = Used / Limit
//	0 ───────────────────────── ThrottleAt (0.85) ──── 1 (alarm)
//	  publishers not slowed        │ publishers of the     │ every publisher
//	                               │ queues that hold the  │ waits (Pressure 1)
//	                               │ memory slowed first   │ until fill < 0.95
//
// With the budget equal to the limit ([NewMemory]'s default), paging
// starts at half the limit. Transient queues cannot page (their messages
// are nowhere else): their bytes stay counted, so they are the first
// their publishers' flow control slows ([Queue.Pressure]).
type Memory struct {
	limit    atomic.Int64
	budget   atomic.Int64 // at most limit
	used     atomic.Int64 // bytes the queues keep in RAM
	pagedOut atomic.Int64 // messages whose index is in RAM and body only on disk
	spilled  atomic.Int64 // messages whose index too is only on disk
	queues   atomic.Int64 // open queues using the budget
	alarm    atomic.Bool
}

// Fill thresholds of a [Memory] budget, as fractions of its limit.
const (
	// PageAt is the fill of the budget from which durable queues page
	// message bodies, then the index of deep queues, out to disk,
	// smoothly: the share kept in RAM falls from all at PageAt to a small
	// working set at 1.
	PageAt = 0.5
	// ThrottleAt is the fill from which [Queue.Pressure] asks the broker
	// to slow publishers, those of the queues that hold the most memory
	// first.
	ThrottleAt = 0.85
	// AlarmClearAt is the fill under which a memory alarm (raised at a
	// fill of 1) clears.
	AlarmClearAt = 0.95
)

// MessageOverhead is what the queue accounts for the index of a message
// kept in RAM, besides its key, body and headers: the message's struct,
// its map entry and list links (measured by TestMessageOverhead).
const MessageOverhead = 232

// NewMemory returns a budget whose limit and budget are both limit bytes
// (at least 1): durable queues page from half of it. [Memory.SetBudget]
// makes them page sooner.
func NewMemory(limit int64) *Memory {
	m := &Memory{}
	m.SetLimit(limit)
	return m
}

// SetLimit changes the limit, and the budget with it if the budget was
// the limit or is now above it; queues follow at their next operation.
func (m *Memory) SetLimit(limit int64) {
	limit = max(limit, 1)
	if old := m.limit.Swap(limit); m.budget.Load() == old || m.budget.Load() > limit {
		m.budget.Store(limit)
	}
	m.checkAlarm()
}

// SetBudget changes the budget, what durable queues keep in RAM before
// they page, to budget bytes (at least 1, at most the limit); queues
// follow at their next operation.
func (m *Memory) SetBudget(budget int64) {
	m.budget.Store(min(max(budget, 1), m.limit.Load()))
}

// Limit returns the limit in bytes: the alarm goes on when the queues
// hold that much.
func (m *Memory) Limit() int64 { return m.limit.Load() }

// Budget returns the budget in bytes: durable queues page as the queues
// fill it.
func (m *Memory) Budget() int64 { return m.budget.Load() }

// Used returns the bytes the queues account in RAM.
func (m *Memory) Used() int64 { return m.used.Load() }

// Fill returns Used / Limit (above 1 past the limit).
func (m *Memory) Fill() float64 {
	return float64(m.used.Load()) / float64(m.limit.Load())
}

// Alarm reports whether the memory alarm is on: the queues reached the
// limit and have not yet come back under [AlarmClearAt]. While it is on,
// [Queue.Pressure] is 1 for every queue.
func (m *Memory) Alarm() bool { return m.alarm.Load() }

// PageLevel is how hard durable queues page, from 0 (keep everything in
// RAM) to 1 (keep only a small working set): 0 up to [PageAt] of the
// budget, rising linearly to 1 at the budget.
func (m *Memory) PageLevel() float64 {
	return ramp(float64(m.used.Load())/float64(m.budget.Load()), PageAt, 1)
}

// ThrottleLevel is how hard the broker should slow publishers, from 0 to
// 1: 0 up to [ThrottleAt], rising linearly to 1 at the limit, 1 while
// the alarm is on. [Queue.Pressure] applies it to one queue.
func (m *Memory) ThrottleLevel() float64 {
	if m.alarm.Load() {
		return 1
	}
	return ramp(m.Fill(), ThrottleAt, 1)
}

// MemoryStats are a budget's counters.
type MemoryStats struct {
	Limit, Budget, Used int64
	PagedOut            int64 // messages whose body is only on disk, index in RAM
	Spilled             int64 // messages whose index is on disk too
	Queues              int64 // open queues on the budget
	Alarm               bool
	PageLevel           float64
	Throttle            float64
}

// Stats returns the budget's counters, without locks.
func (m *Memory) Stats() MemoryStats {
	return MemoryStats{
		Limit: m.limit.Load(), Budget: m.budget.Load(), Used: m.used.Load(), PagedOut: m.pagedOut.Load(),
		Spilled: m.spilled.Load(), Queues: m.queues.Load(), Alarm: m.alarm.Load(),
		PageLevel: m.PageLevel(), Throttle: m.ThrottleLevel(),
	}
}

// add applies a queue's changes and updates the alarm.
func (m *Memory) add(used, pagedOut, spilled int64) {
	if used != 0 {
		m.used.Add(used)
	}
	if pagedOut != 0 {
		m.pagedOut.Add(pagedOut)
	}
	if spilled != 0 {
		m.spilled.Add(spilled)
	}
	if used != 0 {
		m.checkAlarm()
	}
}

// checkAlarm sets the alarm at a fill of 1 and clears it under
// AlarmClearAt.
func (m *Memory) checkAlarm() {
	f := m.Fill()
	switch on := m.alarm.Load(); {
	case !on && f >= 1:
		m.alarm.CompareAndSwap(false, true)
	case on && f < AlarmClearAt:
		m.alarm.CompareAndSwap(true, false)
	}
}

// ramp is 0 up to lo, 1 from hi, linear between.
func ramp(x, lo, hi float64) float64 {
	switch {
	case math.IsNaN(x) || x <= lo:
		return 0
	case x >= hi:
		return 1
	}
	return (x - lo) / (hi - lo)
}

// Resident returns the bytes q keeps in RAM, as accounted in its
// [Config.Memory]: index entries, and the bodies and headers not paged
// out. It reads an atomic.
func (q *Queue) Resident() int64 { return q.stats.resident.Load() }

// heavyShare is the share of a budget's used bytes from which a queue
// counts as one that causes the pressure: its publishers get the whole
// throttle level; a queue holding less gets it in proportion.
const heavyShare = 0.1

// Pressure tells the broker how hard to slow the publishers of q, from 0
// (not at all) to 1 (give them no credit until it falls): the node's
// throttle level ([Memory.ThrottleLevel]) weighed by q's share of the
// memory used, so that the queues that hold the memory are slowed first
// (a queue with a tenth of it or more gets the full level); 1 for every
// queue while the memory alarm is on; and 1 for a durable queue while
// its journal's disk alarm is on ([DiskAlarmer]). Consumers are never
// slowed. It reads atomics only.
func (q *Queue) Pressure() float64 {
	p := 0.0
	if m := q.cfg.Memory; m != nil {
		if m.alarm.Load() {
			return 1
		}
		if t := m.ThrottleLevel(); t > 0 {
			share := float64(q.stats.resident.Load()) / float64(max(m.used.Load(), 1))
			p = t * min(1, share/heavyShare)
		}
	}
	if q.disk != nil && q.disk.DiskAlarm() {
		return 1
	}
	return p
}
