package auth

import (
	"context"
	"fmt"
	"sync"
)

// hashPool bounds the password checks (argon2id, 19 MiB and tens of
// milliseconds of one core each) running at once, and the logins waiting
// for one. Waiters are served in order, those of the high lane first:
// logins from sources without recent failures go there, so that a
// password-guessing flood waits behind the users it is not.
type hashPool struct {
	mu       sync.Mutex // guards free, waiting
	free     int        // slots not taken
	maxWait  int        // waiters allowed, both lanes together
	waiting  [2][]chan struct{}
	nWaiting int
}

// Lanes of the pool.
const (
	laneHigh = 0
	laneLow  = 1
)

func newHashPool(slots, maxWait int) *hashPool {
	return &hashPool{free: max(1, slots), maxWait: max(0, maxWait)}
}

// acquire takes a slot, waiting in lane until one is free or ctx ends.
// It fails at once with [ErrBusy] when maxWait logins already wait.
func (p *hashPool) acquire(ctx context.Context, lane int) error {
	p.mu.Lock()
	if p.free > 0 && p.nWaiting == 0 {
		p.free--
		p.mu.Unlock()
		return nil
	}
	if p.nWaiting >= p.maxWait {
		p.mu.Unlock()
		return fmt.Errorf("%w: %d logins wait for a password check", ErrBusy, p.nWaiting)
	}
	ready := make(chan struct{})
	p.waiting[lane] = append(p.waiting[lane], ready)
	p.nWaiting++
	p.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, w := range p.waiting[lane] {
		if w == ready {
			p.waiting[lane] = append(p.waiting[lane][:i], p.waiting[lane][i+1:]...)
			p.nWaiting--
			return fmt.Errorf("%w: no password check free in time: %w", ErrBusy, ctx.Err())
		}
	}
	// Handed a slot as ctx ended: give it on.
	p.releaseLocked()
	return fmt.Errorf("%w: no password check free in time: %w", ErrBusy, ctx.Err())
}

// release gives a slot back, to the first waiter if any.
func (p *hashPool) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked()
}

func (p *hashPool) releaseLocked() {
	for lane := range p.waiting {
		if q := p.waiting[lane]; len(q) > 0 {
			close(q[0])
			q[0] = nil
			p.waiting[lane] = q[1:]
			p.nWaiting--
			return
		}
	}
	p.free++
}

// waiters returns the number of logins waiting for a slot.
func (p *hashPool) waiters() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nWaiting
}
