package broker

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/courier-mq/courier/wire"
)

// fuzzInputs are the requests FuzzCompileExpr evaluates an expression on:
// a small one, and one at the reference sizes with a long key.
func fuzzInputs() []*RouteInput {
	small := &RouteInput{
		Key: "k1", Header: map[string]string{"tenant": "acme", "region": "eu"}, Size: 42, Tag: "eu",
		Members: []wire.Member{{ID: "c1.1", ServiceTag: "eu"}, {ID: "c2.1", ConnTag: "x"}},
	}
	big := &RouteInput{Key: strings.Repeat("k", 64<<10), Header: map[string]string{}, Size: 1 << 20, Tag: strings.Repeat("t", 255)}
	for i := range int(refSizes.headers) {
		big.Header[fmt.Sprintf("h%03d", i)] = strings.Repeat("v", int(refSizes.headerValue))
	}
	for i := range int(refSizes.members) {
		big.Members = append(big.Members, wire.Member{ID: fmt.Sprintf("c%d.1", i), ServiceTag: "eu", ConnTag: fmt.Sprint(i)})
	}
	return []*RouteInput{small, big}
}

// fuzzAllocBound is what one evaluation may allocate in FuzzCompileExpr:
// the budget (at most 25 bytes a unit of cost, measured), plus what the
// broker builds for the variables (400 KiB for the 1,024 members) and the
// one operation that goes over the limit.
const fuzzAllocBound = 25*DefaultExprCost + 1<<20

// FuzzCompileExpr: a client sends sticky-key and routing expressions over
// the wire, so compiling any source, and evaluating what compiles against
// a request, must return or fail, never panic or run away: every
// evaluation must end within its limits, the time limit (with a
// tolerance for a loaded machine: a runaway takes seconds) and the
// memory the cost limit stands for.
func FuzzCompileExpr(f *testing.F) {
	for _, src := range []string{
		`headers["tenant"]`,
		`key + ":" + tag`,
		`size > 1000 ? {"reject": "too big"} : {"tag": "eu"}`,
		`members[size(members)-1].id`,
		`{"redirect": "other", "key": key.upperAscii(), "headers": {"a": "b"}}`,
		`null`,
		`members.filter(m, m.tag == "eu").size() > 0 ? "eu" : "any"`,
		`[key + key].map(a, [a + a].map(b, [b + b].map(c, c + c)))`,
		`members.map(a, members.map(b, a.id + b.id))`,
		`headers.all(k, headers.all(j, k + j != ""))`,
		`key.matches("^(a|b)*c$")`,
		`int(key) > 0`,
		`1/0`,
		`members[99].id`,
		`len(repeat(repeat("x", 999999), 999999)) > 0 ? nil : nil`,
	} {
		f.Add(src, true)
		f.Add(src, false)
	}
	inputs := fuzzInputs()
	f.Fuzz(func(t *testing.T, src string, route bool) { // route: kept for the corpus; both compile alike
		if len(src) > 2048 || !utf8.ValidString(src) {
			return // DECLARE bodies are JSON, so UTF-8; and bounded by the frame
		}
		e, err := compileExpr(src, defaultLimits)
		if err != nil {
			return
		}
		for _, in := range inputs {
			checkBounded(t, e, in)
		}
	})
}

// checkBounded evaluates e on in and fails t if the evaluation went past
// its limits.
func checkBounded(t *testing.T, e *expr, in *RouteInput) {
	t.Helper()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	out, det, err := e.prog.ContextEval(t.Context(), &exprVars{in: in})
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	if det != nil && det.ActualCost() != nil && *det.ActualCost() > e.lim.cost && err == nil {
		t.Fatalf("cost %d over the limit %d, and no error", *det.ActualCost(), e.lim.cost)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > fuzzAllocBound && !raceEnabled {
		t.Fatalf("the evaluation allocated %d bytes, over %d", alloc, fuzzAllocBound)
	}
	if took > time.Second {
		t.Fatalf("the evaluation took %s", took)
	}
	_, _ = out, err
	// And through the broker's own path, under the time limit.
	if e.loops {
		start = time.Now()
		e.eval(&exprVars{in: in}, 0)
		if took := time.Since(start); took > e.lim.time+time.Second {
			t.Fatalf("the evaluation took %s, limit %s", took, e.lim.time)
		}
	}
}
