package admin

import (
	"net/http"
	"time"

	"github.com/courier-mq/courier/internal/broker"
)

// ConnEnds count the network connections that ended otherwise than by
// the client's CLOSE or the server's, since the node started: a
// subscriber's connection among them lost what was sent to it
// meanwhile, reconnected or not.
type ConnEnds struct {
	// Heartbeat: cut, nothing came from the client for three heartbeats.
	Heartbeat uint64
	// SlowConsumer: cut, the client did not read for the slow-consumer
	// timeout.
	SlowConsumer uint64
	// Vanished: the client closed or reset the socket without CLOSE (a
	// process that died, or a client that gave up on the connection to
	// reconnect).
	Vanished uint64
}

// ConnInfo is what a connection's transport knows of its peer.
type ConnInfo struct {
	// Type is "network" for a client of the server and "embedded" for an
	// in-process connection.
	Type string
	// Protocol is the protocol of the connection: "courier" (network or
	// embedded) or "amqp" (AMQP 0-9-1, docs/amqp.md).
	Protocol string
	// Transport is what a network client's frames travel on: "tcp" (TLS
	// or not) or "websocket"; "" when embedded.
	Transport string
	// Peer is the client's address, "host:port"; "" when embedded.
	Peer string
	// User is the authenticated user; on a node without users, the name
	// a network client gave in its HELLO.
	User string
	// ConnectedAt is when the connection opened.
	ConnectedAt time.Time
	// SendPending is how many bytes wait to be written to a network
	// client; SendBlocked how long the write in progress has lasted.
	SendPending int
	SendBlocked time.Duration
}

// connRow is one connection (a broker session) in a listing.
type connRow struct {
	row[*broker.Session, *broker.Session]
	describe func(broker.Sink) (ConnInfo, bool)
	info     *ConnInfo // filled on first use
}

func (r *connRow) conn() *ConnInfo {
	if r.info == nil {
		r.info = &ConnInfo{Type: "embedded", Protocol: "courier"}
		if r.describe != nil {
			if ci, ok := r.describe(r.item.Sink()); ok {
				r.info = &ci
			}
		}
	}
	return r.info
}

var connSchema = newSchema("id",
	&field[connRow]{path: "id",
		enc: func(b []byte, r *connRow) []byte { return appendString(b, r.item.ID()) },
		num: func(r *connRow) float64 { return float64(r.item.Number()) }},
	strField("name", func(r *connRow) string { return r.item.Name() }),
	strField("type", func(r *connRow) string { return r.conn().Type }),
	strField("protocol", func(r *connRow) string { return r.conn().Protocol }),
	strField("transport", func(r *connRow) string { return r.conn().Transport }),
	strField("peer", func(r *connRow) string { return r.conn().Peer }),
	strField("user", func(r *connRow) string { return r.conn().User }),
	intField("connected_at", func(r *connRow) int64 {
		if t := r.conn().ConnectedAt; !t.IsZero() {
			return t.UnixMilli()
		}
		return 0
	}),
	intField("send_pending", func(r *connRow) int64 { return int64(r.conn().SendPending) }),
	intField("send_blocked_ms", func(r *connRow) int64 { return r.conn().SendBlocked.Milliseconds() }),
	intField("attachments", func(r *connRow) int64 { return int64(r.item.Attachments()) }),
	intField("patterns", func(r *connRow) int64 { return r.item.Patterns() }),
	intField("inflight", func(r *connRow) int64 { return r.item.Inflight() }),
	uintField("message_stats.request", func(r *connRow) uint64 { return r.item.Stats().Requests.Load() }),
	rateField("message_stats.request", func(r *connRow) float64 { return r.e.rateOf(connRequests) }),
	uintField("message_stats.publish", func(r *connRow) uint64 { return r.item.Stats().Publishes.Load() }),
	rateField("message_stats.publish", func(r *connRow) float64 { return r.e.rateOf(connPublishes) }),
	uintField("message_stats.deliver", func(r *connRow) uint64 { return r.item.Stats().Delivered.Load() }),
	rateField("message_stats.deliver", func(r *connRow) float64 { return r.e.rateOf(connDelivered) }),
	uintField("message_stats.response", func(r *connRow) uint64 { return r.item.Stats().Responses.Load() }),
	rateField("message_stats.response", func(r *connRow) float64 { return r.e.rateOf(connResponses) }),
)

func (s *Server) listConnections(w http.ResponseWriter, r *http.Request) {
	live := s.smp.liveConns()
	rows := make([]connRow, len(live))
	for i, l := range live {
		rows[i] = connRow{row: l, describe: s.cfg.Describe}
	}
	serveList(w, r, connSchema, rows, func(r *connRow) string { return r.item.Name() })
}

func (s *Server) connection(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodDelete {
		methodNotAllowed(w, "GET, DELETE")
		return
	}
	id := r.PathValue("id")
	if node := r.PathValue("node"); node != "" {
		id = node + "/" + id
	}
	sess := s.b.SessionByID(id)
	if sess == nil {
		writeError(w, notFound("connection %q not found", id))
		return
	}
	if r.Method == http.MethodDelete {
		s.closeConnection(w, r, sess)
		return
	}
	row := connRow{row: row[*broker.Session, *broker.Session]{item: sess, e: s.smp.connEntry(sess)}, describe: s.cfg.Describe}
	serveObject(w, r, connSchema, &row, http.StatusOK)
}
