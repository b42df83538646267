package amqp

import (
	"errors"
	"fmt"
)

// Reply codes of AMQP 0-9-1 (and RabbitMQ's use of them). Codes of 400 and
// below close a channel; 500 and above close the connection, except where
// [Error.Hard] says otherwise.
const (
	ReplySuccess       = 200
	ContentTooLarge    = 311
	NoRoute            = 312
	NoConsumers        = 313
	ConnectionForced   = 320
	InvalidPath        = 402
	AccessRefused      = 403
	NotFound           = 404
	ResourceLocked     = 405
	PreconditionFailed = 406
	FrameError         = 501
	SyntaxError        = 502
	CommandInvalid     = 503
	ChannelError       = 504
	UnexpectedFrame    = 505
	ResourceError      = 506
	NotAllowed         = 530
	NotImplemented     = 540
	InternalError      = 541
)

// Error is an AMQP exception: the reply code and text sent in channel.close
// or connection.close, and the class and method that caused it (0 when no
// method did).
type Error struct {
	Code     uint16
	Text     string
	ClassID  uint16
	MethodID uint16
	// Cause is the codec sentinel or other error behind the exception, if
	// any; it is not sent to the peer.
	Cause error
}

// Unwrap returns the cause, so that errors.Is finds the codec sentinels.
func (e *Error) Unwrap() error { return e.Cause }

// Error implements error.
func (e *Error) Error() string {
	return fmt.Sprintf("amqp %d: %s", e.Code, e.Text)
}

// Hard reports whether the error closes the whole connection rather than
// one channel: codes 320 and 402, and 500 and above, are connection errors
// in AMQP 0-9-1.
func (e *Error) Hard() bool {
	return e.Code >= 500 || e.Code == ConnectionForced || e.Code == InvalidPath
}

// Errorf returns an [*Error] with the code and a formatted text.
func Errorf(code uint16, format string, args ...any) *Error {
	return &Error{Code: code, Text: fmt.Sprintf(format, args...)}
}

// AsError returns err as an [*Error] when it is one (possibly wrapped), and
// otherwise an internal error (541) that carries err's text.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: InternalError, Text: err.Error()}
}

// Sentinels of the codec. Each is also reported inside an [*Error] with its
// AMQP reply code; test for them with errors.Is on the error's cause.
var (
	// ErrShort is returned when a method or header ends before its fields.
	ErrShort = errors.New("amqp: payload too short")
	// ErrTrailing is returned when a method or header has bytes after its
	// last field.
	ErrTrailing = errors.New("amqp: bytes after the last field")
	// ErrTableDepth is returned when field tables or arrays nest deeper
	// than MaxTableDepth.
	ErrTableDepth = errors.New("amqp: field tables nested too deep")
	// ErrFieldType is returned for a field value type this codec does not
	// know.
	ErrFieldType = errors.New("amqp: unknown field value type")
	// ErrShortString is returned when a short string longer than 255
	// octets is to be encoded.
	ErrShortString = errors.New("amqp: short string longer than 255 octets")
	// ErrValueType is returned when a table value of an unsupported Go type
	// is to be encoded.
	ErrValueType = errors.New("amqp: table value of unsupported Go type")
	// ErrFrameTooLarge is returned when a frame exceeds the negotiated
	// frame_max.
	ErrFrameTooLarge = errors.New("amqp: frame larger than frame_max")
	// ErrUnknownMethod is returned for a class and method id pair that is
	// not part of AMQP 0-9-1.
	ErrUnknownMethod = errors.New("amqp: unknown method")
)

// Sentinels of the server.
var (
	// ErrServerClosed is returned by [Server.Serve] after
	// [Server.Shutdown].
	ErrServerClosed = errors.New("amqp: server closed")
	// ErrListen is wrapped by the error of [Server.Listen], with the
	// cause (such as syscall.EADDRINUSE).
	ErrListen = errors.New("amqp: cannot listen")
	// ErrConfig is wrapped by the errors of [Config.Validate].
	ErrConfig = errors.New("amqp: bad configuration")
)
