package queue

import "time"

// Message is what a producer submits to [Queue.Enqueue].
type Message struct {
	// Body is the payload. The queue keeps the slice: do not modify it
	// after Enqueue.
	Body []byte
	// Headers are carried to the consumer as they are. The queue keeps
	// the map: do not modify it after Enqueue.
	Headers map[string]string
	// Key, if not empty, makes this a keyed task: the messages of one
	// key are delivered one at a time, in order (see the package doc).
	// At most 65,535 bytes.
	Key string
	// Priority, from 0 to [MaxPriority]: higher goes first; FIFO within a
	// level.
	Priority uint8
	// DueAt, if set and in the future, delays the message until then: it
	// joins the queue at that time, as if it had been enqueued then.
	DueAt time.Time
	// TTL, if not zero, bounds how long the message may wait once due; the
	// queue's [Config.TTL] applies if it is shorter.
	TTL time.Duration
	// Producer and Seq, if Producer is not empty, name the message for
	// deduplication (see [Config.DedupWindow]): an enqueue of a pair the
	// window holds returns the first message's id and stores nothing.
	// Producer is at most [MaxProducerLen] bytes; Seq is not 0.
	Producer string
	Seq      uint64
}

// Delivery is a message handed to a consumer, or to a dead-letter sink.
// Its slices and map are shared with the queue: read them, do not modify
// them.
type Delivery struct {
	ID       uint64
	Body     []byte
	Headers  map[string]string
	Key      string
	Priority uint8
	// Attempts counts the failed attempts before this delivery: nacks
	// with requeue, and consumers that went away with it.
	Attempts uint32
	// Redelivered is set on every delivery after a failed attempt.
	Redelivered bool
	// Enqueued is when the message was accepted by the queue.
	Enqueued time.Time
}

// Reason says why a message was dead-lettered.
type Reason string

// Reasons for [DeadLetter.Reason] and [Event.Reason].
const (
	ReasonMaxAttempts Reason = "max attempts"
	ReasonExpired     Reason = "ttl expired"
	ReasonRejected    Reason = "rejected"
	// ReasonUnreadable: the body could not be read back from the journal.
	ReasonUnreadable Reason = "unreadable"
	// ReasonSettledUnknown: on the event a resend's watcher gets when the
	// first message was settled before a restart, its outcome not kept.
	ReasonSettledUnknown Reason = "settled earlier, outcome unknown"
)

// DeadLetter is a message leaving a queue without being acked.
type DeadLetter struct {
	Queue   string // the queue's name
	Reason  Reason
	Message Delivery
}

// EventKind tells [Event]s apart.
type EventKind uint8

const (
	// EventProgress: a consumer reported progress with [Queue.Progress].
	EventProgress EventKind = iota + 1
	// EventRetry: the message failed and will be delivered again at
	// [Event.Due].
	EventRetry
	// EventCompleted: the message was acked. It is the last event.
	EventCompleted
	// EventFailed: the message was dead-lettered, for [Event.Reason]. It
	// is the last event.
	EventFailed
	// EventLost: the queue closed (deleted, or no longer served here: a
	// replicated queue whose leadership moved) with the message in it,
	// so its outcome will not be known here. It is the last event.
	EventLost
)

// String names the kind.
func (k EventKind) String() string {
	switch k {
	case EventProgress:
		return "progress"
	case EventRetry:
		return "retry"
	case EventCompleted:
		return "completed"
	case EventFailed:
		return "failed"
	case EventLost:
		return "lost"
	}
	return "unknown"
}

// Event is what a watcher of a message receives (see [Queue.Watch]).
type Event struct {
	ID       uint64
	Kind     EventKind
	Percent  int       // EventProgress: 0 to 100
	Text     string    // EventProgress: the consumer's message
	Attempts uint32    // EventRetry, EventFailed: failed attempts so far
	Due      time.Time // EventRetry: when it will be delivered again
	Reason   Reason    // EventFailed
	Consumer string    // EventProgress, EventCompleted: the consumer's id
}

