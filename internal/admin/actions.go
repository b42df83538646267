package admin

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/wire"
)

// The dashboard's actions, in the shape of RabbitMQ's management API:
//
//	POST   /api/exchanges/{name}/publish   publish a message (needs write on the exchange)
//	POST   /api/queues/{name}/get          peek at the messages next in line (needs read on the queue)
//	DELETE /api/queues/{name}/contents     purge (needs read on the queue; queues.go)
//	DELETE /api/queues/{name}              delete (needs configure on the queue; queues.go)
//	DELETE /api/connections/{id}           close a network connection
//
// Besides the administrator tag that every change needs (access.go), each
// is checked against the permissions of the user who asks, as the same
// operation on the wire would be: an administrator whose permissions do
// not cover an exchange cannot publish to it from the dashboard either.

// PeekedMessage is a message shown by POST /api/queues/{name}/get, left
// in its queue.
type PeekedMessage struct {
	ID       uint64
	Body     []byte
	Headers  map[string]string
	Key      string
	Priority uint8
	// Attempts counts the failed attempts so far.
	Attempts uint32
	Enqueued time.Time
}

// QueuePeeker is an optional interface of a [QueueSource]: without it,
// POST /api/queues/{name}/get answers 501.
type QueuePeeker interface {
	// PeekQueue returns up to n of the messages next in line for
	// delivery, without delivering them or counting an attempt. Errors
	// that are a [*wire.Error] keep their meaning (CodeNotFound is 404).
	PeekQueue(name string, n int) ([]PeekedMessage, error)
}

// Bounds of POST /api/queues/{name}/get.
const (
	maxGetCount    = 100      // messages a get returns at most
	maxGetTruncate = 1 << 20  // bytes of one payload shown at most
	defGetTruncate = 50 << 10 // bytes of one payload shown unless asked
	maxGetTotal    = 16 << 20 // bytes of payload in one answer at most
	publishWait    = 10 * time.Second
)

// permit answers 403 unless the request's user has perm on name. It is
// true on a node without users, where the API is open (loopback only).
func (s *Server) permit(w http.ResponseWriter, r *http.Request, perm auth.Perm, op, name string) bool {
	by := s.declarer(r)
	if by.Policy == nil || by.Policy.Perms(by.User, name)&perm != 0 {
		return true
	}
	s.log.Warn("management API: permission denied", "user", by.User, "op", op, "need", perm.String(), "name", name)
	writeError(w, &apiError{http.StatusForbidden, "access_refused",
		fmt.Sprintf("access refused: user %q has no %s permission on %q, which %s needs", by.User, perm, name, op)})
	return false
}

// queueExchange is the exchange whose permissions cover a queue: a task
// exchange's queue bears its name, a durable subscription's is
// "exchange/subscription".
func queueExchange(queue string) string {
	if i := strings.IndexByte(queue, '/'); i > 0 {
		return queue[:i]
	}
	return queue
}

// publishBody is the body of POST /api/exchanges/{name}/publish, as
// RabbitMQ's: {"routing_key": "eu.fr", "payload": "hello",
// "payload_encoding": "string", "properties": {"headers": {...}}}.
type publishBody struct {
	RoutingKey      string `json:"routing_key"`
	Payload         string `json:"payload"`
	PayloadEncoding string `json:"payload_encoding"`
	Properties      struct {
		Headers  map[string]string `json:"headers"`
		Priority int               `json:"priority"`
		// DeliveryMode is accepted for RabbitMQ's clients and ignored:
		// a task exchange's durability is the exchange's.
		DeliveryMode int `json:"delivery_mode"`
	} `json:"properties"`
}

