package admin

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/courier-mq/courier/wire"
)

// ErrListen wraps the error of a management listener that could not be
// opened, so that callers can tell it from other start-up failures.
var ErrListen = errors.New("admin: cannot listen")

// ErrNoQueues is the error of queue operations on a node without a queue
// layer ([Config.Queues] is nil).
var ErrNoQueues = errors.New("admin: this node has no queue layer yet")

// apiError is an error answered to an HTTP client as
// {"error": code, "reason": reason}, in the style of RabbitMQ's API.
type apiError struct {
	status int    // HTTP status
	code   string // short stable word: "not_found", "bad_request", ...
	reason string // for people
}

func (e *apiError) Error() string { return e.code + ": " + e.reason }

func badRequest(format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, "bad_request", fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *apiError {
	return &apiError{http.StatusNotFound, "not_found", fmt.Sprintf(format, args...)}
}

// asAPIError maps an error of the broker or the queue layer to its HTTP
// form: wire error codes to statuses, anything else to 500.
func asAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	if errors.Is(err, ErrNoQueues) {
		return &apiError{http.StatusNotImplemented, "not_implemented",
			"queues are not available on this node yet: the queue layer is not part of this build, so queues cannot be created, deleted or purged"}
	}
	var we *wire.Error
	if errors.As(err, &we) {
		switch we.Code {
		case wire.CodeNotFound, wire.CodeExchangeDeleted:
			return &apiError{http.StatusNotFound, "not_found", we.Msg}
		case wire.CodeClash:
			return &apiError{http.StatusConflict, "conflict", we.Msg}
		case wire.CodeBadOptions, wire.CodeProtocol:
			return &apiError{http.StatusBadRequest, "bad_request", we.Msg}
		case wire.CodeNotAllowed:
			return &apiError{http.StatusConflict, "not_allowed", we.Msg}
		case wire.CodeUnauthorized:
			return &apiError{http.StatusForbidden, "access_refused", we.Msg}
		case wire.CodeLimit, wire.CodeTooManyConns, wire.CodeTooManyAttachments, wire.CodeTooManyInflight, wire.CodeDeadlineTooLong, wire.CodeTooManyPatterns:
			return &apiError{http.StatusTooManyRequests, "limit", we.Msg}
		case wire.CodeTimeout:
			return &apiError{http.StatusGatewayTimeout, "timeout", we.Msg}
		case wire.CodeShutdown:
			return &apiError{http.StatusServiceUnavailable, "shutting_down", we.Msg}
		}
		return &apiError{http.StatusInternalServerError, "internal_error", we.Msg}
	}
	return &apiError{http.StatusInternalServerError, "internal_error", err.Error()}
}
