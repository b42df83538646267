package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/courier-mq/courier/wire"
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
		// Keys split as RabbitMQ splits them (see keyWords): the empty
		// key is zero words, and every '.' separates two words, empty
		// ones included.
		{"*", "", false},
		{"#", "", true},
		{"#.#", "", true},
		{"a.#", "", false},
		{"#.a", "", false},
		{"*.#", "", false},
		{"*", ".", false},
		{"*.*", ".", true},
		{"#", ".", true},
		{"*.*", "..", false},
		{"*.*.*", "..", true},
		{"a.*.b", "a..b", true},
		{"a.b", "a..b", false},
		{"a.#.b", "a..b", true},
		{"*.*.*", "a..b", true},
		{"a.*", "a.", true},
		{"a.#", "a.", true},
		{"a", "a.", false},
		{"*.a", ".a", true},
		{"#.a", ".a", true},
		{"a", ".a", false},
		{"a.#", ".a", false},
		{"*", "ab", true},
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
			if got := dedupe(tr.scan(tc.key, nil)); (len(got) == 1) != tc.want || len(got) > 1 {
				t.Fatalf("scan: pattern %q, key %q: matched %d subscribers, want match=%v", tc.pattern, tc.key, len(got), tc.want)
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

// refMatch is the AMQP topic rule written plainly, as the reference the
// tree is held to.
func refMatch(pattern, key []string) bool {
	if len(pattern) == 0 {
		return len(key) == 0
	}
	switch pattern[0] {
	case "#":
		for i := 0; i <= len(key); i++ {
			if refMatch(pattern[1:], key[i:]) {
				return true
			}
		}
		return false
	case "*":
		return len(key) > 0 && refMatch(pattern[1:], key[1:])
	}
	return len(key) > 0 && key[0] == pattern[0] && refMatch(pattern[1:], key[1:])
}

// TestTopicWalkAndScan holds both matchers of the tree, the walk and the
// scan, to refMatch over random patterns and keys, empty words and the
// empty key among them.
func TestTopicWalkAndScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 5))
	randWords := func(n int, from []string) []string {
		w := make([]string, n)
		for i := range w {
			w[i] = from[rng.IntN(len(from))]
		}
		return w
	}
	for round := range 300 {
		tr := newTopicTree()
		var patterns [][]string
		var subs []*Attachment
		for i := range 1 + rng.IntN(12) {
			p := randWords(1+rng.IntN(5), []string{"a", "b", "*", "#"})
			if strings.Count(strings.Join(p, "."), "#") > 4 {
				continue
			}
			a := fakeMember(fmt.Sprint(i))
			tr.insert(strings.Join(p, "."), a)
			patterns, subs = append(patterns, p), append(subs, a)
		}
		for range 20 {
			key := strings.Join(randWords(rng.IntN(8), []string{"a", "b", ""}), ".")
			var want []string
			for i, p := range patterns {
				if refMatch(p, keyWords(key)) {
					want = append(want, subs[i].member)
				}
			}
			slices.Sort(want)
			budget := 1 << 30
			walked, ok := tr.root.walk(keyWords(key), nil, &budget)
			if !ok {
				t.Fatal("walk ran out of an unbounded budget")
			}
			for name, got := range map[string][]*Attachment{"walk": dedupe(walked), "scan": dedupe(tr.scan(key, nil))} {
				g := names(got)
				slices.Sort(g)
				if !slices.Equal(g, want) {
					t.Fatalf("round %d, %s of key %q over %q: %v, want %v", round, name, key, patterns, g, want)
				}
			}
		}
	}
}

