package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
)

// QueueInfo is a queue's state as the management API shows it. Every
// figure comes from counters the queue keeps live; none is computed by
// scanning messages.
type QueueInfo struct {
	// Name is the queue's name; it sorts the queue list.
	Name string
	// MessagesReady is the number of messages waiting for a consumer.
	MessagesReady uint64
	// MessagesUnacked is the number of messages delivered and not yet
	// acknowledged.
	MessagesUnacked uint64
	// Consumers is the number of consumers attached.
	Consumers int
	// Memory is the bytes the queue keeps in RAM, as its node's memory
	// budget accounts them: the index entries of its messages and the
	// bodies and headers not paged out to disk.
	Memory uint64
	// Publish, Deliver and Ack count the messages published to, delivered
	// from and acknowledged on the queue since it was created. The
	// management API derives their rates once a second.
	Publish, Deliver, Ack uint64
}

// QueueSpec is the body of PUT /api/queues/{name}, in RabbitMQ's shape:
// {"durable": true, "arguments": {"x-max-length": 1000}}.
type QueueSpec struct {
	Durable   bool           `json:"durable"`
	Arguments map[string]any `json:"arguments,omitempty"`
	// Declarer is the user of the request, set by the management API:
	// the queue is declared on its behalf (see [broker.Declarer]).
	Declarer broker.Declarer `json:"-"`
}

// QueueSource is the queue layer as the management API sees it. Its
// methods are called from HTTP handlers and the sampler, concurrently;
// they must read live counters and must not wait for a busy queue's
// goroutine. Errors that are a [*wire.Error] keep their meaning in HTTP
// (CodeNotFound is 404, CodeClash 409, CodeBadOptions 400).
type QueueSource interface {
	// AppendQueues appends every queue to dst, in any order, and returns
	// it.
	AppendQueues(dst []QueueInfo) []QueueInfo
	// Queue returns one queue; ok is false when there is none.
	Queue(name string) (q QueueInfo, ok bool)
	// CreateQueue creates the queue, or checks that the existing one
	// matches spec; created tells which.
	CreateQueue(name string, spec QueueSpec) (q QueueInfo, created bool, err error)
	// DeleteQueue deletes the queue and its messages.
	DeleteQueue(name string) error
	// PurgeQueue drops the queue's ready messages and returns how many.
	PurgeQueue(name string) (purged uint64, err error)
}

// QueueRef reads one queue's live counters. The management API keeps
// one a queue between samples and compares them: a ref must stay the
// same value (comparable with ==) for the life of its queue, and a queue
// created again under the name of a deleted one must have another.
type QueueRef interface {
	// Counters returns the queue's figures now, as AppendQueues would,
	// except for the name, which it may leave empty (the caller knows
	// it). It must not block.
	Counters() QueueInfo
}

// NamedQueueRef is a queue's name with its ref.
type NamedQueueRef struct {
	Name string
	Ref  QueueRef
}

// QueueRefs is an optional interface of a [QueueSource] that lets the
// management API skip the walk over every queue while none was created
// or deleted: the sampler keeps a ref to each queue, in name order, and a
// listing reads their counters in that order. With 100,000 queues the
// walk over the broker's map is most of a listing's cost.
type QueueRefs interface {
	// QueueVersion returns a number that changes whenever a queue is
	// created or deleted: refs appended after reading version v are
	// every queue while QueueVersion returns v.
	QueueVersion() uint64
	// AppendQueueRefs appends every queue's name and ref to dst, in any
	// order, and returns it.
	AppendQueueRefs(dst []NamedQueueRef) []NamedQueueRef
}

// queueItem is a queue's figures with its ref (nil from a source
// without [QueueRefs]).
type queueItem struct {
	QueueInfo
	ref QueueRef
	// rep is the queue's replicas when it is replicated, else nil.
	rep *ReplicaInfo
}

// queueType is RabbitMQ's type of a queue: "quorum" for a replicated
// one, "classic" for the others.
func (it *queueItem) queueType() string {
	if it.rep != nil {
		return "quorum"
	}
	return "classic"
}

// queueRow is one queue in a listing.
type queueRow = row[string, queueItem]

