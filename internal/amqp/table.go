package amqp

import (
	"fmt"
	"math"
	"time"
)

// MaxTableDepth is how deep field tables and arrays may nest inside one
// another (a table at the top level has depth 1). RabbitMQ's clients nest
// two levels at most (capabilities inside client properties).
const MaxTableDepth = 16

// Table is an AMQP field table. Decoded values have these Go types, by
// field type: t bool, b int8, B uint8, s int16, u uint16, I int32,
// i uint32, l int64, f float32, d float64, D [Decimal], S string,
// x []byte, A []any, T time.Time (UTC, whole seconds), F Table, V nil.
// Encoding accepts the same types, plus int (as l) and map[string]any
// (as F).
type Table map[string]any

// Decimal is the AMQP decimal value: Value × 10^-Scale.
type Decimal struct {
	Scale uint8
	Value int32
}

func (d *decoder) table() Table {
	return d.tableAt(1)
}

func (d *decoder) tableAt(depth int) Table {
	if depth > MaxTableDepth {
		d.fail(ErrTableDepth)
		return nil
	}
	p := d.longbytes()
	if d.err != nil {
		return nil
	}
	t, err := tableEntries(p, depth)
	if err != nil {
		d.fail(err)
		return nil
	}
	return t
}

// tableEntries decodes the entries of a table at depth, without the
// length that precedes them (as AMQPLAIN's response holds them).
func tableEntries(p []byte, depth int) (Table, error) {
	sub := decoder{b: p}
	t := Table{}
	for len(sub.b) > 0 && sub.err == nil {
		k := sub.shortstr()
		v := sub.value(depth)
		if sub.err == nil {
			t[k] = v
		}
	}
	if sub.err != nil {
		return nil, sub.err
	}
	return t, nil
}

func (d *decoder) array(depth int) []any {
	if depth > MaxTableDepth {
		d.fail(ErrTableDepth)
		return nil
	}
	p := d.longbytes()
	if d.err != nil {
		return nil
	}
	sub := decoder{b: p}
	a := []any{}
	for len(sub.b) > 0 && sub.err == nil {
		v := sub.value(depth)
		if sub.err == nil {
			a = append(a, v)
		}
	}
	if sub.err != nil {
		d.fail(sub.err)
		return nil
	}
	return a
}

// value reads one typed field value inside a table or array at depth.
func (d *decoder) value(depth int) any {
	switch t := d.octet(); t {
	case 't':
		return d.octet() != 0
	case 'b':
		return int8(d.octet())
	case 'B':
		return d.octet()
	case 's':
		return int16(d.short())
	case 'u':
		return d.short()
	case 'I':
		return int32(d.long())
	case 'i':
		return d.long()
	case 'l':
		return int64(d.longlong())
	case 'f':
		return math.Float32frombits(d.long())
	case 'd':
		return math.Float64frombits(d.longlong())
	case 'D':
		return Decimal{Scale: d.octet(), Value: int32(d.long())}
	case 'S':
		return d.longstr()
	case 'x':
		return append([]byte(nil), d.longbytes()...)
	case 'A':
		return d.array(depth + 1)
	case 'T':
		return time.Unix(int64(d.longlong()), 0).UTC()
	case 'F':
		return d.tableAt(depth + 1)
	case 'V':
		return nil
	default:
		if d.err == nil {
			d.fail(fmt.Errorf("%w %q", ErrFieldType, t))
		}
		return nil
	}
}

func (e *encoder) table(t Table) {
	e.tableAt(t, 1)
}

func (e *encoder) tableAt(t map[string]any, depth int) {
	if depth > MaxTableDepth {
		e.setErr(ErrTableDepth)
		e.long(0)
		return
	}
	at := len(e.b)
	e.long(0)
	for k, v := range t {
		e.shortstr(k)
		e.value(v, depth)
	}
	patchLen(e.b, at)
}

func (e *encoder) array(a []any, depth int) {
	if depth > MaxTableDepth {
		e.setErr(ErrTableDepth)
		e.long(0)
		return
	}
	at := len(e.b)
	e.long(0)
	for _, v := range a {
		e.value(v, depth)
	}
	patchLen(e.b, at)
}

// patchLen writes the length of what follows the u32 at b[at:] into it.
func patchLen(b []byte, at int) {
	n := uint32(len(b) - at - 4)
	b[at], b[at+1], b[at+2], b[at+3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
}

func (e *encoder) setErr(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *encoder) value(v any, depth int) {
	switch v := v.(type) {
	case bool:
		e.octet('t')
		if v {
			e.octet(1)
		} else {
			e.octet(0)
		}
	case int8:
		e.octet('b')
		e.octet(uint8(v))
	case uint8:
		e.octet('B')
		e.octet(v)
	case int16:
		e.octet('s')
		e.short(uint16(v))
	case uint16:
		e.octet('u')
		e.short(v)
	case int32:
		e.octet('I')
		e.long(uint32(v))
	case uint32:
		e.octet('i')
		e.long(v)
	case int64:
		e.octet('l')
		e.longlong(uint64(v))
	case int:
		e.octet('l')
		e.longlong(uint64(v))
	case float32:
		e.octet('f')
		e.long(math.Float32bits(v))
	case float64:
		e.octet('d')
		e.longlong(math.Float64bits(v))
	case Decimal:
		e.octet('D')
		e.octet(v.Scale)
		e.long(uint32(v.Value))
	case string:
		e.octet('S')
		e.longstr(v)
	case []byte:
		e.octet('x')
		e.longbytes(v)
	case []any:
		e.octet('A')
		e.array(v, depth+1)
	case time.Time:
		e.octet('T')
		e.longlong(uint64(v.Unix()))
	case Table:
		e.octet('F')
		e.tableAt(v, depth+1)
	case map[string]any:
		e.octet('F')
		e.tableAt(v, depth+1)
	case nil:
		e.octet('V')
	default:
		e.setErr(fmt.Errorf("%w: %T", ErrValueType, v))
		e.octet('V')
	}
}
