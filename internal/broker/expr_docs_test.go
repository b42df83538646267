package broker

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/courier-mq/courier/wire"
)

// documentedExprs are the expressions the documentation shows beside the
// examples of docs/protocol.md §5.1, which the test reads from the file:
// text is how the file spells src; key marks a key expression.
var documentedExprs = []struct {
	file, text, src string
	key             bool
}{
	{file: "README.md", src: `headers["user"]`, key: true},
	{file: "README.md", src: `{"tag": "eu"}`},
	{file: "README.md", src: `{"redirect": "users.v2"}`},
	{file: "README.md", src: `{"reject": "too big"}`},
	{file: "README.md", src: `{"key": key + "!", "headers": {"via": "route"}}`},
	{file: "exchange.go", src: `headers["user"]`, key: true},
	{file: "exchange.go", src: `size > 1000 ? {"reject": "too big"} : {"tag": "eu"}`},
	{file: "docs/protocol.md", text: `"key_expr":"headers[\"tenant\"]"`, src: `headers["tenant"]`, key: true},
	{file: "docs/operations.md", src: `key + ":" + tag`, key: true},
}

// docInputs are requests of every shape a documented expression should
// handle: a dotted key and the headers the examples read, then a key
// without a dot and no headers, then empty. A request always has a
// handler: one without fails before any expression runs.
func docInputs() []*RouteInput {
	return []*RouteInput{
		{Key: "Eu.k1", Size: 10, Header: map[string]string{"to": "v2", "user": "ann", "tenant": "acme", "region": "eu"},
			Members: []wire.Member{{ID: "c1.1", ServiceTag: "eu"}, {ID: "c2.1", ServiceTag: "us"}}},
		{Key: "plain", Size: 5000, Header: map[string]string{}, Members: []wire.Member{{ID: "c3.1"}}},
		{Members: []wire.Member{{ID: "c4.1", ConnTag: "x"}}},
	}
}

// protocolExamples returns the examples of docs/protocol.md §5.1: the
// lines of the code block after "Examples:".
func protocolExamples(t *testing.T) []string {
	t.Helper()
	doc := readRepoFile(t, "docs/protocol.md")
	sec := doc[strings.Index(doc, "### 5.1 "):]
	i := strings.Index(sec, "Examples:\n\n```\n")
	if i < 0 {
		t.Fatal(`docs/protocol.md §5.1: no "Examples:" code block`)
	}
	block := sec[i+len("Examples:\n\n```\n"):]
	block = block[:strings.Index(block, "```")]
	var list []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			list = append(list, l)
		}
	}
	if len(list) == 0 {
		t.Fatal("docs/protocol.md §5.1: no examples")
	}
	return list
}

func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	p, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return string(p)
}

// TestExprDocumented: every expression the documentation shows compiles
// under the default limits and runs on requests of every shape. A route
// expression must give a route, never an error (which fails the request
// with code 10); a key expression, a key on a request with the headers
// it reads, and never a limit. Before, §5.1's `key.substring(0,
// key.indexOf("."))` failed on any key without a dot, and README's
// `{"key": "...", "headers": {...}}` did not compile.
func TestExprDocumented(t *testing.T) {
	type doc struct {
		where, src string
		key        bool
	}
	var docs []doc
	for _, src := range protocolExamples(t) {
		docs = append(docs, doc{"docs/protocol.md §5.1", src, false})
	}
	for _, d := range documentedExprs {
		text := d.text
		if text == "" {
			text = d.src
		}
		if !strings.Contains(readRepoFile(t, d.file), text) {
			t.Errorf("%s no longer shows %s: update documentedExprs", d.file, text)
			continue
		}
		docs = append(docs, doc{d.file, d.src, d.key})
	}
	for _, d := range docs {
		e, err := compileExpr(d.src, defaultLimits)
		if err != nil {
			t.Errorf("%s: %s: %v", d.where, d.src, err)
			continue
		}
		for i, in := range docInputs() {
			vars := &exprVars{in: in}
			if d.key {
				k, err := e.key(vars, 0)
				var le *exprLimitError
				if errors.As(err, &le) || (i == 0 && (err != nil || k == "")) {
					t.Errorf("%s: key %s on request %d: %q, %v", d.where, d.src, i, k, err)
				}
				continue
			}
			if _, err := e.route(vars, 0); err != nil {
				t.Errorf("%s: route %s on request %d (key %q): %v", d.where, d.src, i, in.Key, err)
			}
		}
	}
}
