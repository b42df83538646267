package broker

import (
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/wire"
)

// worstExprs are the most costly expressions we found per unit of cost:
// string doubling, nested comprehensions over headers and members, list
// and map building, concatenation in loops, patterns, conversions.
var worstExprs = []string{
	`[key].map(a, [a + a].map(b, [b + b].map(c, [c + c].map(d, [d + d].map(e, e + e)))))`,
	`["0123456789"].map(a, [a + a].map(b, [b + b].map(c, [c + c].map(d, [d + d].map(e, [e + e].map(f, [f + f].map(g, [g + g].map(h, [h + h].map(i, [i + i].map(j, [j + j].map(k, [k + k].map(l, [l + l].map(m, [m + m].map(n, n + n))))))))))))))`,
	`headers.all(a, headers.all(b, headers.all(c, a + b + c != "")))`,
	`headers.all(a, headers.all(b, headers[a] + headers[b] != ""))`,
	`members.map(a, members.map(b, a.id + b.id))`,
	`members.map(a, members.map(b, a))`,
	`members.map(a, members + members)`,
	`members.map(a, [a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a])`,
	`members.map(a, {"x": a.id, "y": a.tag, "z": a.conn_tag})`,
	`members.map(a, key + a.id)`,
	`headers.map(k, headers.map(j, [k, j]))`,
	`members.exists(m, key.matches("(a|b|c|d|e|f)*x"))`,
	`members.exists(m, headers[m.id].matches("(a|aa)*b"))`,
	`key.matches("(a|b|c|d|e|f)*x")`,
	`members.exists(m, key.upperAscii() == m.id)`,
	`members.exists(m, key.lowerAscii().substring(1).trim() == m.id)`,
	`members.exists(m, size(key) == 0)`,
	`members.exists(m, int(key) == 0)`,
	`members.exists(m, key.contains(m.id + "zz"))`,
	`members.exists(m, key.indexOf(m.id + "zz") > 0)`,
	`members.exists_one(m, m.id in members.map(x, x.id))`,
	`members.exists(m, bytes(key) == bytes(m.id))`,
	`members.exists(m, m in members)`,
	`headers.all(k, headers.all(j, headers.all(i, headers.all(h, true))))`,
}

// worstInputs are the requests worstExprs are evaluated on: the
// reference sizes with a 64 KiB key, and a 4 MiB key (the frame limit).
func worstInputs() map[string]*RouteInput {
	in := fuzzInputs()[1]
	big := *in
	big.Key = strings.Repeat("a", 4<<20)
	return map[string]*RouteInput{"ref": in, "4MiB-key": &big}
}

// TestExprWorstCase evaluates worstExprs, past the static check, on large
// requests: the cost limit alone must keep each within the memory the
// limit stands for (1 MiB: at most 25 bytes a unit, measured, with room
// for the operation that went over it), and the time
// limit must stop the loops. With -v it prints the figures docs/
// operations.md quotes.
func TestExprWorstCase(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	lim := exprLimits{cost: DefaultExprCost, time: DefaultExprTime}
	for name, in := range worstInputs() {
		// What the broker builds for the variables, members above all,
		// whatever the expression does with them.
		base := measure(mustExpr(t, `size(members) >= 0 && size(headers) >= 0 && key != tag`, lim), in, false).alloc
		for _, src := range worstExprs {
			e, err := buildExpr(src, lim, false)
			if err != nil {
				t.Fatalf("%s: %v", src, err)
			}
			m := measure(e, in, false)
			var perUnit, nsUnit float64
			if c, _ := strconv.ParseFloat(m.cost, 64); c > 1000 {
				perUnit, nsUnit = float64(m.alloc-min(base, m.alloc))/c, m.ms*1e6/c
			}
			t.Logf("%-9s cost %-6s %6.2fms %8d B (%4.1f B, %5.1f ns a unit)  %.70s: %v", name, m.cost, m.ms, m.alloc, perUnit, nsUnit, src, m.err)
			if bound := base + 1<<20; m.alloc > bound && !raceEnabled {
				t.Errorf("%s on %s: allocated %d bytes, over %d", src, name, m.alloc, bound)
			}
			if m.err == nil || m.cost == "" {
				continue
			}
			if e.loops {
				m = measure(e, in, true)
				if d := time.Duration(m.ms * float64(time.Millisecond)); d > lim.time+time.Second {
					t.Errorf("%s on %s: took %s under a time limit of %s", src, name, d, lim.time)
				}
			}
		}
	}
}

