package queue

import (
	"context"
	"fmt"
)

// Journal is where a durable queue writes the records that let it be
// rebuilt after a crash (see [Recover]). Every state change that must
// survive is one call:
//
//   - Enqueue: Append of a [KindEnqueue] record (the message, its body
//     included); its done callback is the publisher's confirm.
//   - A failed attempt (nack with requeue, or the consumer went away):
//     Append of a [KindAttempt] record (message id, attempts, when it
//     is due again), and Release of the message's previous attempt
//     record, so that each message has at most two live records.
//   - Ack, dead-letter, expiry: Release of the message's records. A
//     dead-lettered message is released only once the dead-letter sink
//     has taken it, so that a crash in between duplicates it rather than
//     loses it.
//
// Deliveries are not journaled: after a crash, messages that were in
// flight are delivered again (at-least-once).
//
// The interface maps one to one onto a queue's share of the node's
// store.Log: Append(kind, payload, done) is log.Append(queueID,
// store.Kind(kind), payload, done) with the store.Ref converted to a
// [Ref]; Release(refs, done) is log.Release(queueID, refs, done); and
// the node's log.Replay hands each queue its records (by Record.Queue),
// release records decoded with Record.Released, to [Rebuilder.Apply].
//
// Threading: the queue calls Append and Release with its lock held, in
// the order of the changes they record, so that a checkpoint taken under
// that lock sees each record with its change. They should not block: a
// journal with flow control makes publishers wait in [Admitter.Admit],
// without the lock. They must not call back into the queue. done callbacks
// may run on any goroutine, at most once each; they must not block, and
// must not call the queue either (the journal may be waiting for the
// queue's lock to be released).
type Journal interface {
	// Append adds a record and returns its reference at once; done, if
	// not nil, is called once the record is durable, with nil, or with
	// the error that may have lost it. If Append returns an error, the
	// record was not added and done is not called.
	Append(kind Kind, payload []byte, done func(error)) (Ref, error)
	// Release declares records dead: the queue will never need them
	// again, even after a crash. done is as for Append.
	Release(refs []Ref, done func(error)) error
}

// Reader is an optional interface of a [Journal] that can read a record
// back. A queue whose messages' bodies are not in memory (recovered
// with [Rebuilder.LazyBodies], and later paged out) reads them with it
// when it delivers them.
type Reader interface {
	// Read returns the payload of the record ref; the queue does not keep
	// the slice past the delivery.
	Read(ref Ref) ([]byte, error)
}

// Spiller is an optional interface of a [Journal] that keeps runs: whole
// files of the queue's own making, written once, read back in pieces,
// dropped when consumed. A durable queue whose journal is a Spiller and
// a [Reader] pages the middle of its deep FIFOs to runs (see the package
// doc, "Memory and paging"). [StoreJournal] keeps them as the store's
// run files.
//
// Threading: the queue calls these methods with its lock held; they must
// not call back into the queue.
type Spiller interface {
	// WriteRun writes data as a new run and returns its number. The run
	// must be durable by the time a checkpoint whose state names it is
	// (the store syncs runs at each checkpoint).
	WriteRun(data []byte) (uint32, error)
	// ReadRun reads from run num at off into buf, and returns the bytes
	// read (fewer than len(buf) only at the end of the run).
	ReadRun(num uint32, off int64, buf []byte) (int, error)
	// DropRun says the queue no longer needs run num. It may be deleted
	// once no durable checkpoint names it.
	DropRun(num uint32)
	// Runs lists the runs that exist, so that a queue rebuilt from a
	// checkpoint drops those the checkpoint does not name.
	Runs() []uint32
}

// Admitter is an optional interface of a [Journal] with flow control:
// [Queue.Enqueue] calls Admit before it takes the queue's lock, so that a
// publisher waits for the disk there, and Append, called under the lock,
// never waits. Acks, nacks and deliveries never call it: consumers never
// wait behind publishers.
type Admitter interface {
	// Admit returns once the journal has room for an append, or with
	// ctx's error, or the journal's if it failed.
	Admit(ctx context.Context) error
}

// DiskAlarmer is an optional interface of a [Journal] whose disk can run
// short: while DiskAlarm is true, [Queue.Pressure] asks the broker to
// stop the queue's publishers.
type DiskAlarmer interface {
	DiskAlarm() bool
}

// Ref names a record of the journal. It mirrors store.Ref (segment,
// offset, payload length), so that converting is free; the zero Ref
// means no record.
type Ref struct {
	Seg, Off, Len uint32
}

// IsZero reports whether r names no record.
func (r Ref) IsZero() bool { return r == Ref{} }

// String formats r as seg:off+len.
func (r Ref) String() string { return fmt.Sprintf("%d:%d+%d", r.Seg, r.Off, r.Len) }

// Kind tells a queue's records apart. The values fit the store's caller
// kinds (1 to 0xEF); [KindRelease] is the store's own.
type Kind uint8

const (
	// KindEnqueue is a message, body included (layout in record.go).
	KindEnqueue Kind = 1
	// KindAttempt records a failed attempt (layout in record.go).
	KindAttempt Kind = 2
	// KindRelease is a release of records; it equals store.KindRelease.
	// A [Journal] writes it on Release; replay hands it over as an
	// [Entry] with Released set.
	KindRelease Kind = 0xFF
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case KindEnqueue:
		return "enqueue"
	case KindAttempt:
		return "attempt"
	case KindRelease:
		return "release"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Entry is one record as replay hands it to [Rebuilder.Apply].
type Entry struct {
	Ref      Ref
	Kind     Kind
	Payload  []byte // KindEnqueue and KindAttempt; valid only during Apply
	Released []Ref  // KindRelease: the records it releases
}
