package wire

// Tests that hold docs/protocol.md to the code: its byte-level examples
// decode to what their annotations say, its table of error codes is the
// set of Code constants with their names, and its links and section
// references resolve. A client is written from that document alone.

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

const protocolDoc = "../docs/protocol.md"

// docLine is one line of a markdown document outside code blocks, or a
// code block as a whole.
type docLine struct {
	no   int      // 1-based line number (of the opening fence for a block)
	text string   // the line; empty for a block
	code []string // the lines of a code block
}

// readDoc splits a markdown file into prose lines and code blocks.
func readDoc(t *testing.T, path string) []docLine {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []docLine
	var block *docLine
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(l, "```") && block == nil:
			block = &docLine{no: i + 1, code: []string{}}
		case strings.HasPrefix(l, "```"):
			out = append(out, *block)
			block = nil
		case block != nil:
			block.code = append(block.code, l)
		default:
			out = append(out, docLine{no: i + 1, text: l})
		}
	}
	if block != nil {
		t.Fatalf("%s:%d: code block not closed", path, block.no)
	}
	return out
}

// exampleLine is one line of a frame example: its bytes and what the
// document says they are.
type exampleLine struct {
	no    int
	bytes []byte
	says  string
}

var hexByte = regexp.MustCompile(`^[0-9a-f]{2}$`)

// parseExample reads a code block whose lines are hex bytes followed by
// their annotation; ok is false if the block is not a frame example (its
// first line is not a length prefix).
func parseExample(block docLine) (lines []exampleLine, ok bool) {
	for i, l := range block.code {
		words := strings.Fields(l)
		n := 0
		for n < len(words) && hexByte.MatchString(words[n]) {
			n++
		}
		if i == 0 && (n != 4 || len(words) < 5 || words[4] != "len") {
			return nil, false
		}
		b, _ := hex.DecodeString(strings.Join(words[:n], ""))
		// The annotation is the rest of the line as written.
		says := l
		for _, w := range words[:n] {
			says = strings.TrimLeft(says, " ")
			says = strings.TrimPrefix(says, w)
		}
		lines = append(lines, exampleLine{no: block.no + 1 + i, bytes: b, says: strings.TrimSpace(says)})
	}
	return lines, true
}

// flagByName and fieldByName name flags and fields as the document does.
var (
	flagByName = map[string]Flags{
		"Fatal": FlagFatal, "Chunk": FlagChunk, "End": FlagEnd, "Error": FlagError,
		"Last": FlagLast, "Reply": FlagReply, "Watch": FlagWatch,
	}
	fieldByName = map[string]uint8{
		"Ref": fRef, "Attach": fAttach, "Aux": fAux, "Name": fName,
		"Key": fKey, "Tag": fTag, "Header": fHeader, "Body": fBody,
	}
)

// names reads "A|B|C" as the OR of the values the names stand for.
func names[V ~uint8](list string, by map[string]V) (V, error) {
	var v V
	for n := range strings.SplitSeq(list, "|") {
		x, ok := by[strings.TrimSpace(n)]
		if !ok {
			return 0, fmt.Errorf("unknown name %q", n)
		}
		v |= x
	}
	return v, nil
}

func uvarintBytes(v uint64) []byte { return binary.AppendUvarint(nil, v) }

func stringBytes(s string) []byte { return append(uvarintBytes(uint64(len(s))), s...) }

var (
	annLen    = regexp.MustCompile(`^len (\d+)$`)
	annType   = regexp.MustCompile(`^type ([A-Z]+)$`)
	annFlags  = regexp.MustCompile(`^flags(?:: ([A-Za-z|]+))?$`)
	annFields = regexp.MustCompile(`^fields: ([A-Za-z|]+)(?: \(.*\))?$`)
	annNumber = regexp.MustCompile(`^(Ref|Attach|Aux) (\d+)(?: \(.*\))?$`)
	annString = regexp.MustCompile(`^(Name|Key|Tag) ("(?:[^"\\]|\\.)*")$`)
	annHeader = regexp.MustCompile(`^Header: (\d+) pairs?$`)
	annPair   = regexp.MustCompile(`^("(?:[^"\\]|\\.)*") = ("(?:[^"\\]|\\.)*")$`)
	annBody   = regexp.MustCompile(`^Body (.+)$`)
)