func mustExpr(t *testing.T, src string, lim exprLimits) *expr {
	t.Helper()
	e, err := buildExpr(src, lim, false)
	if err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	return e
}

type measurement struct {
	cost  string
	ms    float64
	alloc uint64
	err   error
}

// measure evaluates e on in once; with timed, under the time limit too.
func measure(e *expr, in *RouteInput, timed bool) measurement {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	var m measurement
	if timed {
		_, m.err = e.eval(&exprVars{in: in}, 0)
	} else {
		_, det, err := e.prog.Eval(&exprVars{in: in})
		m.err = err
		if det != nil && det.ActualCost() != nil {
			m.cost = fmt.Sprint(*det.ActualCost())
		}
	}
	m.ms = float64(time.Since(start)) / float64(time.Millisecond)
	runtime.ReadMemStats(&after)
	m.alloc = after.TotalAlloc - before.TotalAlloc
	return m
}

// realisticExprs are the expressions of the repository's tests and docs.
var realisticExprs = []string{
	`key`,
	`headers["user"]`,
	`headers["tenant"]`,
	`size * 2`,
	`key + ":" + tag`,
	`null`,
	`{"tag": headers["region"]}`,
	`members[size(members)-1].id`,
	`"to" in headers && headers["to"] == "other" ? {"redirect": "users.v2"} : null`,
	`{"redirect": "users.v2"}`,
	`"deny" in headers ? {"reject": "denied: " + headers["deny"]} : null`,
	`{"key": "rw-" + key, "headers": {"user": headers["user"].upperAscii(), "via": "route"}}`,
	`size > 1000 ? {"reject": "too big"} : {"tag": "eu"}`,
	`size > 10 ? {"reject": "too big"} : !("region" in headers) ? null : {"tag": headers["region"], "key": key + "!"}`,
	`members.filter(m, m.tag == "eu").size() > 0 ? {"tag": "eu"} : null`,
	`members.exists(m, m.conn_tag == key) ? {"tag": "pinned"} : null`,
	`key.startsWith("eu-") ? {"tag": "eu"} : key.startsWith("us-") ? {"tag": "us"} : null`,
	`key.matches("^[a-z]+-[0-9]{1,4}$") ? null : {"reject": "bad key"}`,
	`headers.exists(k, k.startsWith("x-debug")) ? {"tag": "debug"} : null`,
	`key.substring(0, key.indexOf(".")).lowerAscii()`,
	// docs/protocol.md §5.1
	`"to" in headers && headers["to"] == "v2" ? {"redirect": "users.v2"} : null`,
	`members[size(members) - 1].id`,
	`members.exists(m, m.tag == "eu") ? {"tag": "eu"} : null`,
	`{"key": (key.contains(".") ? key.substring(0, key.indexOf(".")) : key).lowerAscii()}`,
}

// wireSizes are the largest sizes the wire allows at the default limits:
// any string up to the frame (4 MiB), 256 headers, and as many members as
// connections times attachments.
var wireSizes = exprSizes{
	key: wire.DefaultMaxFrame, tag: wire.DefaultMaxFrame, headers: wire.MaxHeaders,
	headerName: wire.DefaultMaxFrame, headerValue: wire.DefaultMaxFrame,
	members: 65536 * 4096, memberField: wire.DefaultMaxFrame,
}