// TestTopicManyWords: patterns with several '#' against a key of many
// words made the walk polynomial (four '#', 200 words: 10 s, holding the
// exchange's lock); past its budget the scan answers, in work linear in
// the words. Before the scan this test did not finish.
func TestTopicManyWords(t *testing.T) {
	tr := newTopicTree()
	all, bs, none := fakeMember("all"), fakeMember("bs"), fakeMember("none")
	tr.insert("#.#.#.#", all)
	tr.insert("#.b.#.b.#.b.#.b", bs)
	tr.insert("#.b.#.b.#.b.#.c", none)
	tr.insert("*.#.#.*.#.x", none)
	// Each of these keeps two '#' states of its own in the scan: more
	// than a set holds before it takes a map.
	stars := fakeMember("stars")
	for i := 1; i <= 30; i++ {
		tr.insert("#"+strings.Repeat(".*", i)+".#", stars)
	}
	key := strings.Repeat("b.", 20000) + "b"
	budget := maxWalk
	if _, ok := tr.root.walk(keyWords(key), nil, &budget); ok {
		t.Fatal("the walk of 20,001 words stayed within its budget: this test no longer tests the scan")
	}
	// A key over maxCachedKey goes to the scan at once; a shorter one
	// after the walk ran out of its budget.
	short := strings.Repeat("b.", 99) + "b"
	if len(short) > maxCachedKey {
		t.Fatalf("the short key has %d bytes", len(short))
	}
	budget = maxWalk
	if _, ok := tr.root.walk(keyWords(short), nil, &budget); ok {
		t.Fatal("the walk of 100 words stayed within its budget")
	}
	for _, k := range []string{key, short} {
		got := names(tr.match(k, nil))
		slices.Sort(got)
		if !slices.Equal(got, []string{"all", "bs", "stars"}) {
			t.Fatalf("key of %d bytes matched %v, want all, bs and stars", len(k), got)
		}
	}
}

func TestKeyWords(t *testing.T) {
	cases := []struct {
		key  string
		want []string
	}{
		{"", nil},
		{"a", []string{"a"}},
		{"a.b", []string{"a", "b"}},
		{".", []string{"", ""}},
		{"a..b", []string{"a", "", "b"}},
		{".a", []string{"", "a"}},
		{"a.", []string{"a", ""}},
		{"..", []string{"", "", ""}},
	}
	for _, tc := range cases {
		if got := keyWords(tc.key); !slices.Equal(got, tc.want) || len(got) != len(tc.want) {
			t.Errorf("keyWords(%q) = %q (%d words), want %q", tc.key, got, len(got), tc.want)
		}
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
	bad := []string{"", "a..b", ".a", "a.", ".", "a*", "a.b#", "#a", "*.x*", "#.#.#.#.#", long + "w", string(make([]byte, 256))}
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

// TestLongKeysNotCached: the cache of matches per key keeps keys of up
// to maxCachedKey bytes, so that its memory does not grow with the frame
// size (16,384 keys of 4 MiB would be 64 GiB); longer keys are matched
// each time, and still delivered.
func TestLongKeysNotCached(t *testing.T) {
	br := New(Config{Log: slog.New(slog.DiscardHandler)})
	defer br.Close()
	pub := br.Open(&holdSink{}, "publisher")
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternPubSub})
	pub.Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "long", Body: cfg})
	sink := &holdSink{}
	sub := br.Open(sink, "subscriber")
	spec, _ := json.Marshal(wire.AttachSpec{Patterns: []string{"a.#"}})
	sub.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "long", Aux: wire.RoleSubscriber, Body: spec})
	ex := br.Exchange("long")
	for _, key := range []string{"a.short", "a." + strings.Repeat("x", maxCachedKey), "a." + strings.Repeat("y.", 10000)} {
		f := wire.NewFrame(wire.TypePublish)
		f.Name, f.Key = "long", key
		pub.Handle(f)
		if sink.last == nil || sink.last.Type != wire.TypeMessage || sink.last.Key != key {
			t.Fatalf("key of %d bytes not delivered", len(key))
		}
	}
	ex.subMu.RLock()
	n := len(ex.cache)
	ex.subMu.RUnlock()
	if n != 1 {
		t.Fatalf("the cache holds %d keys, want only the short one", n)
	}
}
