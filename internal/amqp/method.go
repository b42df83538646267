package amqp

import (
	"fmt"
	"sync"
)

//go:generate go run gen.go

// Method is one AMQP method with its fields. The concrete types are the
// generated structs named for class and method (QueueDeclare for
// queue.declare); decode a payload with [DecodeMethod] and encode one with
// [AppendMethod].
type Method interface {
	// ClassMethod returns the class and method ids.
	ClassMethod() (class, method uint16)
	// Name returns the dotted name, like "queue.declare".
	Name() string
	// HasContent reports whether a content header and body frames follow
	// the method (basic.publish, basic.return, basic.deliver,
	// basic.get-ok).
	HasContent() bool
	encode(*encoder)
	decode(*decoder)
}

// DecodeMethod decodes a method frame's payload. An unknown class or method
// is an [*Error] with code 503 (command invalid), a payload that does not
// hold the method's fields exactly is one with code 502 (syntax error).
// Strings and tables in the result do not alias p.
func DecodeMethod(p []byte) (Method, error) {
	d := getDecoder(p)
	defer putDecoder(d)
	class, id := d.short(), d.short()
	if d.err != nil {
		return nil, &Error{Code: FrameError, Text: "method frame shorter than its ids", Cause: d.err}
	}
	m := newMethod(class, id)
	if m == nil {
		return nil, &Error{Code: CommandInvalid, ClassID: class, MethodID: id,
			Text: fmt.Sprintf("unknown method %d.%d", class, id), Cause: ErrUnknownMethod}
	}
	m.decode(d)
	if err := d.done(); err != nil {
		return nil, &Error{Code: SyntaxError, ClassID: class, MethodID: id,
			Text: fmt.Sprintf("malformed %s: %v", m.Name(), err), Cause: err}
	}
	return m, nil
}

// AppendMethodPayload appends m's payload (ids and fields) to b.
func AppendMethodPayload(b []byte, m Method) ([]byte, error) {
	e := encoders.Get().(*encoder)
	e.b, e.err = b, nil
	class, id := m.ClassMethod()
	e.short(class)
	e.short(id)
	m.encode(e)
	out, err := e.b, e.err
	*e = encoder{}
	encoders.Put(e)
	if err != nil {
		return b, fmt.Errorf("encode %s: %w", m.Name(), err)
	}
	return out, nil
}

// The method codecs are handed to a method's encode and decode, calls
// through the Method interface, so a codec on the stack would escape:
// one allocation per method frame each way. They come from pools
// instead; a codec goes back cleared, holding no buffer.
var (
	encoders = sync.Pool{New: func() any { return new(encoder) }}
	decoders = sync.Pool{New: func() any { return new(decoder) }}
)

// getDecoder returns a pooled decoder of p; putDecoder gives it back.
func getDecoder(p []byte) *decoder {
	d := decoders.Get().(*decoder)
	d.b, d.err = p, nil
	return d
}

func putDecoder(d *decoder) {
	*d = decoder{}
	decoders.Put(d)
}
