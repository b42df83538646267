package amqp

import (
	"fmt"
	"time"
)

// Property flags of the basic class, in the order of the content header.
const (
	flagContentType     = 1 << 15
	flagContentEncoding = 1 << 14
	flagHeaders         = 1 << 13
	flagDeliveryMode    = 1 << 12
	flagPriority        = 1 << 11
	flagCorrelationID   = 1 << 10
	flagReplyTo         = 1 << 9
	flagExpiration      = 1 << 8
	flagMessageID       = 1 << 7
	flagTimestamp       = 1 << 6
	flagType            = 1 << 5
	flagUserID          = 1 << 4
	flagAppID           = 1 << 3
	flagClusterID       = 1 << 2
	flagContinuation    = 1 << 0
)

// Properties are the basic class's content properties. A zero value (empty
// string, nil table, 0, zero time) is absent from the header, as in
// RabbitMQ's clients.
type Properties struct {
	ContentType     string
	ContentEncoding string
	Headers         Table
	DeliveryMode    uint8 // 1 transient, 2 persistent
	Priority        uint8
	CorrelationID   string
	ReplyTo         string
	Expiration      string // per-message TTL in milliseconds, as a decimal string
	MessageID       string
	Timestamp       time.Time
	Type            string
	UserID          string
	AppID           string
	ClusterID       string
}

// Header is a decoded content header frame.
type Header struct {
	ClassID    uint16
	BodySize   uint64
	Properties Properties
}

// DecodeHeader decodes a content header frame's payload. Errors are
// [*Error] with code 502 (syntax error).
func DecodeHeader(p []byte) (Header, error) {
	d := decoder{b: p}
	var h Header
	h.ClassID = d.short()
	d.short() // weight, always 0
	h.BodySize = d.longlong()
	flags := d.short()
	// Continuation words name properties the basic class does not have.
	for w := flags; w&flagContinuation != 0 && d.err == nil; {
		w = d.short()
		if w&^flagContinuation != 0 {
			d.fail(fmt.Errorf("%w: property flags beyond the basic class", ErrFieldType))
		}
	}
	pr := &h.Properties
	if flags&flagContentType != 0 {
		pr.ContentType = d.shortstr()
	}
	if flags&flagContentEncoding != 0 {
		pr.ContentEncoding = d.shortstr()
	}
	if flags&flagHeaders != 0 {
		pr.Headers = d.table()
	}
	if flags&flagDeliveryMode != 0 {
		pr.DeliveryMode = d.octet()
	}
	if flags&flagPriority != 0 {
		pr.Priority = d.octet()
	}
	if flags&flagCorrelationID != 0 {
		pr.CorrelationID = d.shortstr()
	}
	if flags&flagReplyTo != 0 {
		pr.ReplyTo = d.shortstr()
	}
	if flags&flagExpiration != 0 {
		pr.Expiration = d.shortstr()
	}
	if flags&flagMessageID != 0 {
		pr.MessageID = d.shortstr()
	}
	if flags&flagTimestamp != 0 {
		pr.Timestamp = time.Unix(int64(d.longlong()), 0).UTC()
	}
	if flags&flagType != 0 {
		pr.Type = d.shortstr()
	}
	if flags&flagUserID != 0 {
		pr.UserID = d.shortstr()
	}
	if flags&flagAppID != 0 {
		pr.AppID = d.shortstr()
	}
	if flags&flagClusterID != 0 {
		pr.ClusterID = d.shortstr()
	}
	if err := d.done(); err != nil {
		return Header{}, &Error{Code: SyntaxError, Text: "malformed content header: " + err.Error(), Cause: err}
	}
	return h, nil
}

// appendHeaderPayload appends a content header payload for class basic.
func appendHeaderPayload(b []byte, bodySize uint64, pr *Properties) ([]byte, error) {
	e := encoder{b: b}
	e.short(ClassBasic)
	e.short(0)
	e.longlong(bodySize)
	var flags uint16
	if pr.ContentType != "" {
		flags |= flagContentType
	}
	if pr.ContentEncoding != "" {
		flags |= flagContentEncoding
	}
	if pr.Headers != nil {
		flags |= flagHeaders
	}
	if pr.DeliveryMode != 0 {
		flags |= flagDeliveryMode
	}
	if pr.Priority != 0 {
		flags |= flagPriority
	}
	if pr.CorrelationID != "" {
		flags |= flagCorrelationID
	}
	if pr.ReplyTo != "" {
		flags |= flagReplyTo
	}
	if pr.Expiration != "" {
		flags |= flagExpiration
	}
	if pr.MessageID != "" {
		flags |= flagMessageID
	}
	if !pr.Timestamp.IsZero() {
		flags |= flagTimestamp
	}
	if pr.Type != "" {
		flags |= flagType
	}
	if pr.UserID != "" {
		flags |= flagUserID
	}
	if pr.AppID != "" {
		flags |= flagAppID
	}
	if pr.ClusterID != "" {
		flags |= flagClusterID
	}
	e.short(flags)
	if flags&flagContentType != 0 {
		e.shortstr(pr.ContentType)
	}
	if flags&flagContentEncoding != 0 {
		e.shortstr(pr.ContentEncoding)
	}
	if flags&flagHeaders != 0 {
		e.table(pr.Headers)
	}
	if flags&flagDeliveryMode != 0 {
		e.octet(pr.DeliveryMode)
	}
	if flags&flagPriority != 0 {
		e.octet(pr.Priority)
	}
	if flags&flagCorrelationID != 0 {
		e.shortstr(pr.CorrelationID)
	}
	if flags&flagReplyTo != 0 {
		e.shortstr(pr.ReplyTo)
	}
	if flags&flagExpiration != 0 {
		e.shortstr(pr.Expiration)
	}
	if flags&flagMessageID != 0 {
		e.shortstr(pr.MessageID)
	}
	if flags&flagTimestamp != 0 {
		e.longlong(uint64(pr.Timestamp.Unix()))
	}
	if flags&flagType != 0 {
		e.shortstr(pr.Type)
	}
	if flags&flagUserID != 0 {
		e.shortstr(pr.UserID)
	}
	if flags&flagAppID != 0 {
		e.shortstr(pr.AppID)
	}
	if flags&flagClusterID != 0 {
		e.shortstr(pr.ClusterID)
	}
	return e.b, e.err
}
