package broker

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func fakeMember(id string) *Attachment { return &Attachment{member: id} }

func TestTopicMatch(t *testing.T) {
	cases := []struct {
		pattern, key string
		want         bool
	}{
		{"a.b.c", "a.b.c", true},
		{"a.b.c", "a.b", false},
		{"a.b.c", "a.b.c.d", false},
		{"a.b.c", "a.b.x", false},
		{"*", "a", true},
		{"*", "a.b", false},
		{"*.*", "a.b", true},
		{"*.*", "a", false},
		{"a.*.c", "a.x.c", true},
		{"a.*.c", "a.c", false},
		{"a.*.c", "a.x.y.c", false},
		{"#", "a", true},
		{"#", "a.b.c", true},
		{"a.#", "a", true}, // '#' matches zero words
		{"a.#", "a.b", true},
		{"a.#", "a.b.c", true},
		{"a.#", "b.a", false},
		{"a.#", "ab", false},
		{"#.c", "c", true},
		{"#.c", "a.b.c", true},
		{"#.c", "c.a", false},
		{"a.#.c", "a.c", true},
		{"a.#.c", "a.b.c", true},
		{"a.#.c", "a.b.d.c", true},
		{"a.#.c", "a.c.c", true},
		{"a.#.c", "a.b.d", false},
		{"a.#.c", "a.c.d", false},
		{"a.#.c", "b.c", false},
		{"a.*.#", "a", false},
		{"a.*.#", "a.b", true},
		{"a.*.#", "a.b.c.d", true},
		{"#.b.#", "b", true},
		{"#.b.#", "a.b.c", true},
		{"#.b.#", "a.c", false},
		{"#.#", "a", true},
		{"*.#.*", "a", false},
		{"*.#.*", "a.b", true},
		{"*.#.*", "a.b.c.d", true},
		{"a.#.#.b", "a.b", true},
		{"a.#.#.b", "a.x.y.z.b", true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s~%s", tc.pattern, tc.key), func(t *testing.T) {
			if err := checkPattern(tc.pattern); err != nil {
				t.Fatalf("checkPattern: %v", err)
			}
			tr := newTopicTree()
			a := fakeMember("s")
			tr.insert(tc.pattern, a)
			got := tr.match(tc.key, nil)
			if want := tc.want; (len(got) == 1) != want || len(got) > 1 {
				t.Fatalf("pattern %q, key %q: matched %d subscribers, want match=%v", tc.pattern, tc.key, len(got), want)
			}
		})
	}
}

func TestTopicMatchOnce(t *testing.T) {
	tr := newTopicTree()
	a, b := fakeMember("a"), fakeMember("b")
	for _, p := range []string{"x.*", "x.#", "#", "#.y", "x.y"} {
		tr.insert(p, a)
	}
	tr.insert("x.y", a) // a second insert of one pattern is ignored
	tr.insert("z.*", b)
	if got := tr.match("x.y", nil); !slices.Equal(got, []*Attachment{a}) {
		t.Fatalf("match x.y = %v, want a once", names(got))
	}
	if got := tr.match("z.q", nil); len(got) != 2 {
		t.Fatalf("match z.q = %v, want a (#) and b", names(got))
	}
	// Many overlapping subscribers take the map path of dedupe.
	for i := range 40 {
		m := fakeMember(fmt.Sprint(i))
		tr.insert("k.#", m)
		tr.insert("k.*", m)
		tr.insert("#.v", m)
	}
	got := tr.match("k.v", nil)
	if len(got) != 41 { // 40 plus a's "#"
		t.Fatalf("match k.v gave %d subscribers, want 41", len(got))
	}
	seen := map[*Attachment]bool{}
	for _, m := range got {
		if seen[m] {
			t.Fatalf("%s matched twice", m.member)
		}
		seen[m] = true
	}
	if all := tr.all(); len(all) != 42 {
		t.Fatalf("all() = %d subscribers, want 42", len(all))
	}
}

func TestTopicRemove(t *testing.T) {
	tr := newTopicTree()
	a, b := fakeMember("a"), fakeMember("b")
	tr.insert("x.*", a)
	tr.insert("x.#", a)
	tr.insert("x.*", b)
	tr.remove("x.*", a)
	if got := tr.match("x.y", nil); len(got) != 2 {
		t.Fatalf("after removing one of a's patterns: %v, want a (x.#) and b", names(got))
	}
	tr.remove("x.#", a)
	if got := tr.match("x.y", nil); !slices.Equal(got, []*Attachment{b}) {
		t.Fatalf("after removing a: %v, want b", names(got))
	}
	tr.remove("no.such.#", a) // unknown patterns are ignored
	tr.remove("x.*", b)
	if got := tr.match("x.y", nil); len(got) != 0 {
		t.Fatalf("after removing all: %v", names(got))
	}
}

func TestCheckPattern(t *testing.T) {
	good := []string{"a", "a.b", "*", "#", "a.*.#", "#.#.#.#", "a-b_c:d"}
	for _, p := range good {
		if err := checkPattern(p); err != nil {
			t.Errorf("checkPattern(%q) = %v", p, err)
		}
	}
	long := ""
	for range 33 {
		long += "w."
	}
	bad := []string{"", "a*", "a.b#", "#a", "*.x*", "#.#.#.#.#", long + "w", string(make([]byte, 256))}
	for _, p := range bad {
		if err := checkPattern(p); !errors.Is(err, errBadPattern) {
			t.Errorf("checkPattern(%q) = %v, want errBadPattern", p, err)
		}
	}
}

func names(as []*Attachment) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.member
	}
	return out
}
