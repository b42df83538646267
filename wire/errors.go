package wire

import "fmt"

// Code is a stable error code carried by ERROR frames and by RESPONSE and
// ANSWER frames with [FlagError]. Codes never change meaning between
// versions; clients branch on them, never on the message text.
type Code uint16

// Error codes.
const (
	CodeOK              Code = 0
	CodeProtocol        Code = 1  // malformed frame or frame out of place
	CodeVersion         Code = 2  // no protocol version in common
	CodeFrameTooLarge   Code = 3  // frame over the negotiated maximum
	CodeNotFound        Code = 4  // unknown exchange, attachment or member
	CodeClash           Code = 5  // exchange exists with another pattern or options
	CodeBadOptions      Code = 6  // invalid exchange config, pattern or expression
	CodeNoHandler       Code = 7  // no handler able to take the request
	CodeTimeout         Code = 8  // the request's deadline passed
	CodeCancelled       Code = 9  // the requester cancelled
	CodeRejected        Code = 10 // refused by a routing function or controller
	CodeHandlerGone     Code = 11 // the handler detached or its connection closed
	CodeInternal        Code = 12 // a bug in the broker; see its log
	CodeNotAllowed      Code = 13 // operation does not fit the exchange or role
	CodeLimit           Code = 14 // a configured limit was reached
	CodeHeartbeat       Code = 15 // no traffic within the heartbeat timeout
	CodeShutdown        Code = 16 // the server is shutting down
	CodeUnauthorized    Code = 17 // bad credentials or missing permission
	CodeApplication     Code = 18 // the handler failed the request
	CodeSlowConsumer    Code = 19 // messages dropped for a subscriber that fell behind
	CodeExchangeDeleted Code = 20 // the exchange of an attachment was deleted
	// Limits: each refuses one operation or connection and nothing else.
	CodeTooManyConns       Code = 21 // the node's or the user's connection limit
	CodeTooManyAttachments Code = 22 // the connection's attachment limit
	CodeTooManyInflight    Code = 23 // the connection's limit of requests in flight
	CodeDeadlineTooLong    Code = 24 // a request's deadline over the server's maximum
	CodeQueueFull          Code = 25 // a task queue at its max_length or max_bytes refused a submit
	CodeTooManyPatterns    Code = 26 // the attachment's or the connection's limit of subscription patterns
	CodeExprLimit          Code = 27 // a routing expression went over its cost, memory or time budget
	CodeHandshakeLimit     Code = 28 // too many connections still in their handshake (node-wide or from one address)
	CodeUnavailable        Code = 29 // the cluster could not do it now (no quorum for its metadata); try again
	CodeStorage            Code = 30 // the store failed: the message may not be durable
	CodeNotLeader          Code = 31 // node link only: the member is no longer the leader the request was routed to
)

var codeNames = [...]string{
	CodeOK: "ok", CodeProtocol: "protocol error", CodeVersion: "unsupported version",
	CodeFrameTooLarge: "frame too large", CodeNotFound: "not found", CodeClash: "clash",
	CodeBadOptions: "bad options", CodeNoHandler: "no handler", CodeTimeout: "timeout",
	CodeCancelled: "cancelled", CodeRejected: "rejected", CodeHandlerGone: "handler gone",
	CodeInternal: "internal error", CodeNotAllowed: "not allowed", CodeLimit: "limit reached",
	CodeHeartbeat: "heartbeat timeout", CodeShutdown: "shutting down",
	CodeUnauthorized: "unauthorized", CodeApplication: "application error",
	CodeSlowConsumer: "slow consumer", CodeExchangeDeleted: "exchange deleted",
	CodeTooManyConns: "too many connections", CodeTooManyAttachments: "too many attachments",
	CodeTooManyInflight: "too many requests in flight", CodeDeadlineTooLong: "deadline too long",
	CodeQueueFull: "queue full", CodeTooManyPatterns: "too many patterns",
	CodeExprLimit: "expression limit", CodeHandshakeLimit: "too many handshakes",
	CodeUnavailable: "unavailable",
	CodeStorage:     "storage error", CodeNotLeader: "not leader",
}

// String returns the short name of c, such as "no handler".
func (c Code) String() string {
	if int(c) < len(codeNames) && codeNames[c] != "" {
		return codeNames[c]
	}
	return fmt.Sprintf("code %d", uint16(c))
}

// Error is a protocol error: a stable Code and a human message.
type Error struct {
	Code  Code
	Msg   string
	Fatal bool // the connection closes after it
}

// Error returns "courier: <code name>: <message>".
func (e *Error) Error() string {
	if e.Msg == "" {
		return "courier: " + e.Code.String()
	}
	return "courier: " + e.Code.String() + ": " + e.Msg
}

// IsLimit reports whether c says a configured limit was reached: code 14
// or one of the specific limit codes from 21 to 28.
func (c Code) IsLimit() bool {
	return c == CodeLimit || c >= CodeTooManyConns && c <= CodeHandshakeLimit
}

// Is makes errors.Is match any *Error with the same Code. A target with
// [CodeLimit] also matches the specific limit codes (see [Code.IsLimit]).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.Msg != "" && t.Msg != e.Msg {
		return false
	}
	return t.Code == e.Code || t.Code == CodeLimit && e.Code.IsLimit()
}

// Errorf returns an *Error with code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}