// checkLine checks that one annotated line of an example says what its
// bytes are, in the frame f they decode to. It returns the fields the
// line shows, for the fields byte to be checked against.
func checkLine(l exampleLine, f *Frame, all []byte) (shows uint8, err error) {
	want := func(b []byte) error {
		if !bytes.Equal(l.bytes, b) {
			return fmt.Errorf("the bytes are % x, but %q is % x", l.bytes, l.says, b)
		}
		return nil
	}
	says := l.says
	switch {
	case annLen.MatchString(says):
		n, _ := strconv.Atoi(annLen.FindStringSubmatch(says)[1])
		if n != len(all)-4 {
			return 0, fmt.Errorf("len %d, but the frame has %d bytes after its length", n, len(all)-4)
		}
		return 0, want(binary.BigEndian.AppendUint32(nil, uint32(n)))
	case annType.MatchString(says):
		if name := annType.FindStringSubmatch(says)[1]; f.Type.String() != name {
			return 0, fmt.Errorf("type %s, but the frame decodes as %s", name, f.Type)
		}
		return 0, want([]byte{byte(f.Type)})
	case annFlags.MatchString(says):
		var fl Flags
		if list := annFlags.FindStringSubmatch(says)[1]; list != "" {
			if fl, err = names(list, flagByName); err != nil {
				return 0, err
			}
		}
		if fl != f.Flags {
			return 0, fmt.Errorf("flags 0x%02x, but the frame decodes with 0x%02x", fl, f.Flags)
		}
		return 0, want([]byte{byte(fl)})
	case annFields.MatchString(says):
		fields, err := names(annFields.FindStringSubmatch(says)[1], fieldByName)
		if err != nil {
			return 0, err
		}
		return 0, want([]byte{fields})
	case annNumber.MatchString(says):
		m := annNumber.FindStringSubmatch(says)
		v, _ := strconv.ParseUint(m[2], 10, 64)
		got := map[string]uint64{"Ref": f.Ref, "Attach": uint64(f.Attach), "Aux": f.Aux}[m[1]]
		if got != v {
			return fieldByName[m[1]], fmt.Errorf("%s %d, but the frame decodes with %d", m[1], v, got)
		}
		return fieldByName[m[1]], want(uvarintBytes(v))
	case annString.MatchString(says):
		m := annString.FindStringSubmatch(says)
		s, err := strconv.Unquote(m[2])
		if err != nil {
			return 0, err
		}
		got := map[string]string{"Name": f.Name, "Key": f.Key, "Tag": f.Tag}[m[1]]
		if got != s {
			return fieldByName[m[1]], fmt.Errorf("%s %q, but the frame decodes with %q", m[1], s, got)
		}
		return fieldByName[m[1]], want(stringBytes(s))
	case annHeader.MatchString(says):
		n, _ := strconv.Atoi(annHeader.FindStringSubmatch(says)[1])
		if n != len(f.Header) {
			return fHeader, fmt.Errorf("%d headers, but the frame decodes with %d", n, len(f.Header))
		}
		return fHeader, want(uvarintBytes(uint64(n)))
	case annPair.MatchString(says):
		m := annPair.FindStringSubmatch(says)
		k, err1 := strconv.Unquote(m[1])
		v, err2 := strconv.Unquote(m[2])
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("bad quoting in %q", says)
		}
		if got, ok := f.Header[k]; !ok || got != v {
			return fHeader, fmt.Errorf("header %q = %q, but the frame decodes with %q", k, v, got)
		}
		return fHeader, want(append(stringBytes(k), stringBytes(v)...))
	case annBody.MatchString(says):
		body := annBody.FindStringSubmatch(says)[1]
		if strings.HasPrefix(body, `"`) {
			if body, err = strconv.Unquote(body); err != nil {
				return 0, err
			}
		}
		if string(f.Body) != body {
			return fBody, fmt.Errorf("body %q, but the frame decodes with %q", body, f.Body)
		}
		return fBody, want([]byte(body))
	}
	return 0, fmt.Errorf("annotation %q is not one this test reads", says)
}

