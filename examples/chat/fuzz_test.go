package main

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseLine: whatever a page sends to chat.say, parseLine returns
// quickly, and a line it accepts has a valid author, a bounded text that
// stays valid UTF-8 when it was, and a time.
func FuzzParseLine(f *testing.F) {
	f.Add([]byte(`{"from":"alice","text":"hello","ts":1}`))
	f.Add([]byte(`{"from":"a.b","text":"x"}`))
	f.Add([]byte(`{"from":"bob","text":"` + strings.Repeat("é", 1500) + `"}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, body []byte) {
		l, ok := parseLine(body)
		if !ok {
			return
		}
		if !validName(l.From) || len(l.Text) > maxText || l.TS <= 0 {
			t.Fatalf("accepted %+v", l)
		}
		var raw Line
		if json.Unmarshal(body, &raw) == nil && utf8.ValidString(raw.Text) && !utf8.ValidString(l.Text) {
			t.Fatalf("cut %q into invalid UTF-8", raw.Text)
		}
	})
}

// TestParseLine: the cut keeps a rune whole.
func TestParseLine(t *testing.T) {
	l, ok := parseLine([]byte(`{"from":"bob","text":"x` + strings.Repeat("é", 1500) + `"}`))
	if !ok || len(l.Text) > maxText || !utf8.ValidString(l.Text) || l.TS == 0 {
		t.Fatalf("%v %d bytes valid=%v", ok, len(l.Text), utf8.ValidString(l.Text))
	}
	if _, ok := parseLine([]byte(`{"from":"","text":"x"}`)); ok {
		t.Fatal("a line without an author accepted")
	}
}