// publish serves POST /api/exchanges/{name}/publish. On a pub-sub
// exchange it publishes and answers {"routed": true} when a subscriber
// matched the key; on a task exchange it submits a task, waits for its
// confirm (stored, on a durable exchange) and answers {"routed": true,
// "id": task id}. A request-response exchange answers 409.
func (s *Server) publish(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, "POST")
		return
	}
	name := r.PathValue("name")
	var body publishBody
	if err := readBody(r, &body, false); err != nil {
		writeError(w, err)
		return
	}
	payload, err := decodePayload(body.Payload, body.PayloadEncoding)
	if err != nil {
		writeError(w, err)
		return
	}
	if p := body.Properties.Priority; p < 0 || p > 9 {
		writeError(w, badRequest("properties.priority %d: want 0 to 9", p))
		return
	}
	if !s.permit(w, r, auth.Write, "publish", name) {
		return
	}
	ex := s.b.Exchange(name)
	if ex == nil {
		writeError(w, notFound("exchange %q not found", name))
		return
	}
	f := wire.NewFrame(wire.TypePublish)
	f.Name, f.Key, f.Header, f.Body, f.Flags, f.Ref = name, body.RoutingKey, body.Properties.Headers, payload, wire.FlagReply, 1
	routes := 0
	switch ex.Config().Pattern {
	case wire.PatternPubSub:
		routes = ex.Routes(body.RoutingKey)
	case wire.PatternTasks:
		f.Type, f.Aux = wire.TypeSubmit, uint64(body.Properties.Priority)
		routes = 1
	default:
		f.Release()
		writeError(w, &apiError{http.StatusConflict, "not_allowed",
			fmt.Sprintf("exchange %q is %s: publish needs a pub-sub or a task exchange (send requests with `courier req`)", name, ex.Config().Pattern)})
		return
	}
	submit := f.Type == wire.TypeSubmit // f is the broker's once handed over
	reply, err := s.roundTrip(r, f)
	if err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("message published through the management API", "exchange", name, "key", body.RoutingKey, "bytes", len(payload), "by", requester(r))
	out := map[string]any{"routed": routes > 0}
	if submit {
		out["id"] = reply.Aux
	}
	reply.Release()
	writeJSON(w, http.StatusOK, out)
}

// decodePayload decodes a payload in RabbitMQ's encodings, "string" (the
// default) or "base64".
func decodePayload(p, enc string) ([]byte, error) {
	switch enc {
	case "", "string":
		return []byte(p), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(p)
		if err != nil {
			return nil, badRequest("payload: bad base64: %v", err)
		}
		return b, nil
	}
	return nil, badRequest("payload_encoding %q: want \"string\" or \"base64\"", enc)
}

// replySink keeps the first OK or ERROR a session answers.
type replySink struct{ ch chan *wire.Frame }

func (rs replySink) Deliver(f *wire.Frame) {
	if f.Type == wire.TypeOK || f.Type == wire.TypeError {
		select {
		case rs.ch <- f:
			return
		default:
		}
	}
	f.Release()
}

// roundTrip hands f to a broker session of the request's user, opened
// for it, and waits for the answer (at most publishWait, or until the
// client goes): the operation is checked and routed exactly as a
// client's would be. A task queue whose flow control holds publishers
// (memory or disk alarm) answers 503 rather than wait.
func (s *Server) roundTrip(r *http.Request, f *wire.Frame) (*wire.Frame, error) {
	by := s.declarer(r)
	sink := replySink{ch: make(chan *wire.Frame, 1)}
	sess := s.b.OpenAs(sink, "management", by.User, by.Policy)
	defer sess.Close()
	if name := f.Name; f.Type == wire.TypeSubmit && sess.SubmitPressure(name) >= 1 {
		f.Release()
		return nil, &apiError{http.StatusServiceUnavailable, "flow_control",
			fmt.Sprintf("queue %q holds its publishers (memory or disk alarm): try again later", name)}
	}
	sess.Handle(f)
	ctx, cancel := context.WithTimeout(r.Context(), publishWait)
	defer cancel()
	select {
	case reply := <-sink.ch:
		if reply.Type == wire.TypeError {
			err := &wire.Error{Code: wire.Code(reply.Aux), Msg: reply.Tag}
			reply.Release()
			return nil, err
		}
		return reply, nil
	case <-ctx.Done():
		return nil, &apiError{http.StatusGatewayTimeout, "timeout", "no confirm from the broker within " + publishWait.String()}
	}
}

// getBody is the body of POST /api/queues/{name}/get, as RabbitMQ's:
// {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto",
// "truncate": 50000}.
type getBody struct {
	Count    int    `json:"count"`
	Ackmode  string `json:"ackmode"`
	Encoding string `json:"encoding"`
	Truncate int    `json:"truncate"`
}

// gotMessage is one message of a get's answer, in RabbitMQ's shape.
type gotMessage struct {
	PayloadBytes    int    `json:"payload_bytes"`
	Redelivered     bool   `json:"redelivered"`
	Exchange        string `json:"exchange"`
	RoutingKey      string `json:"routing_key"`
	MessageCount    int    `json:"message_count"`
	Properties      props  `json:"properties"`
	Payload         string `json:"payload"`
	PayloadEncoding string `json:"payload_encoding"`
	Truncated       bool   `json:"truncated,omitempty"`
}

type props struct {
	MessageID string            `json:"message_id"`
	Priority  uint8             `json:"priority"`
	Timestamp int64             `json:"timestamp"` // seconds, as AMQP's
	Headers   map[string]string `json:"headers"`
	Attempts  uint32            `json:"attempts"`
}