// TestProtocolDocExamples decodes every frame example of
// docs/protocol.md (§2.5) with Decode, checks each annotated line
// against its bytes and the decoded frame, and that AppendFrame encodes
// the frame to exactly those bytes.
func TestProtocolDocExamples(t *testing.T) {
	examples := 0
	for _, block := range readDoc(t, protocolDoc) {
		if block.code == nil {
			continue
		}
		lines, ok := parseExample(block)
		if !ok {
			continue
		}
		examples++
		t.Run(fmt.Sprintf("line%d", block.no), func(t *testing.T) {
			var all []byte
			for _, l := range lines {
				all = append(all, l.bytes...)
			}
			var f Frame
			if err := Decode(all[4:], &f); err != nil {
				t.Fatalf("%s:%d: the example does not decode: %v", protocolDoc, block.no, err)
			}
			var shown uint8
			for _, l := range lines {
				fields, err := checkLine(l, &f, all)
				if err != nil {
					t.Errorf("%s:%d: %v", protocolDoc, l.no, err)
				}
				shown |= fields
			}
			if fields := all[6]; fields != shown {
				t.Errorf("%s:%d: the fields byte is 0x%02x, the lines show the fields 0x%02x", protocolDoc, block.no, fields, shown)
			}
			enc, err := AppendFrame(nil, &f, DefaultMaxFrame)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(enc, all) {
				t.Errorf("%s:%d: AppendFrame gives\n% x\nthe document shows\n% x", protocolDoc, block.no, enc, all)
			}
		})
	}
	// §2.5 has four; a change in their layout must not make this test
	// pass by finding none.
	if examples < 4 {
		t.Fatalf("found %d frame examples in %s, want at least 4", examples, protocolDoc)
	}
}

// TestProtocolDocUvarint checks the inline uvarint examples of §2.2
// ("`81 80 00` is 1") by decoding them as the Ref of a PING.
func TestProtocolDocUvarint(t *testing.T) {
	re := regexp.MustCompile("`((?:[0-9a-f]{2} )*[0-9a-f]{2})` is (\\d+)")
	found := 0
	for _, l := range readDoc(t, protocolDoc) {
		for _, m := range re.FindAllStringSubmatch(l.text, -1) {
			found++
			b, _ := hex.DecodeString(strings.ReplaceAll(m[1], " ", ""))
			want, _ := strconv.ParseUint(m[2], 10, 64)
			var f Frame
			if err := Decode(append([]byte{byte(TypePing), 0, fRef}, b...), &f); err != nil {
				t.Errorf("%s:%d: %s: %v", protocolDoc, l.no, m[0], err)
			} else if f.Ref != want {
				t.Errorf("%s:%d: %s, but it decodes as %d", protocolDoc, l.no, m[0], f.Ref)
			}
		}
	}
	if found == 0 {
		t.Fatalf("no uvarint example found in %s", protocolDoc)
	}
}

// codeConstants reads the Code constants declared in errors.go, by name.
func codeConstants(t *testing.T) map[Code]string {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[Code]string{}
	ast.Inspect(file, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
			return true
		}
		for i, name := range vs.Names {
			lit, ok := vs.Values[i].(*ast.BasicLit)
			if !ok {
				t.Fatalf("errors.go: %s is not a literal", name.Name)
			}
			v, err := strconv.ParseUint(lit.Value, 0, 16)
			if err != nil {
				t.Fatal(err)
			}
			if old, dup := out[Code(v)]; dup {
				t.Fatalf("errors.go: %s and %s are both %d", old, name.Name, v)
			}
			out[Code(v)] = name.Name
		}
		return true
	})
	if len(out) == 0 {
		t.Fatal("no Code constant found in errors.go")
	}
	return out
}

