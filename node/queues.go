package node

import (
	"fmt"

	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/wire"
)

// queueSource shows the broker's queues to the management API: task
// exchanges' queues and durable subscriptions, from their live counters.
type queueSource struct{ b *broker.Broker }

var (
	_ admin.QueueSource = queueSource{}
	_ admin.QueueRefs   = queueSource{}
	_ admin.QueuePeeker = queueSource{}
)

// queueRef reads a queue's counters for the management API, which keeps
// one per queue between samples: it is the queue's block of counters, so
// that a listing reads one cache line a queue and never the queue itself.
type queueRef queue.Counters

// Counters reads the figures of a listing, not the name: the management
// API has it.
func (r *queueRef) Counters() admin.QueueInfo { return summaryInfo((*queue.Counters)(r).Summary()) }

func (s queueSource) QueueVersion() uint64 { return s.b.QueueVersion() }

func (s queueSource) AppendQueueRefs(dst []admin.NamedQueueRef) []admin.NamedQueueRef {
	s.b.RangeQueues(func(q *queue.Queue, _ bool) bool {
		dst = append(dst, admin.NamedQueueRef{Name: q.Name(), Ref: (*queueRef)(q.Counters())})
		return true
	})
	return dst
}

func queueInfo(q *queue.Queue) admin.QueueInfo {
	info := counters(q)
	info.Name = q.Name()
	return info
}

func counters(q *queue.Queue) admin.QueueInfo { return summaryInfo(q.Counters().Summary()) }

func summaryInfo(st queue.Summary) admin.QueueInfo {
	return admin.QueueInfo{
		MessagesReady: uint64(st.Ready + st.Delayed), MessagesUnacked: uint64(st.Unacked),
		Consumers: int(st.Consumers), Memory: uint64(st.Resident),
		Publish: st.Published, Deliver: st.Delivered, Ack: st.Acked,
	}
}

func (s queueSource) AppendQueues(dst []admin.QueueInfo) []admin.QueueInfo {
	s.b.RangeQueues(func(q *queue.Queue, _ bool) bool {
		dst = append(dst, queueInfo(q))
		return true
	})
	return dst
}

func (s queueSource) Queue(name string) (admin.QueueInfo, bool) {
	q := s.b.Queue(name)
	if q == nil {
		return admin.QueueInfo{}, false
	}
	return queueInfo(q), true
}

// CreateQueue declares a task exchange of that name. The RabbitMQ
// arguments that map onto its options are understood:
// x-message-ttl (ms), x-dead-letter-exchange, x-delivery-limit,
// x-single-active-consumer, x-max-length, x-max-length-bytes,
// x-overflow (reject-publish or drop-head) and
// x-quorum-initial-group-size (the replicas, as RabbitMQ's quorum
// queues name it).
func (s queueSource) CreateQueue(name string, spec admin.QueueSpec) (admin.QueueInfo, bool, error) {
	cfg := wire.ExchangeConfig{Pattern: wire.PatternTasks, Transient: !spec.Durable}
	for k, v := range spec.Arguments {
		bad := func() error {
			return wire.Errorf(wire.CodeBadOptions, "queue %q: argument %s: bad value %v", name, k, v)
		}
		switch k {
		case "x-message-ttl", "x-delivery-limit", "x-max-length", "x-max-length-bytes", "x-quorum-initial-group-size":
			n, ok := v.(float64)
			if !ok || n < 0 || n != float64(int64(n)) {
				return admin.QueueInfo{}, false, bad()
			}
			switch k {
			case "x-message-ttl":
				cfg.TTLMS = int64(n)
			case "x-delivery-limit":
				cfg.MaxAttempts = int(n)
			case "x-max-length":
				cfg.MaxLength = int64(n)
			case "x-quorum-initial-group-size":
				if n > wire.MaxReplicas {
					return admin.QueueInfo{}, false, bad()
				}
				cfg.Replicas = int(n)
			default:
				cfg.MaxBytes = int64(n)
			}
		case "x-overflow":
			str, ok := v.(string)
			if !ok {
				return admin.QueueInfo{}, false, bad()
			}
			cfg.Overflow = str
		case "x-dead-letter-exchange":
			str, ok := v.(string)
			if !ok {
				return admin.QueueInfo{}, false, bad()
			}
			cfg.DeadLetter = str
		case "x-single-active-consumer":
			on, ok := v.(bool)
			if !ok {
				return admin.QueueInfo{}, false, bad()
			}
			if on {
				cfg.Strategy = wire.StrategySingleActive
			}
		default:
			return admin.QueueInfo{}, false, wire.Errorf(wire.CodeBadOptions, "queue %q: unsupported argument %s", name, k)
		}
	}
	existed := s.b.Queue(name) != nil
	ex, err := s.b.DeclareAs(name, broker.Spec{ExchangeConfig: cfg}, spec.Declarer)
	if err != nil {
		return admin.QueueInfo{}, false, err
	}
	q := s.b.Queue(name)
	if q == nil && ex != nil && ex.Info().Replicas > 0 {
		// A replicated queue served by another node (its replicas'
		// leader): declared, its counters are there.
		return admin.QueueInfo{Name: name}, !existed, nil
	}
	if q == nil {
		return admin.QueueInfo{}, false, fmt.Errorf("queue %q vanished", name)
	}
	return queueInfo(q), !existed, nil
}

func (s queueSource) DeleteQueue(name string) error { return s.b.DeleteQueue(name) }

func (s queueSource) PurgeQueue(name string) (uint64, error) { return s.b.PurgeQueue(name) }

// PeekQueue shows the messages next in line of a queue, leaving them
// there (see [queue.Queue.Peek]).
func (s queueSource) PeekQueue(name string, n int) ([]admin.PeekedMessage, error) {
	q := s.b.Queue(name)
	if q == nil {
		return nil, wire.Errorf(wire.CodeNotFound, "queue %q not found", name)
	}
	ds, err := q.Peek(n)
	if err != nil {
		return nil, fmt.Errorf("peek queue %q: %w", name, err)
	}
	out := make([]admin.PeekedMessage, len(ds))
	for i, d := range ds {
		out[i] = admin.PeekedMessage{ID: d.ID, Body: d.Body, Headers: d.Headers, Key: d.Key,
			Priority: d.Priority, Attempts: d.Attempts, Enqueued: d.Enqueued}
	}
	return out, nil
}