// getMessages serves POST /api/queues/{name}/get. It only peeks: the
// messages stay in the queue, in their place, and no attempt is counted
// (RabbitMQ's "ack_requeue_true" and "reject_requeue_true", which in
// RabbitMQ also mark them redelivered). Taking messages out is a
// consumer's work, or a purge's.
func (s *Server) getMessages(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, "POST")
		return
	}
	name := r.PathValue("name")
	body := getBody{Count: 1, Ackmode: "ack_requeue_true", Encoding: "auto", Truncate: defGetTruncate}
	if err := readBody(r, &body, true); err != nil {
		writeError(w, err)
		return
	}
	switch {
	case body.Count < 1 || body.Count > maxGetCount:
		writeError(w, badRequest("count %d: want 1 to %d", body.Count, maxGetCount))
		return
	case body.Ackmode != "ack_requeue_true" && body.Ackmode != "reject_requeue_true":
		writeError(w, badRequest("ackmode %q: only ack_requeue_true (peek) is served; the messages stay in the queue. Consume them with a worker, or purge the queue", body.Ackmode))
		return
	case body.Encoding != "auto" && body.Encoding != "base64":
		writeError(w, badRequest("encoding %q: want \"auto\" or \"base64\"", body.Encoding))
		return
	case body.Truncate < 0:
		writeError(w, badRequest("truncate %d: want 0 (the default, %d bytes) or more", body.Truncate, defGetTruncate))
		return
	}
	if body.Truncate == 0 || body.Truncate > maxGetTruncate {
		body.Truncate = min(max(body.Truncate, defGetTruncate), maxGetTruncate)
	}
	peeker, ok := s.cfg.Queues.(QueuePeeker)
	if !ok {
		writeError(w, ErrNoQueues)
		return
	}
	if !s.permit(w, r, auth.Read, "get", queueExchange(name)) {
		return
	}
	msgs, err := peeker.PeekQueue(name, body.Count)
	if err != nil {
		writeError(w, err)
		return
	}
	q, _ := s.cfg.Queues.Queue(name)
	writeJSON(w, http.StatusOK, gotMessages(name, msgs, body, int(q.MessagesReady)))
}

// gotMessages renders peeked messages, within maxGetTotal bytes of
// payload.
func gotMessages(queue string, msgs []PeekedMessage, body getBody, ready int) []gotMessage {
	out := make([]gotMessage, 0, len(msgs))
	total := 0
	for i, m := range msgs {
		p := m.Body
		limit := min(body.Truncate, maxGetTotal-total)
		if limit <= 0 {
			break
		}
		g := gotMessage{
			PayloadBytes: len(p), Redelivered: m.Attempts > 0, Exchange: queue, RoutingKey: m.Key,
			MessageCount: max(ready-i-1, 0),
			Properties: props{MessageID: fmt.Sprint(m.ID), Priority: m.Priority, Timestamp: m.Enqueued.Unix(),
				Headers: m.Headers, Attempts: m.Attempts},
		}
		if len(p) > limit {
			p, g.Truncated = p[:limit], true
		}
		total += len(p)
		if body.Encoding == "auto" && utf8.Valid(p) {
			g.Payload, g.PayloadEncoding = string(p), "string"
		} else {
			g.Payload, g.PayloadEncoding = base64.StdEncoding.EncodeToString(p), "base64"
		}
		if g.Properties.Headers == nil {
			g.Properties.Headers = map[string]string{}
		}
		out = append(out, g)
	}
	return out
}

// closeConnection serves DELETE /api/connections/{id}: the client gets
// CLOSE with code 0 and a reason naming who closed it (the optional
// X-Reason header, as RabbitMQ's, is added), then its connection ends and
// the broker cleans up after it (its attachments leave, requests it made
// are cancelled). An in-process connection belongs to the program that
// opened it and answers 409.
func (s *Server) closeConnection(w http.ResponseWriter, r *http.Request, sess *broker.Session) {
	reason := "closed by " + requester(r) + " through the management API"
	if x := r.Header.Get("X-Reason"); x != "" {
		if len(x) > 200 {
			x = x[:200]
		}
		reason += ": " + x
	}
	if s.cfg.CloseConn == nil {
		writeError(w, &apiError{http.StatusNotImplemented, "not_implemented", "this node's management API cannot close connections"})
		return
	}
	if !s.cfg.CloseConn(sess.Sink(), reason) {
		writeError(w, &apiError{http.StatusConflict, "not_allowed",
			fmt.Sprintf("connection %s is in-process (embedded): the program that opened it closes it", sess.ID())})
		return
	}
	s.log.Info("connection closed through the management API", "connection", sess.ID(), "name", sess.Name(), "by", requester(r))
	w.WriteHeader(http.StatusNoContent)
}