// TestProtocolDocErrorCodes compares the table of error codes of
// docs/protocol.md with the Code constants and their names.
func TestProtocolDocErrorCodes(t *testing.T) {
	lines := readDoc(t, protocolDoc)
	start := slices.IndexFunc(lines, func(l docLine) bool {
		return regexp.MustCompile(`^## \d+\. Error codes$`).MatchString(l.text)
	})
	if start < 0 {
		t.Fatalf("no \"Error codes\" section in %s", protocolDoc)
	}
	row := regexp.MustCompile(`^\| (\d+) \| ([^|]+) \| (.+) \|$`)
	doc := map[Code]string{}
	for _, l := range lines[start+1:] {
		if strings.HasPrefix(l.text, "## ") {
			break
		}
		m := row.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		c, _ := strconv.ParseUint(m[1], 10, 16)
		if _, dup := doc[Code(c)]; dup {
			t.Errorf("%s:%d: code %d twice", protocolDoc, l.no, c)
		}
		doc[Code(c)] = strings.TrimSpace(m[2])
		if strings.TrimSpace(m[3]) == "" {
			t.Errorf("%s:%d: code %d has no meaning", protocolDoc, l.no, c)
		}
	}
	consts := codeConstants(t)
	for c, name := range consts {
		switch got, ok := doc[c]; {
		case !ok:
			t.Errorf("%s (%d, %q) is missing from the table of %s", name, c, c, protocolDoc)
		case got != c.String():
			t.Errorf("code %d is %q in %s, %q in the code (%s)", c, got, protocolDoc, c, name)
		}
	}
	for c := range doc {
		if _, ok := consts[c]; !ok {
			t.Errorf("%s lists code %d (%q), which wire does not define", protocolDoc, c, doc[c])
		}
	}
	// codeNames must name each constant, or String falls back to "code n".
	for c, name := range consts {
		if c.String() == fmt.Sprintf("code %d", c) {
			t.Errorf("%s (%d) has no entry in codeNames", name, c)
		}
	}
}

// slug is the anchor GitHub gives a heading: lower case, punctuation
// but '-' and '_' dropped, spaces made '-'.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestProtocolDocLinks checks docs/protocol.md's own links: the table of
// contents lists every numbered section, in order, under its number and
// with a link to its heading; every link to an anchor resolves to a
// heading; and every "§n" or "§n.m" names a section that exists.
func TestProtocolDocLinks(t *testing.T) {
	lines := readDoc(t, protocolDoc)
	anchors := map[string]string{}  // slug → heading
	numbered := map[string]string{} // "4" and "4.2" → heading
	var top []string                // the numbers of the "## n." sections, in order
	heading := regexp.MustCompile(`^(#+) (.+)$`)
	number := regexp.MustCompile(`^(\d+)\.(\d+)? `)
	for _, l := range lines {
		m := heading.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		s := slug(m[2])
		for i := 1; anchors[s] != ""; i++ { // GitHub numbers repeats
			s = fmt.Sprintf("%s-%d", slug(m[2]), i)
		}
		anchors[s] = m[2]
		if n := number.FindStringSubmatch(m[2]); n != nil {
			id := n[1]
			if n[2] != "" {
				id += "." + n[2]
			}
			numbered[id] = m[2]
			if len(m[1]) == 2 && n[2] == "" {
				top = append(top, id)
			}
		}
	}
	for i, n := range top {
		if n != strconv.Itoa(i+1) {
			t.Errorf("sections are numbered %v, want 1 to %d in order", top, len(top))
			break
		}
	}

	link := regexp.MustCompile(`\]\(#([^)]+)\)`)
	tocEntry := regexp.MustCompile(`^(\d+)\. \[([^\]]+)\]\(#([^)]+)\)$`)
	var toc []string
	for _, l := range lines {
		for _, m := range link.FindAllStringSubmatch(l.text, -1) {
			if anchors[m[1]] == "" {
				t.Errorf("%s:%d: link #%s goes to no heading", protocolDoc, l.no, m[1])
			}
		}
		if m := tocEntry.FindStringSubmatch(l.text); m != nil {
			toc = append(toc, m[1])
			h := anchors[m[3]]
			if !strings.HasPrefix(h, m[1]+". ") {
				t.Errorf("%s:%d: contents entry %s links to heading %q", protocolDoc, l.no, m[1], h)
			}
			if title := strings.TrimPrefix(h, m[1]+". "); !strings.HasPrefix(m[2], title) {
				t.Errorf("%s:%d: contents entry %s is %q, its section %q", protocolDoc, l.no, m[1], m[2], title)
			}
		}
	}
	if !slices.Equal(toc, top) {
		t.Errorf("the contents list sections %v, the document has %v", toc, top)
	}

	ref := regexp.MustCompile(`§(\d+(?:\.\d+)?)`)
	for _, l := range lines {
		for _, m := range ref.FindAllStringSubmatch(l.text, -1) {
			if numbered[m[1]] == "" {
				t.Errorf("%s:%d: §%s names no section", protocolDoc, l.no, m[1])
			}
		}
	}
}

