package amqp

import (
	"fmt"
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
	d := decoder{b: p}
	class, id := d.short(), d.short()
	if d.err != nil {
		return nil, &Error{Code: FrameError, Text: "method frame shorter than its ids", Cause: d.err}
	}
	m := newMethod(class, id)
	if m == nil {
		return nil, &Error{Code: CommandInvalid, ClassID: class, MethodID: id,
			Text: fmt.Sprintf("unknown method %d.%d", class, id), Cause: ErrUnknownMethod}
	}
	m.decode(&d)
	if err := d.done(); err != nil {
		return nil, &Error{Code: SyntaxError, ClassID: class, MethodID: id,
			Text: fmt.Sprintf("malformed %s: %v", m.Name(), err), Cause: err}
	}
	return m, nil
}

// AppendMethodPayload appends m's payload (ids and fields) to b.
func AppendMethodPayload(b []byte, m Method) ([]byte, error) {
	e := encoder{b: b}
	class, id := m.ClassMethod()
	e.short(class)
	e.short(id)
	m.encode(&e)
	if e.err != nil {
		return b, fmt.Errorf("encode %s: %w", m.Name(), e.err)
	}
	return e.b, nil
}
