package bench

import (
	"context"
	"sync/atomic"
	"time"
)

// budget hands out the events of a run to one or more goroutines until
// its count is used up or its time is over, whichever comes first.
type budget struct {
	count int64     // 0: no limit by count
	until time.Time // zero: no limit by time
	next  atomic.Int64
}

func newBudget(count int, d time.Duration) *budget {
	b := &budget{count: int64(count)}
	if d > 0 {
		b.until = time.Now().Add(d)
	}
	return b
}

// take claims the next event and returns its index (from 0), or false
// when the run is over.
func (b *budget) take() (int64, bool) {
	i := b.next.Add(1) - 1
	if b.count > 0 && i >= b.count {
		return i, false
	}
	if !b.until.IsZero() && time.Now().After(b.until) {
		return i, false
	}
	return i, true
}

// done returns how many events were handed out, for progress reports.
func (b *budget) done() int64 {
	n := b.next.Load()
	if b.count > 0 {
		n = min(n, b.count)
	}
	return n
}

// pacer spaces one goroutine's events at a fixed rate, open loop: an
// event that is late goes at once and the later ones keep to the
// schedule, so a broker that is slow to answer cannot lower the offered
// rate, and the latency of an event held up by slow answers counts from
// when it was due, as wrk2 does (no coordinated omission).
type pacer struct {
	start time.Time
	every time.Duration // 0: no pacing
	n     int64
}

// newPacer returns a pacer of rate events per second; rate 0 or less
// is as fast as possible. offset, in [0,1), shifts its schedule by a
// share of one period, so that many pacers do not fire together.
func newPacer(rate float64, offset float64) *pacer {
	p := &pacer{start: time.Now()}
	if rate > 0 {
		p.every = time.Duration(float64(time.Second) / rate)
		p.start = p.start.Add(time.Duration(offset * float64(p.every)))
	}
	return p
}

// next returns when the next event is due, without waiting; the start
// without a rate.
func (p *pacer) next() time.Time { return p.start.Add(time.Duration(p.n) * p.every) }

// wait returns when the next event is due, with the time its latency
// counts from, or false when ctx ended first. The event's latency counts
// from when it was due if the goroutine was still busy with earlier
// events then (the broker held it up), else from when the wait ended (a
// timer that fires late is the load generator's delay, not the
// broker's). Without a rate it is now.
func (p *pacer) wait(ctx context.Context) (time.Time, bool) {
	if p.every == 0 {
		return time.Now(), ctx.Err() == nil
	}
	due := p.next()
	p.n++
	if d := time.Until(due); d > 0 {
		sleepCtx(ctx, d)
		return time.Now(), ctx.Err() == nil
	}
	return due, ctx.Err() == nil
}