// TestProtocolDocTables compares the tables of fields (§2.1), flags
// (§2.4) and frame types (§3) of docs/protocol.md with the constants,
// and the list of undefined types with Type.Valid.
func TestProtocolDocTables(t *testing.T) {
	lines := readDoc(t, protocolDoc)
	fieldRow := regexp.MustCompile(`^\| (\d) +\| 0x([0-9a-f]{2}) \| (\w+) +\|`)
	flagRow := regexp.MustCompile(`^\| ([A-Z][a-z]+) +\| 0x([0-9a-f]{2}) \| [A-Z]`)
	typeRow := regexp.MustCompile(`^\| 0x([0-9a-f]{2}) \| ([A-Z]+) \|`)
	undefined := regexp.MustCompile(`^Types (.*) are not defined`)
	fields, flags, types := map[string]bool{}, map[string]bool{}, map[Type]bool{}
	var undefinedLine string
	for i, l := range lines {
		if m := fieldRow.FindStringSubmatch(l.text); m != nil {
			bit, _ := strconv.Atoi(m[1])
			mask, _ := strconv.ParseUint(m[2], 16, 8)
			if f, ok := fieldByName[m[3]]; !ok || f != 1<<bit || uint64(f) != mask {
				t.Errorf("%s:%d: field %s is bit %d, mask 0x%s; the codec's is 0x%02x", protocolDoc, l.no, m[3], bit, m[2], f)
			}
			fields[m[3]] = true
		}
		if m := flagRow.FindStringSubmatch(l.text); m != nil {
			bit, _ := strconv.ParseUint(m[2], 16, 8)
			if f, ok := flagByName[m[1]]; !ok || uint64(f) != bit {
				t.Errorf("%s:%d: flag %s is 0x%s; wire's is 0x%02x", protocolDoc, l.no, m[1], m[2], f)
			}
			flags[m[1]] = true
		}
		if m := typeRow.FindStringSubmatch(l.text); m != nil {
			v, _ := strconv.ParseUint(m[1], 16, 8)
			if got := Type(v).String(); got != m[2] {
				t.Errorf("%s:%d: type 0x%s is %s; wire's is %s", protocolDoc, l.no, m[1], m[2], got)
			}
			types[Type(v)] = true
		}
		if strings.HasPrefix(l.text, "Types 0x") && i+1 < len(lines) {
			if m := undefined.FindStringSubmatch(l.text + " " + lines[i+1].text); m != nil {
				undefinedLine = m[1]
			}
		}
	}
	if len(fields) != len(fieldByName) || len(flags) != len(flagByName) {
		t.Errorf("the document lists fields %v and flags %v, the codec has %d and %d", fields, flags, len(fieldByName), len(flagByName))
	}
	if undefinedLine == "" {
		t.Fatalf("no list of undefined types in %s", protocolDoc)
	}
	if allFlags&0x80 != 0 {
		t.Error("the document says flag bit 0x80 is unused")
	}
	// "Types 0x00, 0x09–0x0f, ... and from 0x37 up are not defined".
	notDefined := map[Type]bool{}
	for _, r := range regexp.MustCompile(`(from )?0x([0-9a-f]{2})(?:–0x([0-9a-f]{2}))?( up)?`).FindAllStringSubmatch(undefinedLine, -1) {
		lo, _ := strconv.ParseUint(r[2], 16, 8)
		hi := lo
		switch {
		case r[3] != "":
			hi, _ = strconv.ParseUint(r[3], 16, 8)
		case r[4] != "":
			hi = 255
		}
		for v := lo; v <= hi; v++ {
			notDefined[Type(v)] = true
		}
	}
	for v := range 256 {
		typ := Type(v)
		switch {
		case types[typ] == notDefined[typ]:
			t.Errorf("type 0x%02x is listed %s", v, map[bool]string{true: "both as a frame type and as undefined", false: "neither as a frame type nor as undefined"}[types[typ]])
		case types[typ] != typ.Valid():
			t.Errorf("type 0x%02x: the document says defined=%v, Type.Valid says %v", v, types[typ], typ.Valid())
		}
	}
}
