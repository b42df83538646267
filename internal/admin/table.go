package admin

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A schema lists the JSON fields of one kind of object (an exchange, a
// connection, a queue) as leaves with dotted paths, such as "name" or
// "message_stats.publish_details.rate". The encoder writes only the
// leaves a request selects (?columns=) and rebuilds the nesting from the
// paths, so a row is never turned into a map or a struct to be encoded.
type schema[R any] struct {
	fields []*field[R]
	byPath map[string]*field[R]
	// nodes holds every path and parent path a column may name.
	nodes map[string]bool
	// natural is the path of the field the rows come sorted by.
	natural string
}

// field is one leaf of an object's JSON form. enc appends the JSON value;
// a field sorts by num when it is set, else by str.
type field[R any] struct {
	path  string
	parts []string
	keys  [][]byte // `"part":` for each part, quoted once
	enc   func(b []byte, r *R) []byte
	num   func(r *R) float64
	str   func(r *R) string
}

func newSchema[R any](natural string, fields ...*field[R]) *schema[R] {
	s := &schema[R]{fields: fields, byPath: make(map[string]*field[R]), nodes: make(map[string]bool), natural: natural}
	closed := make(map[string]bool) // parents whose fields ended
	var prev []string
	for _, f := range fields {
		f.parts = strings.Split(f.path, ".")
		for _, p := range f.parts {
			f.keys = append(f.keys, append(appendString(nil, p), ':'))
		}
		if s.byPath[f.path] != nil {
			panic("admin: duplicate field " + f.path)
		}
		s.byPath[f.path] = f
		for i := 1; i <= len(f.parts); i++ {
			s.nodes[strings.Join(f.parts[:i], ".")] = true
		}
		// Fields of one parent must be contiguous for the encoder.
		c := commonPrefix(prev, f.parts[:len(f.parts)-1])
		for i := c; i < len(prev); i++ {
			closed[strings.Join(prev[:i+1], ".")] = true
		}
		for i := c; i < len(f.parts)-1; i++ {
			if closed[strings.Join(f.parts[:i+1], ".")] {
				panic("admin: fields under " + strings.Join(f.parts[:i+1], ".") + " are not contiguous")
			}
		}
		prev = f.parts[:len(f.parts)-1]
	}
	if s.byPath[natural] == nil {
		panic("admin: natural order field " + natural + " missing")
	}
	return s
}

func commonPrefix(a, b []string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// paths lists every leaf path, for error messages and documentation.
func (s *schema[R]) paths() []string {
	p := make([]string, len(s.fields))
	for i, f := range s.fields {
		p[i] = f.path
	}
	return p
}

// selectColumns returns the fields that columns select, in schema order:
// a column names a leaf or a parent object, which selects every leaf under
// it. No columns selects everything.
func (s *schema[R]) selectColumns(columns []string) ([]*field[R], error) {
	if len(columns) == 0 {
		return s.fields, nil
	}
	for _, c := range columns {
		if !s.nodes[c] {
			return nil, badRequest("unknown column %q; columns are %s", c, strings.Join(s.paths(), ","))
		}
	}
	var sel []*field[R]
	for _, f := range s.fields {
		for _, c := range columns {
			if f.path == c || strings.HasPrefix(f.path, c) && f.path[len(c)] == '.' {
				sel = append(sel, f)
				break
			}
		}
	}
	return sel, nil
}

// sortField returns the leaf a sort parameter names.
func (s *schema[R]) sortField(path string) (*field[R], error) {
	f := s.byPath[path]
	if f == nil || f.num == nil && f.str == nil {
		return nil, badRequest("cannot sort by %q; sort by one of %s", path, strings.Join(s.paths(), ","))
	}
	return f, nil
}

// appendObject appends r as a JSON object holding the fields.
func appendObject[R any](b []byte, r *R, fields []*field[R]) []byte {
	b = append(b, '{')
	var openBuf [4]string
	open := openBuf[:0] // the nested objects now open
	first := true
	for _, f := range fields {
		parent := f.parts[:len(f.parts)-1]
		c := commonPrefix(open, parent)
		for len(open) > c {
			b = append(b, '}')
			open = open[:len(open)-1]
			first = false
		}
		for len(open) < len(parent) {
			if !first {
				b = append(b, ',')
			}
			b = append(b, f.keys[len(open)]...)
			b = append(b, '{')
			open = append(open, parent[len(open)])
			first = true
		}
		if !first {
			b = append(b, ',')
		}
		b = append(b, f.keys[len(f.keys)-1]...)
		b = f.enc(b, r)
		first = false
	}
	for range open {
		b = append(b, '}')
	}
	return append(b, '}')
}

// Field constructors.

func strField[R any](path string, get func(*R) string) *field[R] {
	return &field[R]{path: path, str: get, enc: func(b []byte, r *R) []byte { return appendString(b, get(r)) }}
}

func uintField[R any](path string, get func(*R) uint64) *field[R] {
	return &field[R]{path: path,
		num: func(r *R) float64 { return float64(get(r)) },
		enc: func(b []byte, r *R) []byte { return strconv.AppendUint(b, get(r), 10) }}
}

func intField[R any](path string, get func(*R) int64) *field[R] {
	return &field[R]{path: path,
		num: func(r *R) float64 { return float64(get(r)) },
		enc: func(b []byte, r *R) []byte { return strconv.AppendInt(b, get(r), 10) }}
}

func floatField[R any](path string, get func(*R) float64) *field[R] {
	return &field[R]{path: path, num: get, enc: func(b []byte, r *R) []byte { return appendFloat(b, get(r)) }}
}

func boolField[R any](path string, get func(*R) bool) *field[R] {
	return &field[R]{path: path,
		num: func(r *R) float64 {
			if get(r) {
				return 1
			}
			return 0
		},
		enc: func(b []byte, r *R) []byte { return strconv.AppendBool(b, get(r)) }}
}

// nameField is the "name" of a listed object: quoted from the sampler's
// entry when it has one, else from the object.
func nameField[R any](get func(*R) string, quoted func(*R) []byte) *field[R] {
	return &field[R]{path: "name", str: get, enc: func(b []byte, r *R) []byte {
		if q := quoted(r); q != nil {
			return append(b, q...)
		}
		return appendString(b, get(r))
	}}
}

// rawField is a field whose value the caller encodes (an array, an
// object); it sorts by num.
func rawField[R any](path string, enc func(b []byte, r *R) []byte, num func(*R) float64) *field[R] {
	return &field[R]{path: path, enc: enc, num: num}
}

// rateField is the {"rate": r} of a counter: "<prefix>_details.rate".
func rateField[R any](prefix string, get func(*R) float64) *field[R] {
	return floatField(prefix+"_details.rate", get)
}

// appendFloat appends f rounded to two decimals; NaN and infinities,
// which JSON cannot hold, as 0.
func appendFloat(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, '0')
	}
	f = math.Round(f*100) / 100
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		b = strconv.AppendInt(b, int64(f), 10)
		return append(b, ".0"...)
	}
	return strconv.AppendFloat(b, f, 'f', -1, 64)
}

