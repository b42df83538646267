package broker

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/courier-mq/courier/wire"
)

// Header filters: the bindings of AMQP's headers exchanges. A durable
// subscription may carry header filters besides its patterns: it then
// takes a publication whose key matches one of its patterns and whose
// headers pass one of its filters, whoever publishes (AMQP or a Courier
// PUBLISH). The filters are kept with the subscription's definition, so
// they survive a restart, and are listed with it in the definitions.

// Bounds on a subscription's filters, checked when they are set: a
// publication costs at most MaxHeaderFilters × MaxFilterHeaders lookups
// for each filtered subscription it meets.
const (
	MaxHeaderFilters = 64
	MaxFilterHeaders = 32
	maxFilterText    = 255 // longest header name or value in a filter
)

// The x-match modes of a [HeaderFilter].
const (
	MatchAll      = "all"        // every header of the filter, "x-" ones left out
	MatchAny      = "any"        // one header of the filter, "x-" ones left out
	MatchAllWithX = "all-with-x" // every header, "x-" ones included
	MatchAnyWithX = "any-with-x" // one header, "x-" ones included
)

// HeaderFilter is one headers binding: the headers a publication must
// carry. A header whose value is nil must be present with any value;
// otherwise its value must be equal. Match is one of MatchAll (the
// default, ""), MatchAny, MatchAllWithX and MatchAnyWithX; as in
// RabbitMQ, the filter's headers named "x-..." are left out of the match
// unless the mode is a -with-x one, and an "any" filter with no header
// to match passes nothing, an "all" one everything.
//
// A Typed filter compares values by type too, as RabbitMQ does: a value
// matches a header of the same text and the same type, the filter's
// type in Types (absent: a string) and the header's in the
// publication's [TypesHeader] (absent: a string). A filter that is not
// Typed (one stored before types were kept) compares text alone.
type HeaderFilter struct {
	Match   string             `json:"x_match,omitempty"`
	Headers map[string]*string `json:"headers,omitempty"`
	Typed   bool               `json:"typed,omitempty"`
	Types   map[string]string  `json:"types,omitempty"`
}

// TypesHeader names the header that gives the types of a publication's
// other headers, for the typed comparison of header filters: a JSON
// object of header names and their types (the AMQP gateway's type
// classes: "int", "float", "bool", "timestamp", "decimal", "bytes",
// "table", "array", "void"); a header not in it is a string. The AMQP
// gateway sets it for the headers of its publications that are not
// strings; a Courier-native publisher may set it too.
const TypesHeader = "x-amqp-types"

// MaxTypesHeader bounds the TypesHeader value read: a longer one is
// ignored (every header is then a string).
const MaxTypesHeader = 16 << 10

// headerTypes are a publication's header types, read from its
// TypesHeader at most once, when a typed filter asks.
type headerTypes struct {
	h    map[string]string
	read bool
	m    map[string]string
}

// of returns the type of header k ("" for a string).
func (t *headerTypes) of(k string) string {
	if !t.read {
		t.read = true
		if v := t.h[TypesHeader]; v != "" && len(v) <= MaxTypesHeader {
			json.Unmarshal([]byte(v), &t.m)
		}
	}
	return t.m[k]
}

// admits reports whether headers h pass f.
func (f *HeaderFilter) admits(h map[string]string) bool {
	return f.admitsTyped(&headerTypes{h: h})
}

func (f *HeaderFilter) admitsTyped(types *headerTypes) bool {
	h := types.h
	any := f.Match == MatchAny || f.Match == MatchAnyWithX
	withX := f.Match == MatchAllWithX || f.Match == MatchAnyWithX
	for k, want := range f.Headers {
		if !withX && strings.HasPrefix(k, "x-") {
			continue
		}
		v, ok := h[k]
		matched := ok && (want == nil || *want == v && (!f.Typed || f.Types[k] == types.of(k)))
		if any && matched {
			return true
		}
		if !any && !matched {
			return false
		}
	}
	return !any
}

