package queue

import (
	"sync"
	"time"
)

// Clock is the time source of a [Scheduler] and of its queues. The real
// one is [SystemClock]; tests use a fake that fires timers when told.
type Clock interface {
	// Now returns the current time. Due times and expiries are wall-clock
	// times, since they must mean the same after a restart.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has elapsed, like
	// [time.AfterFunc].
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is what [Clock.AfterFunc] returns; *[time.Timer] satisfies it.
type Timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

// SystemClock is the [Clock] of the time package.
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
func (systemClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(d, f)
}

// SchedulerOptions configure a [Scheduler].
type SchedulerOptions struct {
	// Clock is the time source. Default: [SystemClock].
	Clock Clock
	// MaxSleep bounds how long the scheduler sleeps before it looks at
	// the wall clock again. Timers run on the monotonic clock while due
	// times are wall-clock times, so a step of the system clock (NTP)
	// would otherwise delay due messages by up to the whole sleep.
	// Default: 1s.
	MaxSleep time.Duration
}

// Scheduler drives the timers of many queues with a single runtime timer
// and no goroutine of its own: each queue keeps its due messages in its
// own heap and registers only its earliest deadline here, in a heap of
// queues. When the timer fires, the scheduler calls each due queue in a
// goroutine of the timer's, then arms the timer for the next deadline.
// With 100,000 queues and millions of waiting messages there is still
// one armed timer, and nothing runs while nothing is due.
//
// A Scheduler is safe for concurrent use. Lock order: a queue's lock is
// taken before the scheduler's, never the other way round; the scheduler
// calls queues without holding its lock.
type Scheduler struct {
	clock    Clock
	maxSleep time.Duration

	mu      sync.Mutex // guards the fields below, and Queue.wake and Queue.sidx
	heap    []*Queue   // queues with a deadline, a min-heap on Queue.wake
	timer   Timer      // nil until first armed
	armed   int64      // when the timer fires (unix ns); 0 if it is not armed
	running int        // fire calls in progress
	idle    sync.Cond  // on mu: running dropped to 0
	closed  bool
}

// NewScheduler returns a scheduler; Close it when the node stops.
func NewScheduler(opts SchedulerOptions) *Scheduler {
	if opts.Clock == nil {
		opts.Clock = SystemClock
	}
	if opts.MaxSleep <= 0 {
		opts.MaxSleep = time.Second
	}
	s := &Scheduler{clock: opts.Clock, maxSleep: opts.MaxSleep}
	s.idle.L = &s.mu
	return s
}

var (
	defaultSchedOnce sync.Once
	defaultSched     *Scheduler
)

// defaultScheduler is the scheduler of queues configured without one. It
// has no goroutine when idle, so it is never closed.
func defaultScheduler() *Scheduler {
	defaultSchedOnce.Do(func() { defaultSched = NewScheduler(SchedulerOptions{}) })
	return defaultSched
}

// Now is the scheduler's clock's time.
func (s *Scheduler) Now() time.Time { return s.clock.Now() }

// Close stops the timer and waits for queue calls in progress to return.
// Queues using the scheduler stop getting their timers: close it after
// them.
func (s *Scheduler) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	for s.running > 0 {
		s.idle.Wait()
	}
	for _, q := range s.heap {
		q.sidx = -1
	}
	s.heap = nil
}

// schedule asks for q.tick to be called at or soon after at (unix ns),
// unless q is already due earlier. Called with q.mu held.
func (s *Scheduler) schedule(q *Queue, at int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if q.sidx >= 0 {
		if at >= q.wake {
			return
		}
		q.wake = at
		s.up(q.sidx)
	} else {
		q.wake = at
		q.sidx = len(s.heap)
		s.heap = append(s.heap, q)
		s.up(q.sidx)
	}
	s.armLocked()
}

// unschedule forgets q. Called with q.mu held.
func (s *Scheduler) unschedule(q *Queue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q.sidx >= 0 {
		s.removeAt(q.sidx)
	}
}

// armLocked sets the timer for the earliest deadline if it is not set
// early enough. A fire in progress arms the timer when it ends.
func (s *Scheduler) armLocked() {
	if len(s.heap) == 0 || s.running > 0 || s.closed {
		return
	}
	want := s.heap[0].wake
	if s.armed != 0 && s.armed <= want {
		return
	}
	now := s.clock.Now().UnixNano()
	d := time.Duration(want - now)
	d = max(min(d, s.maxSleep), 0)
	s.armed = now + int64(d)
	if s.timer == nil {
		s.timer = s.clock.AfterFunc(d, s.fire)
	} else {
		s.timer.Reset(d)
	}
}

// fire runs the queues whose deadline has come, until none is due, then
// arms the timer for the next one.
func (s *Scheduler) fire() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.armed = 0
	s.running++
	var buf [32]*Queue
	for {
		now := s.clock.Now().UnixNano()
		due := buf[:0]
		for len(s.heap) > 0 && s.heap[0].wake <= now && !s.closed {
			due = append(due, s.removeAt(0))
		}
		if len(due) == 0 {
			break
		}
		s.mu.Unlock()
		for i, q := range due {
			q.tick(now)
			due[i] = nil
		}
		s.mu.Lock()
	}
	s.running--
	if s.running == 0 {
		s.idle.Broadcast()
		s.armLocked()
	}
	s.mu.Unlock()
}

// Heap of queues on wake; each queue knows its index (sidx).

func (s *Scheduler) less(i, j int) bool { return s.heap[i].wake < s.heap[j].wake }

func (s *Scheduler) swap(i, j int) {
	h := s.heap
	h[i], h[j] = h[j], h[i]
	h[i].sidx, h[j].sidx = i, j
}

func (s *Scheduler) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *Scheduler) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.less(r, l) {
			m = r
		}
		if !s.less(m, i) {
			return
		}
		s.swap(i, m)
		i = m
	}
}

func (s *Scheduler) removeAt(i int) *Queue {
	q := s.heap[i]
	last := len(s.heap) - 1
	if i != last {
		s.swap(i, last)
	}
	s.heap[last] = nil
	s.heap = s.heap[:last]
	if i != last {
		s.down(i)
		s.up(i)
	}
	q.sidx = -1
	return q
}
