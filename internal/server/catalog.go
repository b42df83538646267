package server

import (
	"sync"
	"sync/atomic"

	"github.com/courier-mq/courier/wire"
)

// maxCatalogInFlight bounds the DECLAREs and DELETEs one connection has
// in flight in a cluster; the read loop waits for a slot beyond it, so
// a client that sends more is slowed by TCP, not given more of the
// node.
const maxCatalogInFlight = 64

// catalogLane runs a connection's DECLAREs and DELETEs off its read loop
// when the broker is a cluster's: each waits for the metadata group's
// commit (milliseconds), and the frames after it go on meanwhile. Frames
// are still processed in the order they arrive where it shows: a frame
// that names an exchange (DECLARE, DELETE, ATTACH, PUBLISH, REQUEST,
// SUBMIT) waits for the declares and deletes of that exchange sent
// before it, and LIST for all of them. The replies of the others may
// come in any order; a client matches them by Ref (docs/protocol.md).
type catalogLane struct {
	slots    chan struct{}
	inFlight atomic.Int64 // read without the lock by the read loop's fast path

	mu      sync.Mutex
	pending map[string]*catalogOp // the last op in flight per exchange
	wg      sync.WaitGroup
}

// catalogOp is one DECLARE or DELETE in flight; done closes when it was
// answered.
type catalogOp struct {
	done chan struct{}
}

func newCatalogLane() *catalogLane {
	return &catalogLane{slots: make(chan struct{}, maxCatalogInFlight), pending: map[string]*catalogOp{}}
}

// start runs handle(f) in a goroutine once a slot is free, after the
// earlier ops on the same exchange; false if closing ended first (f is
// released).
func (l *catalogLane) start(f *wire.Frame, handle func(*wire.Frame), closing <-chan struct{}) bool {
	if !l.waitFor(f.Name, closing) {
		f.Release()
		return false
	}
	select {
	case l.slots <- struct{}{}:
	case <-closing:
		f.Release()
		return false
	}
	op := &catalogOp{done: make(chan struct{})}
	name := f.Name
	l.mu.Lock()
	l.pending[name] = op
	l.inFlight.Add(1)
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		handle(f)
		l.mu.Lock()
		if l.pending[name] == op {
			delete(l.pending, name)
		}
		l.inFlight.Add(-1)
		l.mu.Unlock()
		close(op.done)
		<-l.slots
	}()
	return true
}

// waitFor waits until no DECLARE or DELETE of exchange name is in
// flight; false if closing ended first.
func (l *catalogLane) waitFor(name string, closing <-chan struct{}) bool {
	if l.inFlight.Load() == 0 {
		return true
	}
	l.mu.Lock()
	op := l.pending[name]
	l.mu.Unlock()
	if op == nil {
		return true
	}
	select {
	case <-op.done:
		return true
	case <-closing:
		return false
	}
}

// waitAll waits until no DECLARE or DELETE is in flight; false if
// closing ended first.
func (l *catalogLane) waitAll(closing <-chan struct{}) bool {
	for l.inFlight.Load() > 0 {
		l.mu.Lock()
		var op *catalogOp
		for _, o := range l.pending {
			op = o
			break
		}
		l.mu.Unlock()
		if op == nil {
			return true
		}
		select {
		case <-op.done:
		case <-closing:
			return false
		}
	}
	return true
}

// ordered reports whether frames of type t wait for the catalog ops on
// the exchange they name.
func ordered(t wire.Type) bool {
	switch t {
	case wire.TypeAttach, wire.TypePublish, wire.TypeRequest, wire.TypeSubmit:
		return true
	}
	return false
}

// wait waits for every op in flight to be answered.
func (l *catalogLane) wait() { l.wg.Wait() }