// TestExprRealistic: every expression of the repository passes the
// static check at the default limit. With -v it prints each one's
// estimate on the reference request and on the largest the wire allows,
// which shows why the check uses the former.
func TestExprRealistic(t *testing.T) {
	for _, src := range realisticExprs {
		e, err := compileExpr(src, defaultLimits)
		if err != nil {
			t.Errorf("%s: %v", src, err)
			continue
		}
		checked, err := checkExpr(src)
		if err != nil {
			t.Fatal(err)
		}
		worst, err := estimateEnv.EstimateCost(checked, sizeEstimator{wireSizes})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("estimate %6d, %s at the wire's sizes: %s", e.estimate, costString(worst.Max), src)
	}
}

// TestExprRefused: what the static check refuses, with its reason.
func TestExprRefused(t *testing.T) {
	for src, why := range map[string]string{
		`len(repeat(repeat("x", 999999), 999999)) > 0 ? nil : nil`:      "undeclared reference",
		`headers.all(a, headers.all(b, headers[a] + headers[b] != ""))`: "too costly",
		`members.map(a, members.map(b, a.id + b.id))`:                   "too costly",
		`members.all(a, members.all(b, members.all(c, a.id == c.id)))`:  "too costly",
		`key.matches(tag)`:                                   "literal pattern",
		`key.matches("a{500}")`:                              "instructions",
		`"%s%s".format([key, key])`:                          "not available",
		`key.replace("", key)`:                               "not available",
		`[key, key].join()`:                                  "not available",
		`key.split("")`:                                      "not available",
		`members.exists(m, members == members)`:              "compares lists",
		`members[0] != members[1]`:                           "compares lists",
		`timestamp(key) > timestamp("2020-01-01T00:00:00Z")`: "not available",
		strings.Repeat("1 + ", maxExprSource) + "1":          "characters",
	} {
		err := CompileExpr(src, true)
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%.60s: %v, want an error about %q", src, err, why)
		}
	}
}

// TestExprTimeLimit: an expression with loops stops at its time limit,
// or at the request's deadline when that comes first. The cost limit is
// set out of the way.
func TestExprTimeLimit(t *testing.T) {
	in := fuzzInputs()[1]
	src := `headers.all(a, headers.all(b, headers.all(c, headers.all(d, a + b + c + d != ""))))`
	for _, tc := range []struct {
		lim  exprLimits
		left time.Duration
		want string
	}{
		{exprLimits{cost: 1 << 62, time: 20 * time.Millisecond}, 0, "ran longer than its time limit (20ms)"},
		{exprLimits{cost: 1 << 62, time: time.Hour}, 20 * time.Millisecond, "ran past the request's deadline (20ms)"},
	} {
		e, err := buildExpr(src, tc.lim, false)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = e.eval(&exprVars{in: in}, tc.left)
		took := time.Since(start)
		var le *exprLimitError
		if !errors.As(err, &le) || le.msg != tc.want {
			t.Fatalf("error %v, want %q", err, tc.want)
		}
		// Promised: 20 ms; tolerance for a loaded machine and -race.
		if took > 20*time.Millisecond+time.Second {
			t.Fatalf("stopped after %s", took)
		}
	}
}

// TestExprCostLimit: an expression that goes over its cost limit stops
// with a clear error, from the guard before a long string is copied or
// from CEL's count after many small steps.
func TestExprCostLimit(t *testing.T) {
	big := &RouteInput{Key: strings.Repeat("k", 4<<20)}
	for _, src := range []string{`{"key": key + key + key + key}`, `key.upperAscii()`, `[key].map(k, k + k)`} {
		e, err := compileExpr(src, defaultLimits)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err = e.eval(&exprVars{in: big}, 0)
		runtime.ReadMemStats(&after)
		var le *exprLimitError
		if !errors.As(err, &le) || le.msg != "went over its cost limit (40000)" {
			t.Fatalf("%s on a 4 MiB key: %v, want the cost limit", src, err)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 && !raceEnabled {
			t.Fatalf("%s on a 4 MiB key allocated %d bytes before it stopped", src, alloc)
		}
	}
}
