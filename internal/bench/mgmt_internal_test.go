package bench

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestScanQueues(t *testing.T) {
	type q struct {
		name  string
		ready int64
	}
	for _, tc := range []struct {
		in   string
		want []q
		bad  bool
	}{
		{in: `[]`},
		{in: ` [{"name":"a","messages_ready":0}] `, want: []q{{"a", 0}}},
		{in: `[{"name":"a.b","messages_ready":12},{"name":"c","messages_ready":3}]`, want: []q{{"a.b", 12}, {"c", 3}}},
		{in: `[{"name":"x\"y","messages_ready":1},{"name":"z","messages_ready":2}]`, want: []q{{`x\"y`, 1}, {"z", 2}}},
		{in: `{"name":"a","messages_ready":0}`, bad: true},
		{in: `[{"messages_ready":0,"name":"a"}]`, bad: true},
		{in: `[{"name":"a","messages_ready":-1}]`, bad: true},
		{in: `[{"name":"a","messages_ready":1,"x":2}]`, bad: true},
		{in: `[{"name":"a","messages_ready":1}{"name":"b","messages_ready":1}]`, bad: true},
	} {
		var got []q
		err := scanQueues([]byte(tc.in), func(name string, ready int64) { got = append(got, q{name, ready}) })
		if tc.bad {
			if err == nil {
				t.Errorf("%s: no error", tc.in)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// check finds a figure out of its bounds, a queue listed twice and a
// missing one; it does not check the hot queues' depths.
func TestMgmtCheck(t *testing.T) {
	st := &mgmtRun{cfg: &Config{}, m: MgmtConfig{Queues: 5, Hot: 1, Idle: 2}, prefix: "p"}
	answer := func(ready ...int) []byte {
		var b strings.Builder
		b.WriteString("[")
		for i, r := range ready {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `{"name":%q,"messages_ready":%d}`, st.queueName(i), r)
		}
		b.WriteString(`,{"name":"other","messages_ready":9}]`)
		return []byte(b.String())
	}
	lo := []int64{0, 2, 3, 4, 4}
	hi := []int64{0, 2, 3, 6, 4}
	st.check(check{body: answer(100, 2, 3, 5, 4), lo: lo, hi: hi})
	if st.checks.Load() != 1 || st.checked.Load() != 4 || st.wrong.Load() != 0 || st.missing.Load() != 0 {
		t.Fatalf("exact answer: checks %d, checked %d, wrong %d, missing %d", st.checks.Load(), st.checked.Load(), st.wrong.Load(), st.missing.Load())
	}
	st.check(check{body: answer(0, 1, 3, 7), lo: lo, hi: hi}) // idle 1 low, 3 over its bound, 4 missing
	if st.wrong.Load() != 2 || st.missing.Load() != 1 {
		t.Errorf("wrong %d, missing %d; want 2 and 1", st.wrong.Load(), st.missing.Load())
	}
	if len(st.firstErrs) != 3 || !strings.Contains(st.firstErrs[0], "idle queue p.q0000001: messages_ready 1, want 2") {
		t.Errorf("notes %q", st.firstErrs)
	}
}

func TestHandlerTimes(t *testing.T) {
	before := []bucket{{0.001, 10}, {0.002, 20}, {0.004, 30}, {math.Inf(1), 30}}
	after := []bucket{{0.001, 60}, {0.002, 110}, {0.004, 129}, {math.Inf(1), 130}}
	h := handlerTimes(before, after) // 100 answers: 50 in 1ms, 40 in 2ms, 9 in 4ms, 1 slower
	if h == nil || h.Count != 100 || h.P50 != 1 || h.P90 != 2 || h.P99 != 4 {
		t.Errorf("handler times %+v", h)
	}
	if handlerTimes(before, before) != nil || handlerTimes(before, after[:2]) != nil {
		t.Errorf("no answers or mismatched buckets gave times")
	}
}
