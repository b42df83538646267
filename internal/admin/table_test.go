package admin

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestAppendString(t *testing.T) {
	for _, s := range []string{"", "plain", `quote " and \ slash`, "tab\tnew\nline\r", "\x00\x01\x1f\x7f", "héllo wörld ✓",
		"bad \xff utf8", "line\u2028sep\u2029", "<html>&amp;"} {
		b := appendString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Errorf("appendString(%q) = %s: %v", s, b, err)
			continue
		}
		want := strings.ToValidUTF8(s, "\ufffd")
		if back != want {
			t.Errorf("appendString(%q) decodes to %q", s, back)
		}
	}
}

func TestAppendFloat(t *testing.T) {
	for f, want := range map[float64]string{0: "0.0", 1: "1.0", 2.5: "2.5", 1.0 / 3: "0.33", 12345.678: "12345.68", -1.5: "-1.5", 1e20: "100000000000000000000"} {
		if got := string(appendFloat(nil, f)); got != want {
			t.Errorf("appendFloat(%v) = %s, want %s", f, got, want)
		}
	}
}

type testRow struct {
	name string
	n    uint64
	f    float64
	tags []string
}

var testSchema = newSchema("name",
	strField("name", func(r *testRow) string { return r.name }),
	uintField("a.n", func(r *testRow) uint64 { return r.n }),
	floatField("a.b.f", func(r *testRow) float64 { return r.f }),
	uintField("a.m", func(r *testRow) uint64 { return r.n * 2 }),
	rawField("tags", func(b []byte, r *testRow) []byte {
		p, _ := json.Marshal(r.tags)
		return append(b, p...)
	}, func(r *testRow) float64 { return float64(len(r.tags)) }),
	floatField("z.rate", func(r *testRow) float64 { return r.f / 2 }),
)

func TestAppendObject(t *testing.T) {
	r := &testRow{name: "x", n: 3, f: 1.5, tags: []string{"a"}}
	for cols, want := range map[string]string{
		"":            `{"name":"x","a":{"n":3,"b":{"f":1.5},"m":6},"tags":["a"],"z":{"rate":0.75}}`,
		"name":        `{"name":"x"}`,
		"a.b.f":       `{"a":{"b":{"f":1.5}}}`,
		"a.b":         `{"a":{"b":{"f":1.5}}}`,
		"a.m,name":    `{"name":"x","a":{"m":6}}`,
		"a.b.f,a.m":   `{"a":{"b":{"f":1.5},"m":6}}`,
		"z,tags":      `{"tags":["a"],"z":{"rate":0.75}}`,
		"a.n,z.rate":  `{"a":{"n":3},"z":{"rate":0.75}}`,
		"a.b.f,z,a.n": `{"a":{"n":3,"b":{"f":1.5}},"z":{"rate":0.75}}`,
	} {
		var c []string
		if cols != "" {
			c = strings.Split(cols, ",")
		}
		fields, err := testSchema.selectColumns(c)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(appendObject(nil, r, fields)); got != want {
			t.Errorf("columns %q: %s, want %s", cols, got, want)
		}
	}
	for _, bad := range []string{"b", "a.x", "name.x", "a.b.f.g", ""} {
		if _, err := testSchema.selectColumns([]string{bad}); err == nil {
			t.Errorf("column %q accepted", bad)
		}
	}
	for _, bad := range []string{"a", "a.b", "x"} {
		if _, err := testSchema.sortField(bad); err == nil {
			t.Errorf("sort by %q accepted", bad)
		}
	}
}

func TestSchemaContiguous(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("a schema with a parent split in two did not panic")
		}
	}()
	newSchema("x",
		strField("x", func(*testRow) string { return "" }),
		strField("a.p", func(*testRow) string { return "" }),
		strField("b", func(*testRow) string { return "" }),
		strField("a.q", func(*testRow) string { return "" }),
	)
}

// TestSortRows checks the bounded selection against a full stable sort,
// for every limit, both directions, numbers with ties and strings.
func TestSortRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rows := make([]testRow, 300)
	for i := range rows {
		rows[i] = testRow{name: fmt.Sprintf("r%04d", i), n: uint64(rng.IntN(20)), tags: make([]string, rng.IntN(4))}
		rows[i].f = float64(rng.IntN(1000)) / 10
	}
	for _, path := range []string{"a.n", "a.b.f", "tags", "name"} {
		f := testSchema.byPath[path]
		for _, reverse := range []bool{false, true} {
			want := slices.Clone(rows)
			slices.SortStableFunc(want, func(a, b testRow) int {
				if f.num != nil {
					return cmp.Compare(f.num(&a), f.num(&b))
				}
				return cmp.Compare(f.str(&a), f.str(&b))
			})
			if reverse {
				slices.Reverse(want)
			}
			for _, limit := range []int{0, 1, 2, 7, 50, 74, 75, 76, 150, 299, 300, 400} {
				got := sortRows(slices.Clone(rows), f, reverse, limit)
				n := len(want)
				if limit > 0 && limit < n {
					n = limit
				}
				if len(got) != n {
					t.Fatalf("%s reverse=%v limit %d: %d rows", path, reverse, limit, len(got))
				}
				for i := range got {
					if got[i].name != want[i].name {
						t.Fatalf("%s reverse=%v limit %d: row %d is %s, want %s", path, reverse, limit, i, got[i].name, want[i].name)
					}
				}
			}
		}
	}
}

// TestMerge checks merge against sorting, through random rounds of
// objects coming and going.
func TestMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	o := newOrder[string](nil)
	live := map[string]bool{}
	for round := range 200 {
		for range rng.IntN(10) {
			live[fmt.Sprintf("q%03d", rng.IntN(500))] = true
		}
		for k := range live {
			if rng.IntN(8) == 0 {
				delete(live, k)
			}
		}
		var items []string
		for k := range live {
			items = append(items, k)
		}
		rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
		rows, gone := merge(o, items, func(s string) string { return s }, strings.Compare)
		var got []string
		for _, r := range rows {
			got = append(got, r.item)
			if _, known := o.index[r.item]; (r.e != nil) != known || known && r.e.key != r.item {
				t.Fatalf("round %d: %s has entry %v", round, r.item, r.e)
			}
		}
		want := slices.Sorted(slices.Values(items))
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: merged %v\nwant %v", round, got, want)
		}
		for _, e := range gone {
			if live[e.key] {
				t.Fatalf("round %d: %s reported gone but live", round, e.key)
			}
		}
		if len(rows)-countEntries(rows) != len(items)-(len(o.list)-len(gone)) {
			t.Fatalf("round %d: fresh count wrong", round)
		}
		// The next order, as the sampler builds it.
		list := make([]*entry[string], len(rows))
		for i, r := range rows {
			list[i] = r.e
			if list[i] == nil {
				list[i] = &entry[string]{key: r.item}
			}
		}
		o = newOrder(list)
	}
}

func countEntries(rows []row[string, string]) int {
	n := 0
	for _, r := range rows {
		if r.e != nil {
			n++
		}
	}
	return n
}

func TestContainsFold(t *testing.T) {
	for _, c := range []struct {
		s, sub string
		want   bool
	}{{"News.EU", "news", true}, {"abc", "", true}, {"abc", "abcd", false}, {"xxABc", "abc", true}, {"ab", "b", true}, {"ab", "c", false}} {
		if got := containsFold(c.s, c.sub); got != c.want {
			t.Errorf("containsFold(%q, %q) = %v", c.s, c.sub, got)
		}
	}
}
