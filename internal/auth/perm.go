package auth

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Perm is a set of permissions on one exchange.
type Perm uint8

// Permissions, as in RabbitMQ: configure creates and deletes, write sends,
// read receives.
const (
	// Configure allows DECLARE that creates an exchange, DELETE, and
	// attaching as a controller (the owner of a controlled exchange).
	Configure Perm = 1 << iota
	// Write allows PUBLISH and REQUEST (and, for queues, submitting).
	Write
	// Read allows attaching as a handler or subscriber, and SUBSCRIBE
	// (and, for queues, consuming).
	Read

	// All is every permission.
	All = Configure | Write | Read
)

// String returns "configure", "write", "read" or a combination joined
// by "+".
func (p Perm) String() string {
	var names []string
	for _, x := range []struct {
		p    Perm
		name string
	}{{Configure, "configure"}, {Write, "write"}, {Read, "read"}} {
		if p&x.p != 0 {
			names = append(names, x.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "+")
}

// Patterns is a list of exchange-name patterns: dot-separated words where
// `*` matches exactly one word and `#` any number of words, zero included
// (the topic patterns of pub-sub, applied to exchange names). `#` alone
// matches every exchange; an empty list matches none. In JSON it is an
// array of strings; a single string is read as a one-pattern list ("" as
// none), so that RabbitMQ-shaped bodies work.
type Patterns []string

// UnmarshalJSON reads an array of patterns or one pattern.
func (p *Patterns) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		if one == "" {
			*p = Patterns{}
		} else {
			*p = Patterns{one}
		}
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("want a pattern or an array of patterns: %w", err)
	}
	*p = list
	return nil
}

// Permissions are one user's patterns for each permission.
type Permissions struct {
	Configure Patterns `json:"configure"`
	Write     Patterns `json:"write"`
	Read      Patterns `json:"read"`
}

// FullAccess grants every permission on every exchange.
func FullAccess() Permissions {
	return Permissions{Configure: Patterns{"#"}, Write: Patterns{"#"}, Read: Patterns{"#"}}
}

// Check validates every pattern.
func (ps Permissions) Check() error {
	for _, l := range []struct {
		name string
		ps   Patterns
	}{{"configure", ps.Configure}, {"write", ps.Write}, {"read", ps.Read}} {
		for _, p := range l.ps {
			if err := checkPattern(p); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrBadPattern, l.name, err)
			}
		}
	}
	return nil
}

// maxPatternWords and maxPatternHashes bound a pattern's words and its
// '#' words, and so a match's work.
const (
	maxPatternWords  = 32
	maxPatternHashes = 4
)

func checkPattern(p string) error {
	if p == "" || len(p) > 255 {
		return fmt.Errorf("pattern %q must have 1 to 255 bytes", p)
	}
	words := strings.Split(p, ".")
	if len(words) > maxPatternWords {
		return fmt.Errorf("pattern %q has more than %d words", p, maxPatternWords)
	}
	hashes := 0
	for _, w := range words {
		if w == "#" {
			hashes++
		}
		if w == "" {
			return fmt.Errorf("pattern %q has an empty word", p)
		}
		if w != "*" && w != "#" && strings.ContainsAny(w, "*#") {
			return fmt.Errorf("in pattern %q, '*' and '#' must be whole words", p)
		}
	}
	if hashes > maxPatternHashes {
		return fmt.Errorf("pattern %q has more than %d '#' words", p, maxPatternHashes)
	}
	return nil
}

// compiled holds a user's patterns split into words, per permission.
type compiled [3][][]string

func compile(ps Permissions) compiled {
	var c compiled
	for i, l := range []Patterns{ps.Configure, ps.Write, ps.Read} {
		for _, p := range l {
			c[i] = append(c[i], strings.Split(p, "."))
		}
	}
	return c
}

// perms returns the permissions the patterns give on exchange.
func (c *compiled) perms(exchange string) Perm {
	words := strings.Split(exchange, ".")
	var p Perm
	for i, list := range c {
		for _, pat := range list {
			if matchWords(pat, words) {
				p |= 1 << i
				break
			}
		}
	}
	return p
}

// matchWords matches topic-pattern words against name words. A '#' tries
// every split, but patterns are short (≤ 32 words) and checked only when a
// session's cache misses.
func matchWords(pat, name []string) bool {
	for len(pat) > 0 {
		switch pat[0] {
		case "#":
			rest := pat[1:]
			if len(rest) == 0 {
				return true
			}
			for i := 0; i <= len(name); i++ {
				if matchWords(rest, name[i:]) {
					return true
				}
			}
			return false
		case "*":
			if len(name) == 0 {
				return false
			}
		default:
			if len(name) == 0 || name[0] != pat[0] {
				return false
			}
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}
