package broker

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"cel.dev/cel-go/common/types"

	"github.com/courier-mq/courier/wire"
)

func TestRouteOf(t *testing.T) {
	str := func(s string) *string { return &s }
	cases := []struct {
		name string
		in   any
		want Route
		err  string // part of the error, "" for none
	}{
		{name: "null is any handler", in: nil, want: Route{}},
		{name: "string is a member", in: "c1.2", want: Route{Member: "c1.2"}},
		{name: "member", in: map[string]any{"member": "c3.1"}, want: Route{Member: "c3.1"}},
		{name: "tag", in: map[string]any{"tag": "eu"}, want: Route{Tag: "eu"}},
		{name: "redirect", in: map[string]any{"redirect": "users.v2"}, want: Route{Redirect: "users.v2"}},
		{name: "reject", in: map[string]any{"reject": "too big"}, want: Route{Reject: "too big"}},
		{name: "key", in: map[string]any{"key": "k2"}, want: Route{Key: str("k2")}},
		{name: "numeric key", in: map[string]any{"key": 42}, want: Route{Key: str("42")}},
		{name: "headers", in: map[string]any{"headers": map[string]any{"a": "x", "n": 7}}, want: Route{Header: map[string]string{"a": "x", "n": "7"}}},
		{name: "tag and rewrite", in: map[string]any{"tag": "us", "key": "k", "headers": map[string]any{}}, want: Route{Tag: "us", Key: str("k"), Header: map[string]string{}}},
		{name: "headers not a map", in: map[string]any{"headers": "x"}, err: "headers must be a map"},
		{name: "unknown key", in: map[string]any{"shard": "1"}, err: `unknown route key "shard"`},
		{name: "tag not a string", in: map[string]any{"tag": 3}, err: `route "tag" must be a string`},
		{name: "reject not a string", in: map[string]any{"reject": true}, err: `route "reject" must be a string`},
		{name: "number", in: 12, err: "want null, a member id or a map"},
		{name: "list", in: []any{"a"}, err: "want null, a member id or a map"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := routeOf(types.DefaultTypeAdapter.NativeToValue(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("routeOf(%v) error %v, want one containing %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("routeOf(%v): %v", tc.in, err)
			}
			if !sameRoute(got, tc.want) {
				t.Fatalf("routeOf(%v) = %s, want %s", tc.in, showRoute(got), showRoute(tc.want))
			}
		})
	}
}

func sameRoute(a, b Route) bool {
	if (a.Key == nil) != (b.Key == nil) || (a.Key != nil && *a.Key != *b.Key) {
		return false
	}
	if (a.Header == nil) != (b.Header == nil) || !maps.Equal(a.Header, b.Header) {
		return false
	}
	return a.Member == b.Member && a.Tag == b.Tag && a.Redirect == b.Redirect && a.Reject == b.Reject
}

func showRoute(r Route) string {
	key := "<nil>"
	if r.Key != nil {
		key = *r.Key
	}
	return fmt.Sprintf("{member=%q tag=%q redirect=%q reject=%q key=%s headers=%v}", r.Member, r.Tag, r.Redirect, r.Reject, key, r.Header)
}

// defaultLimits are the broker's default budgets.
var defaultLimits = exprLimits{cost: DefaultExprCost, time: DefaultExprTime}

// compileRouteExpr compiles a route expression under the default limits.
func compileRouteExpr(src string) (func(*RouteInput) (Route, error), error) {
	e, err := compileExpr(src, defaultLimits)
	if err != nil {
		return nil, err
	}
	return func(in *RouteInput) (Route, error) { return e.route(&exprVars{in: in}, 0) }, nil
}

// compileKeyExpr compiles a key expression under the default limits; an
// error gives "", as on a sticky-fun exchange.
func compileKeyExpr(src string) (func(*RouteInput) string, error) {
	e, err := compileExpr(src, defaultLimits)
	if err != nil {
		return nil, err
	}
	return func(in *RouteInput) string {
		k, _ := e.key(&exprVars{in: in}, 0)
		return k
	}, nil
}

func TestRouteExpr(t *testing.T) {
	_, err := compileRouteExpr(`size > 10 ? {"reject": "too big"} : headers[?"region"].orValue("") == "" ? null : {"tag": headers["region"], "key": key + "!"}`)
	if err == nil {
		t.Fatal("optional syntax compiled; it is not enabled")
	}
	fn, err := compileRouteExpr(`size > 10 ? {"reject": "too big"} : !("region" in headers) ? null : {"tag": headers["region"], "key": key + "!"}`)
	if err != nil {
		t.Fatal(err)
	}
	r, err := fn(&RouteInput{Key: "k", Size: 11})
	if err != nil || r.Reject != "too big" {
		t.Fatalf("big request: %s, %v", showRoute(r), err)
	}
	r, err = fn(&RouteInput{Key: "k"})
	if err != nil || !sameRoute(r, Route{}) {
		t.Fatalf("request without region: %s, %v", showRoute(r), err)
	}
	r, err = fn(&RouteInput{Key: "k", Header: map[string]string{"region": "eu"}})
	if err != nil || r.Tag != "eu" || r.Key == nil || *r.Key != "k!" {
		t.Fatalf("request for eu: %s, %v", showRoute(r), err)
	}

	pick, err := compileRouteExpr(`members[size(members)-1].id`)
	if err != nil {
		t.Fatal(err)
	}
	r, err = pick(&RouteInput{Members: []wire.Member{{ID: "c1.1"}, {ID: "c2.1"}}})
	if err != nil || r.Member != "c2.1" {
		t.Fatalf("pick the newest: %s, %v", showRoute(r), err)
	}

	mixed, err := compileRouteExpr(`size == 0 ? null : size == 1 ? "c1.1" : size == 2 ? {"tag": "eu"} : {"headers": {"n": size}, "key": size}`)
	if err != nil {
		t.Fatalf("branches of different types: %v", err)
	}
	for size, want := range []Route{{}, {Member: "c1.1"}, {Tag: "eu"}, {Header: map[string]string{"n": "3"}, Key: new("3")}} {
		if r, err := mixed(&RouteInput{Size: size}); err != nil || !sameRoute(r, want) {
			t.Errorf("size %d: %s, %v; want %s", size, showRoute(r), err, showRoute(want))
		}
	}

	for _, bad := range []string{`{"tag": `, `nosuch`, `headers[`, `nil`, `len(key)`} {
		if err := CompileExpr(bad, true); err == nil {
			t.Errorf("route expression %q compiled", bad)
		}
	}
}

func TestKeyExpr(t *testing.T) {
	fn, err := compileKeyExpr(`headers["user"]`)
	if err != nil {
		t.Fatal(err)
	}
	if got := fn(&RouteInput{Key: "k", Header: map[string]string{"user": "ann"}}); got != "ann" {
		t.Fatalf("key = %q, want ann", got)
	}
	if got := fn(&RouteInput{Key: "k"}); got != "" {
		t.Fatalf("key without the header = %q, want empty", got)
	}
	num, err := compileKeyExpr(`size * 2`)
	if err != nil {
		t.Fatal(err)
	}
	if got := num(&RouteInput{Size: 21}); got != "42" {
		t.Fatalf("numeric key = %q, want 42", got)
	}
	if err := CompileExpr(`key +`, false); err == nil {
		t.Fatal("a broken key expression compiled")
	}
}
