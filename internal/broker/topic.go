package broker

import (
	"fmt"
	"slices"
	"strings"
)

// topicTree matches routing keys against AMQP-style patterns: words are
// separated by '.', '*' matches exactly one word and '#' any number of
// words, zero included. Keys split into words as RabbitMQ's topic
// exchange splits them (see [keyWords]). A node no pattern uses any more
// is pruned, so
// that the tree's memory follows the patterns subscribed now, not the
// most it ever held.
type topicTree struct {
	root   *topicNode
	nodes  int // nodes besides the root
	mapped int // of them, those in a map of children
}

// topicNode is one word of one or more patterns. Its first child by word
// is kept inline (word, child): most nodes are links in a chain of one
// pattern's words, and a map for one entry would triple their size.
// Further children go to the map.
type topicNode struct {
	word     string
	child    *topicNode
	children map[string]*topicNode
	peak     int // the most entries children held since it was made
	star     *topicNode
	hash     *topicNode
	subs     []*Attachment
}

func newTopicTree() *topicTree { return &topicTree{root: &topicNode{}} }

// get returns the child of word w, or nil.
func (n *topicNode) get(w string) *topicNode {
	if n.child != nil && n.word == w {
		return n.child
	}
	return n.children[w]
}

// put adds the child c of word w; it returns 1 if c went to the map.
func (n *topicNode) put(w string, c *topicNode) int {
	if n.child == nil {
		n.word, n.child = w, c
		return 0
	}
	if n.children == nil {
		n.children = make(map[string]*topicNode)
	}
	n.children[w] = c
	n.peak = max(n.peak, len(n.children))
	return 1
}

// minShrink is the size from which a map of children that lost three
// quarters of its peak is made anew: a Go map keeps the room of its peak
// after deletes.
const minShrink = 64

// del removes the child of word w; it returns 1 if it was in the map.
func (n *topicNode) del(w string) int {
	if n.child != nil && n.word == w {
		n.word, n.child = "", nil
		return 0
	}
	delete(n.children, w)
	switch l := len(n.children); {
	case l == 0:
		n.children, n.peak = nil, 0
	case n.peak >= minShrink && l <= n.peak/4:
		m := make(map[string]*topicNode, l)
		for k, v := range n.children {
			m[k] = v
		}
		n.children, n.peak = m, l
	}
	return 1
}

func (n *topicNode) empty() bool {
	return n.child == nil && len(n.children) == 0 && n.star == nil && n.hash == nil && len(n.subs) == 0
}

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

// insert subscribes a to pattern, a valid pattern; it reports whether a
// was not subscribed to it yet.
func (t *topicTree) insert(pattern string, a *Attachment) bool {
	n := t.root
	for w := range strings.SplitSeq(pattern, ".") {
		var c *topicNode
		switch w {
		case "*":
			if n.star == nil {
				n.star = t.newNode()
			}
			c = n.star
		case "#":
			if n.hash == nil {
				n.hash = t.newNode()
			}
			c = n.hash
		default:
			if c = n.get(w); c == nil {
				c = t.newNode()
				t.mapped += n.put(w, c)
			}
		}
		n = c
	}
	if slices.Contains(n.subs, a) {
		return false
	}
	n.subs = append(n.subs, a)
	return true
}

func (t *topicTree) newNode() *topicNode {
	t.nodes++
	return &topicNode{}
}

// has reports whether a is subscribed to pattern.
func (t *topicTree) has(pattern string, a *Attachment) bool {
	n := t.root
	for w := range strings.SplitSeq(pattern, ".") {
		if n = n.next(w); n == nil {
			return false
		}
	}
	return slices.Contains(n.subs, a)
}

// next follows the word w of a pattern.
func (n *topicNode) next(w string) *topicNode {
	switch w {
	case "*":
		return n.star
	case "#":
		return n.hash
	}
	return n.get(w)
}

// remove unsubscribes a from pattern, and prunes the nodes that no
// pattern uses any more. It reports whether a was subscribed to it.
func (t *topicTree) remove(pattern string, a *Attachment) bool {
	var path [maxPatternWords + 1]*topicNode
	var words [maxPatternWords]string
	path[0] = t.root
	depth := 0
	for w := range strings.SplitSeq(pattern, ".") {
		if depth == maxPatternWords {
			return false
		}
		c := path[depth].next(w)
		if c == nil {
			return false
		}
		words[depth] = w
		depth++
		path[depth] = c
	}
	n := path[depth]
	i := slices.Index(n.subs, a)
	if i < 0 {
		return false
	}
	// In place: match copies subs, it never keeps them.
	if n.subs = slices.Delete(n.subs, i, i+1); len(n.subs) == 0 {
		n.subs = nil
	}
	for d := depth; d > 0 && path[d].empty(); d-- {
		parent, w := path[d-1], words[d-1]
		switch w {
		case "*":
			parent.star = nil
		case "#":
			parent.hash = nil
		default:
			t.mapped -= parent.del(w)
		}
		t.nodes--
	}
	return true
}