var queueSchema = newSchema("name",
	nameField(func(r *queueRow) string { return r.item.Name }, func(r *queueRow) []byte { return r.e.quotedName() }),
	uintField("messages", func(r *queueRow) uint64 { return r.item.MessagesReady + r.item.MessagesUnacked }),
	uintField("messages_ready", func(r *queueRow) uint64 { return r.item.MessagesReady }),
	uintField("messages_unacknowledged", func(r *queueRow) uint64 { return r.item.MessagesUnacked }),
	intField("consumers", func(r *queueRow) int64 { return int64(r.item.Consumers) }),
	uintField("memory", func(r *queueRow) uint64 { return r.item.Memory }),
	uintField("message_stats.publish", func(r *queueRow) uint64 { return r.item.Publish }),
	rateField("message_stats.publish", func(r *queueRow) float64 { return r.e.rateOf(qPublish) }),
	uintField("message_stats.deliver", func(r *queueRow) uint64 { return r.item.Deliver }),
	rateField("message_stats.deliver", func(r *queueRow) float64 { return r.e.rateOf(qDeliver) }),
	uintField("message_stats.ack", func(r *queueRow) uint64 { return r.item.Ack }),
	rateField("message_stats.ack", func(r *queueRow) float64 { return r.e.rateOf(qAck) }),
	strField("type", func(r *queueRow) string { return r.item.queueType() }),
	strField("leader", func(r *queueRow) string {
		if r.item.rep == nil {
			return ""
		}
		return r.item.rep.Leader
	}),
	rawField("members", func(b []byte, r *queueRow) []byte {
		if r.item.rep == nil {
			return append(b, "[]"...)
		}
		return appendReplicaNodes(b, r.item.rep)
	}, func(r *queueRow) float64 { return float64(replicaCount(r)) }),
	rawField("online", func(b []byte, r *queueRow) []byte {
		if r.item.rep == nil {
			return append(b, "[]"...)
		}
		return appendOnline(b, r.item.rep)
	}, func(r *queueRow) float64 {
		if r.item.rep == nil {
			return 0
		}
		return float64(len(r.item.rep.Online()))
	}),
	rawField("replicas", func(b []byte, r *queueRow) []byte {
		if r.item.rep == nil {
			return append(b, "[]"...)
		}
		return appendReplicas(b, r.item.rep)
	}, func(r *queueRow) float64 { return float64(replicaCount(r)) }),
	strField("membership_change", func(r *queueRow) string {
		if r.item.rep == nil {
			return ""
		}
		return r.item.rep.Change
	}),
	strField("replica_error", func(r *queueRow) string {
		if r.item.rep == nil {
			return ""
		}
		return r.item.rep.Error
	}),
)

func replicaCount(r *queueRow) int {
	if r.item.rep == nil {
		return 0
	}
	return len(r.item.rep.Members)
}

// withReplicas sets the replicas of the replicated queues among rows
// and adds those this node does not serve (their leader's figures when
// it answered), sorted by name again.
func (s *Server) withReplicas(ctx context.Context, rows []queueRow) []queueRow {
	if s.cfg.Replicas == nil {
		return rows
	}
	reps := s.cfg.Replicas.ReplicatedQueues(ctx)
	if len(reps) == 0 {
		return rows
	}
	byName := make(map[string]*ReplicaInfo, len(reps))
	for i := range reps {
		byName[reps[i].Name] = &reps[i]
	}
	for i := range rows {
		if rep := byName[rows[i].item.Name]; rep != nil {
			rows[i].item.rep = rep
			delete(byName, rep.Name)
		}
	}
	if len(byName) == 0 {
		return rows
	}
	for _, rep := range byName {
		rows = append(rows, queueRow{item: remoteItem(rep)})
	}
	slices.SortFunc(rows, func(a, b queueRow) int { return strings.Compare(a.item.Name, b.item.Name) })
	return rows
}

// remoteItem is the row of a replicated queue served by another node.
func remoteItem(rep *ReplicaInfo) queueItem {
	it := queueItem{rep: rep}
	if rep.Counters != nil {
		it.QueueInfo = *rep.Counters
	}
	it.Name = rep.Name
	return it
}