// WatchFunc receives a message's events. It is called without the
// queue's lock, in order, and must not block.
type WatchFunc func(Event)

// state is where a message is.
type state uint8

const (
	stReady    state = iota + 1 // in a ready list, or in its key's waiting list
	stDelayed                   // in the timer heap until due (delayed at enqueue)
	stBackoff                   // in the timer heap until retried; blocks its key
	stInflight                  // on its consumer's unacked list
)

// message is the queue's record of one message. Guarded by Queue.mu.
type message struct {
	id       uint64
	body     []byte            // nil when paged
	size     int               // body length
	headers  map[string]string // nil when paged
	hsize    int32             // bytes accounted for headers
	paged    bool              // body and headers are only in the journal, at ref
	key      string
	prio     uint8
	st       state
	attempts uint32
	enqueued int64       // unix ns
	due      int64       // unix ns; when a delayed or backing-off message is due
	expires  int64       // unix ns; 0: never
	at       int64       // timer heap key: min(due, expires) or expires
	hidx     int32       // index in the timer heap; -1 if not in it
	ref      Ref         // the enqueue record
	aref     Ref         // the latest attempt record
	dk       *dedupEntry // its (producer, seq) in the window, or nil

	ks         *keyState // the key it belongs to (in its waiting list, or busy), or nil
	owner      *Consumer // stInflight: who has it
	list       *msgList  // the list it is on, or nil
	prev, next *message  // links in list
}

// msgList is an intrusive doubly linked list of messages.
type msgList struct {
	head, tail *message
	n          int
}

func (l *msgList) pushBack(m *message) {
	m.list, m.prev, m.next = l, l.tail, nil
	if l.tail != nil {
		l.tail.next = m
	} else {
		l.head = m
	}
	l.tail = m
	l.n++
}

func (l *msgList) pushFront(m *message) {
	m.list, m.prev, m.next = l, nil, l.head
	if l.head != nil {
		l.head.prev = m
	} else {
		l.tail = m
	}
	l.head = m
	l.n++
}

func (l *msgList) remove(m *message) {
	if m.prev != nil {
		m.prev.next = m.next
	} else {
		l.head = m.next
	}
	if m.next != nil {
		m.next.prev = m.prev
	} else {
		l.tail = m.prev
	}
	m.list, m.prev, m.next = nil, nil, nil
	l.n--
}

// level is one priority level of the shared ready list: messages being
// retried go before the others, each in the order they became ready.
// The others form a FIFO in three parts: main, the head, in RAM; runs,
// the middle, spilled to the journal's runs with no *message in RAM;
// and tail, in RAM, where messages join while runs are not empty (see
// spill.go). runs empty implies tail empty.
type level struct {
	retry, main msgList
	runs        []*run // oldest first
	spilled     int64  // messages in runs
	tail        msgList
}

// front is the next message of the level in RAM; the caller refills main
// from the runs first (Queue.front).
func (lv *level) front() *message {
	if lv.retry.head != nil {
		return lv.retry.head
	}
	return lv.main.head
}

func (lv *level) empty() bool {
	return lv.retry.n == 0 && lv.main.n == 0 && lv.spilled == 0 && lv.tail.n == 0 && len(lv.runs) == 0
}

// timerHeap is a min-heap of messages on (at, id); each message knows its
// index (hidx).
type timerHeap []*message

func (h timerHeap) less(i, j int) bool {
	a, b := h[i], h[j]
	return a.at < b.at || a.at == b.at && a.id < b.id
}

func (h timerHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = int32(i), int32(j)
}

func (h timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h timerHeap) down(i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h.swap(i, m)
		i = m
	}
}

func (h *timerHeap) push(m *message) {
	m.hidx = int32(len(*h))
	*h = append(*h, m)
	h.up(int(m.hidx))
}

func (h *timerHeap) remove(m *message) {
	i := int(m.hidx)
	s := *h
	last := len(s) - 1
	if i != last {
		s.swap(i, last)
	}
	s[last] = nil
	*h = s[:last]
	if i != last {
		(*h).down(i)
		(*h).up(i)
	}
	m.hidx = -1
}