// appendString appends s as a JSON string.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			if r == utf8.RuneError {
				b = append(b, `\ufffd`...)
			} else {
				b = append(b, `\u202`...)
				b = append(b, hex[r&0xf])
			}
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// sortRows orders rows by f (then by their current order, which is the
// natural one), reversed when reverse is set, and returns the first limit
// rows of that order (all of them when limit <= 0). When limit is small
// against len(rows) it selects with a bounded heap, O(n log limit),
// instead of sorting everything.
func sortRows[R any](rows []R, f *field[R], reverse bool, limit int) []R {
	if f.num != nil {
		keys := make([]numKey, len(rows))
		for i := range rows {
			keys[i] = numKey{f.num(&rows[i]), int32(i)}
		}
		return pick(rows, keys, func(a, b *numKey) int { return tieBreak(cmpFloat(a.v, b.v), a.i, b.i, reverse) }, limit)
	}
	keys := make([]strKey, len(rows))
	for i := range rows {
		keys[i] = strKey{f.str(&rows[i]), int32(i)}
	}
	return pick(rows, keys, func(a, b *strKey) int { return tieBreak(strings.Compare(a.v, b.v), a.i, b.i, reverse) }, limit)
}

// Sort keys: the value and the row's index, which breaks ties.
type (
	numKey struct {
		v float64
		i int32
	}
	strKey struct {
		v string
		i int32
	}
	indexed interface{ index() int32 }
)

func (k numKey) index() int32 { return k.i }
func (k strKey) index() int32 { return k.i }

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// tieBreak completes a comparison of values with the rows' indexes, and
// reverses the whole when asked.
func tieBreak(c int, ai, bi int32, reverse bool) int {
	if c == 0 {
		c = int(ai - bi)
	}
	if reverse {
		return -c
	}
	return c
}

// pick returns the rows of the first limit keys in cmp order.
func pick[R any, K indexed](rows []R, keys []K, cmp func(a, b *K) int, limit int) []R {
	n := len(rows)
	if limit <= 0 || limit > n {
		limit = n
	}
	if limit < n/4 {
		keys = selectSmallest(keys, limit, cmp)
	}
	slices.SortFunc(keys, func(a, b K) int { return cmp(&a, &b) })
	out := make([]R, limit)
	for i := range out {
		out[i] = rows[keys[i].index()]
	}
	return out
}

// selectSmallest returns the k smallest keys under cmp, in no order,
// keeping a max-heap of k.
func selectSmallest[K any](keys []K, k int, cmp func(a, b *K) int) []K {
	h := make([]K, 0, k)
	down := func(i int) {
		for {
			l, big := 2*i+1, i
			if l < len(h) && cmp(&h[l], &h[big]) > 0 {
				big = l
			}
			if r := l + 1; r < len(h) && cmp(&h[r], &h[big]) > 0 {
				big = r
			}
			if big == i {
				return
			}
			h[i], h[big] = h[big], h[i]
			i = big
		}
	}
	for i := range keys {
		switch {
		case len(h) < k:
			h = append(h, keys[i])
			for j := len(h) - 1; j > 0; {
				p := (j - 1) / 2
				if cmp(&h[j], &h[p]) <= 0 {
					break
				}
				h[j], h[p] = h[p], h[j]
				j = p
			}
		case k > 0 && cmp(&keys[i], &h[0]) < 0:
			h[0] = keys[i]
			down(0)
		}
	}
	return h
}