func (s *Server) listQueues(w http.ResponseWriter, r *http.Request) {
	rows := s.smp.liveQueues(getQueueRows())
	rows = s.withReplicas(r.Context(), rows)
	serveList(w, r, queueSchema, rows, func(r *queueRow) string { return r.item.Name })
	putQueueRows(rows)
}

// queueRows recycles the rows of queue listings: 100,000 queues make
// 10 MB of rows, which a script polling every second would otherwise
// hand to the garbage collector every time.
var queueRows sync.Pool

func getQueueRows() []queueRow {
	if p, ok := queueRows.Get().(*[]queueRow); ok {
		return (*p)[:0]
	}
	return nil
}

func putQueueRows(rows []queueRow) {
	clear(rows) // keeps no deleted queue alive
	queueRows.Put(&rows)
}

func (s *Server) queue(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		var rep *ReplicaInfo
		if s.cfg.Replicas != nil {
			if info, ok := s.cfg.Replicas.ReplicatedQueue(r.Context(), name); ok {
				rep = &info
			}
		}
		var q QueueInfo
		ok := false
		if s.cfg.Queues != nil {
			q, ok = s.cfg.Queues.Queue(name)
		}
		switch {
		case ok:
			serveObject(w, r, queueSchema, &queueRow{item: queueItem{QueueInfo: q, rep: rep}, e: s.smp.queueEntry(name)}, http.StatusOK)
		case rep != nil:
			serveObject(w, r, queueSchema, &queueRow{item: remoteItem(rep)}, http.StatusOK)
		case s.cfg.Queues == nil:
			writeError(w, notFound("queue %q not found: this node has no queues yet", name))
		default:
			writeError(w, notFound("queue %q not found", name))
		}
	case http.MethodPut:
		var spec QueueSpec
		if err := readBody(r, &spec, true); err != nil {
			writeError(w, err)
			return
		}
		if s.cfg.Queues == nil {
			writeError(w, ErrNoQueues)
			return
		}
		spec.Declarer = s.declarer(r)
		q, created, err := s.cfg.Queues.CreateQueue(name, spec)
		if err != nil {
			writeError(w, err)
			return
		}
		status := http.StatusOK
		if created {
			status = http.StatusCreated
			s.log.Info("queue created through the management API", "queue", name)
		}
		serveObject(w, r, queueSchema, &queueRow{item: queueItem{QueueInfo: q}, e: s.smp.queueEntry(name)}, status)
	case http.MethodDelete:
		if s.cfg.Queues == nil {
			writeError(w, ErrNoQueues)
			return
		}
		if !s.permit(w, r, auth.Configure, "delete", queueExchange(name)) {
			return
		}
		if err := s.cfg.Queues.DeleteQueue(name); err != nil {
			writeError(w, err)
			return
		}
		s.log.Info("queue deleted through the management API", "queue", name)
		w.WriteHeader(http.StatusNoContent)
	default:
		methodNotAllowed(w, "GET, PUT, DELETE")
	}
}

// purgeQueue serves DELETE /api/queues/{name}/contents (RabbitMQ's purge).
func (s *Server) purgeQueue(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodDelete {
		methodNotAllowed(w, "DELETE")
		return
	}
	if s.cfg.Queues == nil {
		writeError(w, ErrNoQueues)
		return
	}
	name := r.PathValue("name")
	if !s.permit(w, r, auth.Read, "purge", queueExchange(name)) {
		return
	}
	n, err := s.cfg.Queues.PurgeQueue(name)
	if err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("queue purged through the management API", "queue", name, "messages", n)
	writeJSON(w, http.StatusOK, map[string]uint64{"message_count": n})
}

// readBody decodes a JSON object body into v, refusing unknown fields.
// An empty body is an empty object when emptyOK is set.
func readBody(r *http.Request, v any, emptyOK bool) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) && emptyOK {
			return nil
		}
		if errors.Is(err, io.EOF) {
			return badRequest("the body is empty: send a JSON object")
		}
		return badRequest("bad JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("bad JSON body: more than one JSON value")
	}
	return nil
}