// match appends the attachments whose patterns match key, each once.
//
// It walks the tree word by word first, which is fastest for the keys
// and patterns of real use. That walk explores a '#' once per number of
// words it may take, so patterns with several '#' against a key of many
// words make it polynomial (four '#' against 200 words took 10 s); past
// a budget of nodes visited, match starts again with [topicTree.scan],
// which visits each node at most once per word of the key. A key longer
// than maxCachedKey goes to the scan at once, without the walk's slice
// of words.
func (t *topicTree) match(key string, out []*Attachment) []*Attachment {
	if len(key) > maxCachedKey {
		return dedupe(t.scan(key, out))
	}
	n0 := len(out)
	budget := maxWalk
	var ok bool
	if out, ok = t.root.walk(keyWords(key), out, &budget); !ok {
		out = t.scan(key, out[:n0])
	}
	return dedupe(out)
}

// maxWalk bounds the nodes [topicNode.walk] visits before [topicTree.scan]
// takes over.
const maxWalk = 4096

// keyWords splits a routing key into its words as RabbitMQ's topic
// exchange does: the empty key is zero words, so '*' does not match it
// and '#' does; any other key is cut at every '.', and the words between
// two dots, before a leading dot or after a trailing one are empty words,
// which '*' matches. So "a..b" is the three words "a", "" and "b", ".a"
// is "" and "a", and "." is two empty words.
func keyWords(key string) []string {
	if key == "" {
		return nil
	}
	return strings.Split(key, ".")
}

// walk appends the subscribers of the patterns under n that match words;
// it reports false, with a partial out, once it visited budget nodes.
func (n *topicNode) walk(words []string, out []*Attachment, budget *int) ([]*Attachment, bool) {
	if *budget--; *budget < 0 {
		return out, false
	}
	ok := true
	if len(words) == 0 {
		out = append(out, n.subs...)
		if n.hash != nil {
			out, ok = n.hash.walk(words, out, budget)
		}
		return out, ok
	}
	if c := n.get(words[0]); c != nil {
		out, ok = c.walk(words[1:], out, budget)
	}
	if n.star != nil && ok {
		out, ok = n.star.walk(words[1:], out, budget)
	}
	if n.hash != nil {
		for k := 0; k <= len(words) && ok; k++ {
			out, ok = n.hash.walk(words[k:], out, budget)
		}
	}
	return out, ok
}

// scanState is a node that the words of a key read so far lead to; hash
// is set for a '#' node, which may take the next word too.
type scanState struct {
	n    *topicNode
	hash bool
}

// scan matches key as a set of states advanced one word at a time (the
// tree as a nondeterministic automaton): each state is kept once per
// word, so the work is at most the nodes of the tree times the words of
// the key, and the memory two sets of nodes.
func (t *topicTree) scan(key string, out []*Attachment) []*Attachment {
	var cur, next scanSet
	cur.add(scanState{n: t.root})
	rest, more := key, key != ""
	for more && len(cur.list) > 0 {
		var w string
		w, rest, more = strings.Cut(rest, ".")
		next.reset()
		for _, s := range cur.list {
			if c := s.n.get(w); c != nil {
				next.add(scanState{n: c})
			}
			if s.n.star != nil {
				next.add(scanState{n: s.n.star})
			}
			if s.hash {
				next.add(s)
			}
		}
		cur, next = next, cur
	}
	for _, s := range cur.list {
		out = append(out, s.n.subs...)
	}
	return out
}

// scanSet is a set of states. Only '#' states can be reached twice in
// one word (by taking it, and from their parent taking none), so only
// they are looked up.
type scanSet struct {
	list []scanState
	seen map[*topicNode]struct{} // the '#' states, once there are many
}

func (ss *scanSet) reset() {
	ss.list = ss.list[:0]
	clear(ss.seen)
}

// add adds s and, as a '#' may take no word, the '#' below it.
func (ss *scanSet) add(s scanState) {
	for {
		if s.hash && ss.has(s.n) {
			return
		}
		ss.list = append(ss.list, s)
		if s.n.hash == nil {
			return
		}
		s = scanState{n: s.n.hash, hash: true}
	}
}

// has reports whether the '#' node n is in the set, and puts it there.
func (ss *scanSet) has(n *topicNode) bool {
	if ss.seen == nil && len(ss.list) < 32 {
		return slices.ContainsFunc(ss.list, func(s scanState) bool { return s.n == n })
	}
	if ss.seen == nil {
		ss.seen = make(map[*topicNode]struct{}, len(ss.list))
		for _, s := range ss.list {
			if s.hash {
				ss.seen[s.n] = struct{}{}
			}
		}
	}
	if _, ok := ss.seen[n]; ok {
		return true
	}
	ss.seen[n] = struct{}{}
	return false
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
		if n.child != nil {
			walk(n.child)
		}
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
