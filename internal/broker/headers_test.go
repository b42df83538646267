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
