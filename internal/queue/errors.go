package queue

import "errors"

// Sentinel errors. Errors returned by the package wrap these with the
// operation and the message or consumer concerned; test them with
// [errors.Is].
var (
	// ErrClosed is returned by every method of a [Queue] after
	// [Queue.Close].
	ErrClosed = errors.New("queue: closed")
	// ErrBadMessage is returned by [Queue.Enqueue] for a message it
	// refuses: a priority above [MaxPriority], a negative TTL.
	ErrBadMessage = errors.New("queue: bad message")
	// ErrBadConfig is returned by [Config.Validate] and [New].
	ErrBadConfig = errors.New("queue: bad config")
	// ErrNotInFlight is returned by [Queue.Ack], [Queue.Nack] and
	// [Queue.Progress] when the message is not in flight with that
	// consumer: unknown, already settled, or delivered to another
	// consumer (after a redelivery, the first consumer's late ack).
	ErrNotInFlight = errors.New("queue: message not in flight with this consumer")
	// ErrNotFound is returned by [Queue.Watch] for a message the queue
	// does not hold.
	ErrNotFound = errors.New("queue: no such message")
	// ErrPagedOut is returned by [Queue.Watch], together with
	// [ErrNotFound], for a message that may be in a run of a deep queue,
	// its index paged out to disk: it cannot be looked up until it comes
	// back to the queue's head. Watch a message from [Queue.Enqueue] to
	// follow it whatever happens.
	ErrPagedOut = errors.New("queue: message paged out to disk")
	// ErrConsumerExists is returned by [Queue.AddConsumer] for an id
	// already attached.
	ErrConsumerExists = errors.New("queue: consumer id already attached")
	// ErrUnknownConsumer is returned for a [Consumer] that was removed or
	// belongs to another queue.
	ErrUnknownConsumer = errors.New("queue: unknown consumer")
	// ErrJournal wraps a [Journal] failure on a change that the queue
	// made in memory anyway (an ack, a requeue): the change may be undone
	// by a restart, so the message may come back (at-least-once).
	ErrJournal = errors.New("queue: journal failed")
)
