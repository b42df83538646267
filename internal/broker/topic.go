package broker

import (
	"fmt"
	"slices"
	"strings"
)

// topicTree matches routing keys against AMQP-style patterns: words are
// separated by '.', '*' matches exactly one word and '#' any number of
// words, zero included.
type topicTree struct {
	root *topicNode
}

type topicNode struct {
	children map[string]*topicNode
	star     *topicNode
	hash     *topicNode
	subs     []*Attachment
}

func newTopicTree() *topicTree { return &topicTree{root: &topicNode{}} }

// maxPatternWords bounds the words of a pattern, and so the matcher's work.
const maxPatternWords = 32

// checkPatterns validates subscription patterns.
func checkPatterns(patterns []string) error {
	for _, p := range patterns {
		if err := checkPattern(p); err != nil {
			return err
		}
	}
	return nil
}

func checkPattern(p string) error {
	if p == "" || len(p) > 255 {
		return fmt.Errorf("%w: pattern %q must have 1 to 255 bytes", errBadPattern, p)
	}
	words := strings.Split(p, ".")
	if len(words) > maxPatternWords {
		return fmt.Errorf("%w: pattern %q has more than %d words", errBadPattern, p, maxPatternWords)
	}
	hashes := 0
	for _, w := range words {
		if w == "#" {
			hashes++
		}
		if w == "" {
			return fmt.Errorf("%w: pattern %q has an empty word", errBadPattern, p)
		}
		if w != "*" && w != "#" && strings.ContainsAny(w, "*#") {
			return fmt.Errorf("%w: in pattern %q, '*' and '#' must be whole words", errBadPattern, p)
		}
	}
	if hashes > 4 {
		return fmt.Errorf("%w: pattern %q has more than 4 '#' words", errBadPattern, p)
	}
	return nil
}

func (t *topicTree) insert(pattern string, a *Attachment) {
	n := t.root
	for w := range strings.SplitSeq(pattern, ".") {
		var next **topicNode
		switch w {
		case "*":
			next = &n.star
		case "#":
			next = &n.hash
		default:
			if n.children == nil {
				n.children = make(map[string]*topicNode)
			}
			c := n.children[w]
			if c == nil {
				c = &topicNode{}
				n.children[w] = c
			}
			n = c
			continue
		}
		if *next == nil {
			*next = &topicNode{}
		}
		n = *next
	}
	if !slices.Contains(n.subs, a) {
		n.subs = append(n.subs, a)
	}
}

func (t *topicTree) remove(pattern string, a *Attachment) {
	n := t.root
	for w := range strings.SplitSeq(pattern, ".") {
		switch w {
		case "*":
			n = n.star
		case "#":
			n = n.hash
		default:
			n = n.children[w]
		}
		if n == nil {
			return
		}
	}
	if i := slices.Index(n.subs, a); i >= 0 {
		n.subs = slices.Delete(slices.Clone(n.subs), i, i+1)
	}
	// Empty nodes stay; they are few and reused by the next subscriber.
}

// match appends the attachments whose patterns match key, each once.
func (t *topicTree) match(key string, out []*Attachment) []*Attachment {
	words := strings.Split(key, ".")
	out = t.root.match(words, out)
	return dedupe(out)
}

func (n *topicNode) match(words []string, out []*Attachment) []*Attachment {
	if len(words) == 0 {
		out = append(out, n.subs...)
		if n.hash != nil {
			out = n.hash.match(words, out)
		}
		return out
	}
	if c := n.children[words[0]]; c != nil {
		out = c.match(words[1:], out)
	}
	if n.star != nil {
		out = n.star.match(words[1:], out)
	}
	if n.hash != nil {
		for k := 0; k <= len(words); k++ {
			out = n.hash.match(words[k:], out)
		}
	}
	return out
}

func dedupe(list []*Attachment) []*Attachment {
	if len(list) < 2 {
		return list
	}
	if len(list) <= 16 {
		out := list[:0]
		for _, a := range list {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
		return out
	}
	seen := make(map[*Attachment]struct{}, len(list))
	out := list[:0]
	for _, a := range list {
		if _, ok := seen[a]; !ok {
			seen[a] = struct{}{}
			out = append(out, a)
		}
	}
	return out
}

// all returns every subscribed attachment once.
func (t *topicTree) all() []*Attachment {
	var out []*Attachment
	var walk func(n *topicNode)
	walk = func(n *topicNode) {
		out = append(out, n.subs...)
		for _, c := range n.children {
			walk(c)
		}
		if n.star != nil {
			walk(n.star)
		}
		if n.hash != nil {
			walk(n.hash)
		}
	}
	walk(t.root)
	seen := make(map[*Attachment]bool)
	return slices.DeleteFunc(out, func(a *Attachment) bool {
		dup := seen[a]
		seen[a] = true
		return dup
	})
}
