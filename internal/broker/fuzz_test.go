package broker

import (
	"testing"
	"unicode/utf8"

	"github.com/courier-mq/courier/wire"
)

// FuzzCompileExpr: a client sends sticky-key and routing expressions over
// the wire, so compiling any source, and evaluating what compiles against
// a request, must return or fail, never panic or run away: expr-lang's VM
// bounds the memory an evaluation may use.
func FuzzCompileExpr(f *testing.F) {
	for _, src := range []string{
		`headers["tenant"]`,
		`key + ":" + tag`,
		`size > 1000 ? {"reject": "too big"} : {"tag": "eu"}`,
		`members[len(members)-1].id`,
		`{"redirect": "other", "key": upper(key), "headers": {"a": "b"}}`,
		`nil`,
		`len(filter(members, .tag == "eu")) > 0 ? "eu" : "any"`,
		`repeat("a", 100000000)`,
		`map(1..1000000, # * 2)`,
		`1/0`,
		`members[99].id`,
	} {
		f.Add(src, true)
		f.Add(src, false)
	}
	in := &RouteInput{
		Key: "k1", Header: map[string]string{"tenant": "acme", "region": "eu"}, Size: 42, Tag: "eu",
		Members: []wire.Member{{ID: "c1.1", ServiceTag: "eu"}, {ID: "c2.1", ConnTag: "x"}},
	}
	f.Fuzz(func(t *testing.T, src string, route bool) {
		if len(src) > 2048 || !utf8.ValidString(src) {
			return // DECLARE bodies are JSON, so UTF-8; and bounded by the frame
		}
		if route {
			fn, err := compileRouteExpr(src)
			if err == nil {
				fn(in)
			}
			return
		}
		fn, err := compileKeyExpr(src)
		if err == nil {
			fn(in)
		}
	})
}
