package broker

import (
	"strings"
	"testing"
)

func TestHeaderFilterAdmits(t *testing.T) {
	s := func(v string) *string { return &v }
	h := map[string]string{"format": "pdf", "type": "report", "x-tenant": "a"}
	for _, c := range []struct {
		f    HeaderFilter
		want bool
	}{
		{HeaderFilter{Headers: map[string]*string{"format": s("pdf"), "type": s("report")}}, true},
		{HeaderFilter{Match: MatchAll, Headers: map[string]*string{"format": s("pdf"), "type": s("log")}}, false},
		{HeaderFilter{Match: MatchAny, Headers: map[string]*string{"format": s("doc"), "type": s("report")}}, true},
		{HeaderFilter{Match: MatchAny, Headers: map[string]*string{"format": s("doc")}}, false},
		{HeaderFilter{Headers: map[string]*string{"format": nil}}, true},
		{HeaderFilter{Headers: map[string]*string{"lang": nil}}, false},
		{HeaderFilter{Headers: map[string]*string{"x-tenant": s("b")}}, true}, // x- left out: nothing to match
		{HeaderFilter{Match: MatchAny, Headers: map[string]*string{"x-tenant": s("a")}}, false},
		{HeaderFilter{Match: MatchAllWithX, Headers: map[string]*string{"x-tenant": s("b")}}, false},
		{HeaderFilter{Match: MatchAnyWithX, Headers: map[string]*string{"x-tenant": s("a"), "q": s("1")}}, true},
		{HeaderFilter{}, true},
		{HeaderFilter{Match: MatchAny}, false},
	} {
		if got := c.f.admits(h); got != c.want {
			t.Errorf("%+v admits %v: %v, want %v", c.f, h, got, c.want)
		}
	}
}

func TestHeaderFilterBounds(t *testing.T) {
	many := make([]HeaderFilter, MaxHeaderFilters+1)
	if err := checkHeaderFilters(many); err == nil {
		t.Fatal("too many filters accepted")
	}
	big := HeaderFilter{Headers: map[string]*string{}}
	for i := range MaxFilterHeaders + 1 {
		big.Headers[strings.Repeat("h", i+1)] = nil
	}
	long := strings.Repeat("v", maxFilterText+1)
	for _, f := range []HeaderFilter{big, {Match: "some"}, {Headers: map[string]*string{"": nil}}, {Headers: map[string]*string{"k": &long}}} {
		if err := checkHeaderFilters([]HeaderFilter{f}); err == nil {
			t.Errorf("filter %.80v accepted", f)
		}
	}
	if err := checkHeaderFilters([]HeaderFilter{{Match: MatchAnyWithX, Headers: map[string]*string{"k": nil}}}); err != nil {
		t.Fatal(err)
	}
}

// Typed filters compare values by type too, as RabbitMQ's headers
// exchanges: int 7 is not the string "7", nor the float 7; a filter
// stored before types were kept compares text alone.
func TestHeaderFilterTyped(t *testing.T) {
	s := func(v string) *string { return &v }
	intSeven := HeaderFilter{Typed: true, Headers: map[string]*string{"n": s("7")}, Types: map[string]string{"n": "int"}}
	strSeven := HeaderFilter{Typed: true, Headers: map[string]*string{"n": s("7")}}
	untyped := HeaderFilter{Headers: map[string]*string{"n": s("7")}}
	present := HeaderFilter{Typed: true, Headers: map[string]*string{"n": nil}}
	for _, c := range []struct {
		name string
		h    map[string]string
		want [4]bool // intSeven, strSeven, untyped, present
	}{
		{"int 7", map[string]string{"n": "7", TypesHeader: `{"n":"int"}`}, [4]bool{true, false, true, true}},
		{"string 7", map[string]string{"n": "7"}, [4]bool{false, true, true, true}},
		{"float 7", map[string]string{"n": "7", TypesHeader: `{"n":"float"}`}, [4]bool{false, false, true, true}},
		{"another header typed", map[string]string{"n": "7", TypesHeader: `{"m":"int"}`}, [4]bool{false, true, true, true}},
		{"types header not JSON", map[string]string{"n": "7", TypesHeader: `{`}, [4]bool{false, true, true, true}},
		{"types header too long", map[string]string{"n": "7", TypesHeader: `{"n":"int"}` + strings.Repeat(" ", MaxTypesHeader)}, [4]bool{false, true, true, true}},
		{"int 8", map[string]string{"n": "8", TypesHeader: `{"n":"int"}`}, [4]bool{false, false, false, true}},
	} {
		for i, f := range []HeaderFilter{intSeven, strSeven, untyped, present} {
			if got := f.admits(c.h); got != c.want[i] {
				t.Errorf("%s: filter %+v admits %v: %v, want %v", c.name, f, c.h, got, c.want[i])
			}
		}
	}
	if intSeven.equal(&strSeven) || strSeven.equal(&untyped) || !intSeven.equal(&intSeven) {
		t.Fatal("filters of other types equal")
	}
	bad := HeaderFilter{Typed: true, Headers: map[string]*string{"n": s("7")}, Types: map[string]string{"m": "int"}}
	if err := checkHeaderFilters([]HeaderFilter{bad}); err == nil {
		t.Fatal("a type of a header the filter does not have accepted")
	}
}

// FuzzHeaderTypes: the types header of a publication is untrusted (any
// publisher sets it): whatever it holds, a typed filter decides without
// panicking, and a value matches only a header of its own text.
func FuzzHeaderTypes(f *testing.F) {
	f.Add(`{"n":"int"}`, "7", "int")
	f.Add(`{"n":"float","m":"int"}`, "7", "")
	f.Add(`{`, "7", "int")
	f.Add(`["n"]`, "", "bool")
	f.Add(`{"n":{"x":1}}`, "7", "int")
	f.Add(`null`, "x", "")
	f.Fuzz(func(t *testing.T, types, value, typ string) {
		want := value
		fl := HeaderFilter{Typed: true, Headers: map[string]*string{"n": &want}}
		if typ != "" {
			fl.Types = map[string]string{"n": typ}
		}
		h := map[string]string{"n": value + "!", TypesHeader: types}
		if fl.admits(h) {
			t.Fatalf("%q admitted a header of another text", types)
		}
		h["n"] = value
		fl.admits(h)
	})
}
