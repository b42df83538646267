package amqp

import (
	"encoding/binary"
	"math"
)

// decoder reads the fields of one method or header payload. The first
// error sticks: later reads return zero values, so that generated decoders
// read straight through and check err once.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

func (d *decoder) take(n int) []byte {
	if n < 0 || len(d.b) < n {
		d.fail(ErrShort)
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) octet() uint8 {
	p := d.take(1)
	if p == nil {
		return 0
	}
	return p[0]
}

func (d *decoder) short() uint16 {
	p := d.take(2)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint16(p)
}

func (d *decoder) long() uint32 {
	p := d.take(4)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint32(p)
}

func (d *decoder) longlong() uint64 {
	p := d.take(8)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint64(p)
}

func (d *decoder) shortstr() string {
	n := int(d.octet())
	return string(d.take(n))
}

func (d *decoder) longbytes() []byte {
	n := d.long()
	if uint64(n) > uint64(len(d.b)) {
		d.fail(ErrShort)
		return nil
	}
	return d.take(int(n))
}

func (d *decoder) longstr() string {
	return string(d.longbytes())
}

// done reports the sticky error, or ErrTrailing if bytes remain.
func (d *decoder) done() error {
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return ErrTrailing
	}
	return nil
}

// encoder appends fields to a buffer. Like decoder, its first error sticks.
type encoder struct {
	b   []byte
	err error
}

func (e *encoder) octet(v uint8) { e.b = append(e.b, v) }

func (e *encoder) short(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }

func (e *encoder) long(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }

func (e *encoder) longlong(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }

func (e *encoder) shortstr(s string) {
	if len(s) > math.MaxUint8 {
		if e.err == nil {
			e.err = ErrShortString
		}
		s = s[:math.MaxUint8]
	}
	e.b = append(e.b, byte(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) longstr(s string) {
	e.long(uint32(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) longbytes(p []byte) {
	e.long(uint32(len(p)))
	e.b = append(e.b, p...)
}