func (f *HeaderFilter) equal(g *HeaderFilter) bool {
	return f.Match == g.Match && f.Typed == g.Typed && maps.Equal(f.Types, g.Types) &&
		maps.EqualFunc(f.Headers, g.Headers, func(a, b *string) bool {
			return a == b || a != nil && b != nil && *a == *b
		})
}

// checkHeaderFilters refuses filters past the bounds or with an unknown
// mode.
func checkHeaderFilters(filters []HeaderFilter) error {
	if len(filters) > MaxHeaderFilters {
		return wire.Errorf(wire.CodeBadOptions, "%d header filters, more than %d", len(filters), MaxHeaderFilters)
	}
	for _, f := range filters {
		switch f.Match {
		case "", MatchAll, MatchAny, MatchAllWithX, MatchAnyWithX:
		default:
			return wire.Errorf(wire.CodeBadOptions, "header filter: x-match %q: use all, any, all-with-x or any-with-x", f.Match)
		}
		if len(f.Headers) > MaxFilterHeaders {
			return wire.Errorf(wire.CodeBadOptions, "header filter of %d headers, more than %d", len(f.Headers), MaxFilterHeaders)
		}
		for k, v := range f.Headers {
			if len(k) == 0 || len(k) > maxFilterText || v != nil && len(*v) > maxFilterText {
				return wire.Errorf(wire.CodeBadOptions, "header filter: header %.40q: names of 1 to %d bytes, values of at most %d", k, maxFilterText, maxFilterText)
			}
		}
		for k, typ := range f.Types {
			if _, ok := f.Headers[k]; !ok || len(typ) > maxFilterText {
				return wire.Errorf(wire.CodeBadOptions, "header filter: type of %.40q: a header of the filter, a type of at most %d bytes", k, maxFilterText)
			}
		}
	}
	return nil
}

// sameFilters reports whether two lists of filters are the same, in
// order.
func sameFilters(a, b []HeaderFilter) bool {
	return slices.EqualFunc(a, b, func(f, g HeaderFilter) bool { return f.equal(&g) })
}

// admits reports whether a publication with headers h passes tq's header
// filters: always when it has none.
func (tq *taskQueue) admits(h map[string]string) bool {
	fs := tq.filters.Load()
	if fs == nil {
		return true
	}
	types := headerTypes{h: h}
	for i := range *fs {
		if (*fs)[i].admitsTyped(&types) {
			return true
		}
	}
	return false
}

// setFilters makes filters tq's header filters (none: no filtering).
func (tq *taskQueue) setFilters(filters []HeaderFilter) {
	if len(filters) == 0 {
		tq.filters.Store(nil)
		return
	}
	fs := slices.Clone(filters)
	tq.filters.Store(&fs)
}

// DurableSubscribeHeaders creates the durable subscription sub of the
// pub-sub exchange, or finds it, bound to every key ("#") and filtered by
// filters in place of those it had: its queue takes what the exchange
// publishes with headers that pass one of them (none: everything). The
// filters are stored with the subscription's definition.
func (b *Broker) DurableSubscribeHeaders(exchange, sub string, filters []HeaderFilter) error {
	if err := checkHeaderFilters(filters); err != nil {
		return fmt.Errorf("durable subscription %q: %w", sub, err)
	}
	ex, err := b.lookup(exchange)
	if err != nil {
		return err
	}
	patterns := []string{"#"}
	if err := b.CheckSubscription(exchange, ex.cfg, sub, patterns); err != nil {
		return err
	}
	if filters == nil {
		filters = []HeaderFilter{}
	}
	_, err = b.durableSubFiltered(ex, sub, patterns, filters, nil)
	return err
}

// Filters returns the header filters of the durable subscription sub of
// exchange, and whether it exists.
func (b *Broker) Filters(exchange, sub string) ([]HeaderFilter, bool) {
	v, ok := b.queues.Load(exchange + "/" + sub)
	if !ok {
		return nil, false
	}
	tq := v.(*taskQueue)
	tq.defMu.Lock()
	defer tq.defMu.Unlock()
	return slices.Clone(tq.def.Headers), true
}
