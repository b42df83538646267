package server

import (
	"time"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/wire"
)

// ConnInfo is what the server knows of one network connection, for the
// management API.
type ConnInfo struct {
	// Protocol is the transport: "tcp" (TLS or not) or "websocket".
	Protocol string
	// Peer is the client's address, "host:port".
	Peer string
	// Local is the server address the connection came in on.
	Local string
	// User is the authenticated user when the server has users; without
	// users, the name the client gave in HELLO ("" for none).
	User string
	// ConnectedAt is when the connection was accepted.
	ConnectedAt time.Time
	// SendPending is how many bytes wait to be written to the client,
	// beside a write in progress (RabbitMQ's send_pend).
	SendPending int
	// SendBlocked is how long the write in progress has lasted: a client
	// that does not read holds it up to the slow-consumer timeout.
	SendBlocked time.Duration
}

// Describe returns what the server knows of the network connection
// behind sink, the [broker.Sink] of a session that a Server opened
// (see [broker.Session.Sink]); ok is false for any other sink, such as an
// in-process connection's. It reads only fields fixed when the connection
// was accepted, and the outbox's length under its lock.
func Describe(sink broker.Sink) (info ConnInfo, ok bool) {
	c, ok := sink.(*conn)
	if !ok {
		return ConnInfo{}, false
	}
	return ConnInfo{Protocol: c.proto, Peer: c.peer, Local: c.nc.LocalAddr().String(), User: c.user, ConnectedAt: c.opened,
		SendPending: c.out.Pending(), SendBlocked: c.out.Blocked()}, true
}

// Close ends the network connection behind sink, as [Describe] finds it:
// the client gets CLOSE with code 0 and reason, then the socket closes
// (after at most a second of last writes). It returns false for any
// other sink.
func Close(sink broker.Sink, reason string) bool {
	c, ok := sink.(*conn)
	if !ok {
		return false
	}
	c.fail(&wire.Error{Code: wire.CodeOK, Msg: reason}, true)
	return true
}
