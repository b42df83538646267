package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"strings"
	"testing"
	"testing/iotest"
)

// allTypes lists every frame type of this protocol version.
var allTypes = []Type{
	TypeHello, TypeWelcome, TypePing, TypePong, TypeClose, TypeError, TypeOK, TypeCredit,
	TypeDeclare, TypeDelete, TypeList, TypeAttach, TypeDetach, TypeSubscribe, TypeUnsubscribe,
	TypeDecision, TypeSubRequest, TypeEvent,
	TypeRequest, TypeResponse, TypeCancel, TypeAsk, TypeAnswer, TypePublish, TypeMessage,
}

// frameVariants returns frames of type t with varied field combinations.
func frameVariants(t Type) map[string]*Frame {
	many := make(map[string]string, MaxHeaders)
	for i := range MaxHeaders {
		many[fmt.Sprintf("h%03d", i)] = strings.Repeat("v", i%7)
	}
	return map[string]*Frame{
		"zero":   {Type: t},
		"ref":    {Type: t, Ref: 1},
		"attach": {Type: t, Attach: 1},
		"aux":    {Type: t, Aux: 127},
		"name":   {Type: t, Name: "users"},
		"key":    {Type: t, Key: "user.42"},
		"tag":    {Type: t, Tag: "eu"},
		"header": {Type: t, Header: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}},
		"body":   {Type: t, Body: []byte("x")},
		"all fields": {
			Type: t, Flags: FlagLast, Ref: 7, Attach: 3, Aux: 1500,
			Name: "prices.eu", Key: "fx.eur.usd", Tag: "blue",
			Header: map[string]string{"a": "1", "b": "2", "c": ""},
			Body:   []byte(`{"versions":[1]}`),
		},
		"max values": {
			Type: t, Flags: allFlags, Ref: math.MaxUint64, Attach: math.MaxUint32, Aux: math.MaxUint64,
			Body: []byte{0},
		},
		"attach 2^32-1": {Type: t, Attach: 1<<32 - 1},
		"varint edges":  {Type: t, Ref: 127, Attach: 128, Aux: 1<<63 - 1},
		"unicode": {
			Type: t, Name: "café", Key: "ключ.日本", Tag: "🚀",
			Header: map[string]string{"ünï": "çødé", "": ""},
		},
		"empty header":   {Type: t, Header: map[string]string{"": ""}},
		"max headers":    {Type: t, Header: many},
		"long string":    {Type: t, Key: strings.Repeat("k", 300)},
		"binary body":    {Type: t, Body: []byte{0, 0xff, 0xfe, 0x80, 0}},
		"large body":     {Type: t, Ref: 9, Body: bytes.Repeat([]byte("0123456789abcdef"), 5000)},
		"fields no body": {Type: t, Ref: 2, Attach: 4, Name: "n", Key: "k", Tag: "t"},
	}
}

// sameFrame reports how a and b differ, or "" if they are equal. Nil and
// empty Header and Body are equal, as the encoding cannot tell them apart.
func sameFrame(a, b *Frame) string {
	var d []string
	if a.Type != b.Type {
		d = append(d, fmt.Sprintf("type %s != %s", a.Type, b.Type))
	}
	if a.Flags != b.Flags {
		d = append(d, fmt.Sprintf("flags %#x != %#x", a.Flags, b.Flags))
	}
	if a.Ref != b.Ref {
		d = append(d, fmt.Sprintf("ref %d != %d", a.Ref, b.Ref))
	}
	if a.Attach != b.Attach {
		d = append(d, fmt.Sprintf("attach %d != %d", a.Attach, b.Attach))
	}
	if a.Aux != b.Aux {
		d = append(d, fmt.Sprintf("aux %d != %d", a.Aux, b.Aux))
	}
	if a.Name != b.Name {
		d = append(d, fmt.Sprintf("name %q != %q", a.Name, b.Name))
	}
	if a.Key != b.Key {
		d = append(d, fmt.Sprintf("key %q != %q", a.Key, b.Key))
	}
	if a.Tag != b.Tag {
		d = append(d, fmt.Sprintf("tag %q != %q", a.Tag, b.Tag))
	}
	if !maps.Equal(a.Header, b.Header) {
		d = append(d, fmt.Sprintf("header %v != %v", a.Header, b.Header))
	}
	if !bytes.Equal(a.Body, b.Body) {
		d = append(d, fmt.Sprintf("body %q != %q", trim(a.Body), trim(b.Body)))
	}
	return strings.Join(d, "; ")
}

func trim(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}

// encode returns the whole encoding of f, length prefix included.
func encode(tb testing.TB, f *Frame) []byte {
	tb.Helper()
	p, err := AppendFrame(nil, f, 0)
	if err != nil {
		tb.Fatalf("AppendFrame(%s): %v", f.Type, err)
	}
	return p
}

// uv returns the uvarint encoding of v.
func uv(v uint64) []byte { return binary.AppendUvarint(nil, v) }

// str returns the wire encoding of a string.
func str(s string) []byte { return appendString(nil, s) }

// payload builds a frame without its length prefix from raw parts.
func payload(t Type, flags Flags, fields uint8, parts ...[]byte) []byte {
	p := []byte{byte(t), byte(flags), fields}
	for _, x := range parts {
		p = append(p, x...)
	}
	return p
}

// prefixed puts the length prefix in front of p.
func prefixed(p []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(p))), p...)
}

func TestRoundTrip(t *testing.T) {
	for _, typ := range allTypes {
		for name, f := range frameVariants(typ) {
			t.Run(typ.String()+"/"+name, func(t *testing.T) {
				p := encode(t, f)
				if n := binary.BigEndian.Uint32(p); int(n) != len(p)-4 {
					t.Fatalf("length prefix %d, frame has %d bytes after it", n, len(p)-4)
				}
				var g Frame
				if err := Decode(p[4:], &g); err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if d := sameFrame(f, &g); d != "" {
					t.Fatalf("round trip changed the frame: %s", d)
				}
				// The same frame through a Reader.
				r := NewReader(bytes.NewReader(p), DefaultMaxFrame)
				var h Frame
				if err := r.Next(&h); err != nil {
					t.Fatalf("Reader.Next: %v", err)
				}
				if d := sameFrame(f, &h); d != "" {
					t.Fatalf("Reader changed the frame: %s", d)
				}
				if err := r.Next(&h); err != io.EOF {
					t.Fatalf("Reader.Next after the only frame: %v, want io.EOF", err)
				}
			})
		}
	}
}

// TestZeroFieldsOmitted checks the canonical encoding: zero fields are not
// sent, so a frame with nothing set is exactly type, flags and fields.
func TestZeroFieldsOmitted(t *testing.T) {
	f := &Frame{Type: TypeList, Header: map[string]string{}, Body: []byte{}}
	got := encode(t, f)
	want := []byte{0, 0, 0, 3, byte(TypeList), 0, 0}
	if !bytes.Equal(got, want) {
		t.Fatalf("encoding % x, want % x", got, want)
	}
}

// TestDecodeReplacesFrame checks that Decode leaves nothing of the frame
// it decodes into.
func TestDecodeReplacesFrame(t *testing.T) {
	f := Frame{Type: TypeRequest, Ref: 9, Name: "old", Header: map[string]string{"a": "b"}, Body: []byte("old")}
	if err := Decode(payload(TypePing, 0, 0), &f); err != nil {
		t.Fatal(err)
	}
	if d := sameFrame(&f, &Frame{Type: TypePing}); d != "" {
		t.Fatalf("stale fields: %s", d)
	}
}

// TestExampleFrames pins the byte layout of the examples of
// docs/protocol.md §2.5 from the Go side; TestProtocolDocExamples reads
// them from the document itself.
func TestExampleFrames(t *testing.T) {
	cases := []struct {
		name string
		f    *Frame
		hex  string
	}{
		{
			name: "PING",
			f:    &Frame{Type: TypePing, Ref: 1},
			hex:  "00000004 03 00 01 01",
		},
		{
			name: "HELLO",
			f:    &Frame{Type: TypeHello, Body: []byte(`{"versions":[1]}`)},
			hex:  "00000013 01 00 80 7b2276657273696f6e73223a5b315d7d",
		},
		{
			name: "REQUEST",
			f: &Frame{
				Type: TypeRequest, Ref: 7, Aux: 1500, Name: "users", Key: "u42",
				Header: map[string]string{"lang": "en"}, Body: []byte("ping"),
			},
			// fields 0xdd = ref|aux|name|key|header|body; aux 1500 = dc 0b.
			hex: "0000001d 20 00 dd 07 dc0b 05 7573657273 03 753432 01 04 6c616e67 02 656e 70696e67",
		},
		{
			name: "RESPONSE",
			f:    &Frame{Type: TypeResponse, Flags: FlagLast, Ref: 7, Name: "n1/c2.1", Body: []byte("pong")},
			hex:  "00000010 21 10 89 07 07 6e312f63322e31 706f6e67",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want, err := hex.DecodeString(strings.ReplaceAll(tc.hex, " ", ""))
			if err != nil {
				t.Fatal(err)
			}
			got := encode(t, tc.f)
			if !bytes.Equal(got, want) {
				t.Fatalf("encoding\n got % x\nwant % x", got, want)
			}
			var g Frame
			if err := Decode(want[4:], &g); err != nil {
				t.Fatal(err)
			}
			if d := sameFrame(tc.f, &g); d != "" {
				t.Fatal(d)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	many := uv(MaxHeaders + 1)
	for range MaxHeaders + 1 {
		many = append(many, 0, 0)
	}
	cases := []struct {
		name string
		p    []byte
		msg  string // the error text must contain it
	}{
		{"nil", nil, "0 bytes, need at least 3"},
		{"one byte", []byte{byte(TypePing)}, "1 bytes, need at least 3"},
		{"two bytes", []byte{byte(TypePing), 0}, "2 bytes, need at least 3"},
		{"type zero", payload(0, 0, 0), "unknown frame type 0x00"},
		{"type gap", payload(0x09, 0, 0), "unknown frame type 0x09"},
		{"type gap 2", payload(0x25, 0, 0), "unknown frame type 0x25"},
		{"type past last", payload(maxType+1, 0, 0), "unknown frame type 0x4d"},
		{"type 0xff", payload(0xff, 0, 0), "unknown frame type 0xff"},
		{"unknown flag 0x80", payload(TypePing, 0x80|FlagFatal, 0), "PING: unknown flags 0x81"},
		{"truncated ref", payload(TypePing, 0, fRef), "PING: bad varint in ref"},
		{"ref cut mid-varint", payload(TypePing, 0, fRef, []byte{0x80, 0x80}), "bad varint in ref"},
		{"ref over 64 bits", payload(TypePing, 0, fRef, bytes.Repeat([]byte{0xff}, 10), []byte{1}), "bad varint in ref"},
		{"truncated attach", payload(TypeDetach, 0, fRef|fAttach, uv(1), []byte{0xff}), "DETACH: bad varint in attach"},
		{"truncated aux", payload(TypeCredit, 0, fAux), "CREDIT: bad varint in aux"},
		{"attach 2^32", payload(TypeMessage, 0, fAttach, uv(1<<32)), "MESSAGE: attach id overflows 32 bits"},
		{"attach 2^64-1", payload(TypeMessage, 0, fAttach, uv(math.MaxUint64)), "attach id overflows 32 bits"},
		{"name length missing", payload(TypeDeclare, 0, fName), "DECLARE: bad varint in name length"},
		{"name past frame", payload(TypeDeclare, 0, fName, uv(5), []byte("ab")), "DECLARE: name runs past the frame"},
		{"name huge length", payload(TypeDeclare, 0, fName, uv(math.MaxUint64), []byte("ab")), "name runs past the frame"},
		{"key past frame", payload(TypePublish, 0, fKey, uv(1)), "PUBLISH: key runs past the frame"},
		{"tag past frame", payload(TypeError, 0, fTag, uv(100), []byte("short")), "ERROR: tag runs past the frame"},
		{"header name past frame", payload(TypeRequest, 0, fHeader, uv(1), uv(4), []byte("ab")), "header name runs past the frame"},
		{"header value past frame", payload(TypeRequest, 0, fHeader, uv(1), str("a"), uv(4)), "header value runs past the frame"},
		{"header count short", payload(TypeRequest, 0, fHeader, uv(2), str("a"), str("b")), "bad varint in header name length"},
		{"header count missing", payload(TypeRequest, 0, fHeader), "bad varint in header count"},
		{"name not UTF-8", payload(TypeAttach, 0, fName, uv(2), []byte{0xff, 0xfe}), "ATTACH: name is not UTF-8"},
		{"key not UTF-8", payload(TypePublish, 0, fKey, uv(1), []byte{0x80}), "key is not UTF-8"},
		{"tag not UTF-8", payload(TypeClose, 0, fTag, uv(3), []byte{0xe2, 0x82, 'x'}), "tag is not UTF-8"},
		{"header name not UTF-8", payload(TypeRequest, 0, fHeader, uv(1), uv(1), []byte{0xc0}, str("v")), "header name is not UTF-8"},
		{"header value not UTF-8", payload(TypeRequest, 0, fHeader, uv(1), str("k"), uv(2), []byte{0xed, 0xa0}), "header value is not UTF-8"},
		{"too many headers", payload(TypeRequest, 0, fHeader, many), "REQUEST: 257 headers, limit 256"},
		{"huge header count", payload(TypeRequest, 0, fHeader, uv(math.MaxUint64)), "headers, limit 256"},
		{"trailing byte", payload(TypePing, 0, fRef, uv(1), []byte{0}), "PING: 1 trailing bytes"},
		{"trailing bytes no fields", payload(TypeList, 0, 0, []byte("junk")), "LIST: 4 trailing bytes"},
		{"body flag, empty body", payload(TypePublish, 0, fName|fBody, str("x")), "PUBLISH: body flagged but empty"},
		{"body flag only", payload(TypeHello, 0, fBody), "HELLO: body flagged but empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Leave bytes after p in its backing array: the decoder must
			// not read them.
			buf := append(append([]byte(nil), tc.p...), "spare capacity the decoder must not see"...)
			p := buf[:len(tc.p):len(tc.p)]
			var f Frame
			err := Decode(p, &f)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode(% x) = %v, want ErrMalformed", tc.p, err)
			}
			if errors.Is(err, ErrFrameTooLarge) {
				t.Fatalf("error %v also matches ErrFrameTooLarge", err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %q does not say %q", err, tc.msg)
			}
			if !strings.HasPrefix(err.Error(), "wire: malformed frame: ") {
				t.Fatalf("error %q does not start with the sentinel's text", err)
			}
			// The same bytes through a Reader give the same error.
			r := NewReader(bytes.NewReader(prefixed(tc.p)), DefaultMaxFrame)
			if err2 := r.Next(&f); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("Reader.Next = %v, want %v", err2, err)
			}
		})
	}
}

// TestDecodeLenient documents what the decoder accepts although an encoder
// never produces it.
func TestDecodeLenient(t *testing.T) {
	cases := []struct {
		name string
		p    []byte
		want Frame
	}{
		{"zero fields present", payload(TypePing, 0, fRef|fAttach|fAux, uv(0), uv(0), uv(0)), Frame{Type: TypePing}},
		{"overlong varint", payload(TypePing, 0, fRef, []byte{0x81, 0x80, 0x00}), Frame{Type: TypePing, Ref: 1}},
		{"empty strings present", payload(TypeAttach, 0, fName|fKey|fTag, str(""), str(""), str("")), Frame{Type: TypeAttach}},
		{"zero headers", payload(TypeRequest, 0, fHeader, uv(0)), Frame{Type: TypeRequest}},
		{"duplicate header, last wins", payload(TypeRequest, 0, fHeader, uv(2), str("k"), str("1"), str("k"), str("2")),
			Frame{Type: TypeRequest, Header: map[string]string{"k": "2"}}},
		{"exactly MaxHeaders", payload(TypeRequest, 0, fHeader, uv(MaxHeaders), bytes.Repeat([]byte{1, 'k', 0}, MaxHeaders)),
			Frame{Type: TypeRequest, Header: map[string]string{"k": ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var f Frame
			if err := Decode(tc.p, &f); err != nil {
				t.Fatal(err)
			}
			if d := sameFrame(&f, &tc.want); d != "" {
				t.Fatal(d)
			}
		})
	}
}

// TestDecodeBodyAliases checks the documented contract of Decode: Body
// aliases the input, strings do not.
func TestDecodeBodyAliases(t *testing.T) {
	p := encode(t, &Frame{Type: TypeMessage, Key: "k", Body: []byte("body")})[4:]
	var f Frame
	if err := Decode(p, &f); err != nil {
		t.Fatal(err)
	}
	p[len(p)-1] = 'Y'
	p[len(p)-6] = 'X' // the key's only byte
	if string(f.Body) != "bodY" {
		t.Errorf("Body = %q, want it to alias the input", f.Body)
	}
	if f.Key != "k" {
		t.Errorf("Key = %q, changed with the input", f.Key)
	}
}

func TestAppendFrameTooLarge(t *testing.T) {
	f := &Frame{Type: TypeRequest, Ref: 1, Name: "users", Body: make([]byte, 100)}
	size := len(encode(t, f)) - 4
	dst := []byte("previous frames")
	for _, max := range []int{1, size - 1} {
		got, err := AppendFrame(dst, f, max)
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("max %d: err = %v, want ErrFrameTooLarge", max, err)
		}
		want := fmt.Sprintf("REQUEST of %d bytes, limit %d", size, max)
		if !strings.Contains(err.Error(), want) {
			t.Errorf("max %d: error %q does not say %q", max, err, want)
		}
		if len(got) != len(dst) || string(got) != "previous frames" {
			t.Errorf("max %d: dst became %q (len %d), want it unchanged", max, got, len(got))
		}
	}
	for _, max := range []int{0, size, size + 1} {
		got, err := AppendFrame(dst, f, max)
		if err != nil {
			t.Fatalf("max %d: %v", max, err)
		}
		if len(got) != len(dst)+4+size {
			t.Fatalf("max %d: appended %d bytes, want %d", max, len(got)-len(dst), 4+size)
		}
	}
}

// TestAppendFrameAppends checks that frames appended to one buffer decode
// one after the other and that the bytes before them are kept.
func TestAppendFrameAppends(t *testing.T) {
	frames := []*Frame{
		{Type: TypePublish, Name: "a", Key: "x.y", Body: []byte("1")},
		{Type: TypePing, Ref: 42},
		{Type: TypeResponse, Flags: FlagChunk, Ref: 3, Body: []byte("chunk")},
	}
	buf := []byte("head")
	var err error
	for _, f := range frames {
		if buf, err = AppendFrame(buf, f, DefaultMaxFrame); err != nil {
			t.Fatal(err)
		}
	}
	if string(buf[:4]) != "head" {
		t.Fatalf("prefix clobbered: %q", buf[:4])
	}
	r := NewReader(bytes.NewReader(buf[4:]), DefaultMaxFrame)
	for i, want := range frames {
		var f Frame
		if err := r.Next(&f); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if d := sameFrame(&f, want); d != "" {
			t.Fatalf("frame %d: %s", i, d)
		}
	}
}

// stream returns the frames of every type and variant, and their encoding
// one after the other.
func stream(tb testing.TB) ([]*Frame, []byte) {
	var frames []*Frame
	var buf []byte
	for _, typ := range allTypes {
		for _, f := range frameVariants(typ) {
			frames = append(frames, f)
			buf = append(buf, encode(tb, f)...)
		}
	}
	return frames, buf
}

func TestReaderStream(t *testing.T) {
	frames, buf := stream(t)
	readers := []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{
		{"whole", func(r io.Reader) io.Reader { return r }},
		{"OneByteReader", iotest.OneByteReader},
		{"HalfReader", iotest.HalfReader},
		{"DataErrReader", iotest.DataErrReader},
		{"chunks of 7", func(r io.Reader) io.Reader { return &chunkReader{r: r, n: 7} }},
	}
	for _, rd := range readers {
		t.Run(rd.name, func(t *testing.T) {
			r := NewReader(rd.wrap(bytes.NewReader(buf)), DefaultMaxFrame)
			var f Frame
			for i, want := range frames {
				if err := r.Next(&f); err != nil {
					t.Fatalf("frame %d (%s): %v", i, want.Type, err)
				}
				if d := sameFrame(&f, want); d != "" {
					t.Fatalf("frame %d (%s): %s", i, want.Type, d)
				}
			}
			for range 2 {
				if err := r.Next(&f); err != io.EOF {
					t.Fatalf("Next at the end: %v, want io.EOF", err)
				}
			}
		})
	}
}

// chunkReader reads at most n bytes at a time.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.n {
		p = p[:c.n]
	}
	return c.r.Read(p)
}

// TestReaderBodiesStayIntact keeps every body Next returned and checks
// them after later frames have been read over the same buffers.
func TestReaderBodiesStayIntact(t *testing.T) {
	sizes := []int{1, 10, 100, 1000, 16 << 10, 16<<10 + 1, 40 << 10, 70 << 10, 300 << 10, 5, 3}
	var frames []*Frame
	var buf []byte
	for round := range 20 {
		for i, n := range sizes {
			body := bytes.Repeat([]byte{byte('a' + (round*len(sizes)+i)%26)}, n)
			body[0] = byte(round)
			f := &Frame{Type: TypeMessage, Attach: uint32(i + 1), Key: "k", Body: body}
			frames = append(frames, f)
			buf = append(buf, encode(t, f)...)
		}
	}
	for _, wrap := range []func(io.Reader) io.Reader{
		func(r io.Reader) io.Reader { return r },
		iotest.HalfReader,
		func(r io.Reader) io.Reader { return &chunkReader{r: r, n: 1000} },
	} {
		r := NewReader(wrap(bytes.NewReader(buf)), DefaultMaxFrame)
		bodies := make([][]byte, len(frames))
		for i := range frames {
			var f Frame
			if err := r.Next(&f); err != nil {
				t.Fatalf("frame %d: %v", i, err)
			}
			bodies[i] = f.Body
		}
		if err := r.Next(new(Frame)); err != io.EOF {
			t.Fatalf("Next at the end: %v, want io.EOF", err)
		}
		// Appending to one body must not write into another.
		for _, b := range bodies {
			_ = append(b, '!')
		}
		for i, f := range frames {
			if !bytes.Equal(bodies[i], f.Body) {
				t.Fatalf("body %d (%d bytes) changed after later reads", i, len(f.Body))
			}
		}
	}
}

func TestReaderEOF(t *testing.T) {
	one := encode(t, &Frame{Type: TypeRequest, Ref: 1, Name: "users", Key: "k", Body: []byte("hello")})
	two := append(append([]byte(nil), one...), one...)
	for _, wrap := range []func(io.Reader) io.Reader{
		func(r io.Reader) io.Reader { return r },
		iotest.OneByteReader,
		iotest.HalfReader,
		iotest.DataErrReader,
	} {
		// A clean end between frames is io.EOF.
		for _, frames := range []int{0, 1, 2} {
			r := NewReader(wrap(bytes.NewReader(two[:frames*len(one)])), DefaultMaxFrame)
			var f Frame
			for i := range frames {
				if err := r.Next(&f); err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
			}
			if err := r.Next(&f); err != io.EOF {
				t.Fatalf("after %d frames: %v, want io.EOF", frames, err)
			}
		}
		// An end anywhere inside a frame, the length prefix included, is
		// io.ErrUnexpectedEOF.
		for cut := len(one) + 1; cut < len(two); cut++ {
			r := NewReader(wrap(bytes.NewReader(two[:cut])), DefaultMaxFrame)
			var f Frame
			if err := r.Next(&f); err != nil {
				t.Fatalf("cut %d: first frame: %v", cut, err)
			}
			if err := r.Next(&f); err != io.ErrUnexpectedEOF {
				t.Fatalf("cut at byte %d of %d: %v, want io.ErrUnexpectedEOF", cut-len(one), len(one), err)
			}
		}
	}
}

// TestReaderStreamError checks that errors of the underlying reader come
// back as they are.
func TestReaderStreamError(t *testing.T) {
	one := encode(t, &Frame{Type: TypePing, Ref: 5})
	boom := errors.New("boom")
	r := NewReader(io.MultiReader(bytes.NewReader(one), iotest.ErrReader(boom)), DefaultMaxFrame)
	var f Frame
	if err := r.Next(&f); err != nil {
		t.Fatal(err)
	}
	if err := r.Next(&f); err != boom {
		t.Fatalf("Next = %v, want the stream's error", err)
	}
	// Mid-frame too.
	r = NewReader(io.MultiReader(bytes.NewReader(one[:5]), iotest.ErrReader(boom)), DefaultMaxFrame)
	if err := r.Next(&f); err != boom {
		t.Fatalf("Next = %v, want the stream's error", err)
	}
}

// mustNotRead fails the test if it is read.
type mustNotRead struct{ t *testing.T }

func (m mustNotRead) Read(p []byte) (int, error) {
	m.t.Error("the Reader read past the length prefix of an oversized frame")
	return 0, io.EOF
}

func TestReaderFrameTooLarge(t *testing.T) {
	const max = 1000
	for _, n := range []uint32{max + 1, DefaultMaxFrame, math.MaxUint32} {
		prefix := binary.BigEndian.AppendUint32(nil, n)
		r := NewReader(io.MultiReader(bytes.NewReader(prefix), mustNotRead{t}), max)
		var f Frame
		err := r.Next(&f)
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("len %d: %v, want ErrFrameTooLarge", n, err)
		}
		if want := fmt.Sprintf("%d bytes, limit %d", n, max); !strings.Contains(err.Error(), want) {
			t.Fatalf("len %d: error %q does not say %q", n, err, want)
		}
	}
	// A frame of exactly max bytes is accepted.
	f := &Frame{Type: TypePublish, Name: "x", Body: make([]byte, 100)}
	p := encode(t, f)
	r := NewReader(bytes.NewReader(p), len(p)-4)
	if err := r.Next(new(Frame)); err != nil {
		t.Fatalf("frame of exactly max bytes: %v", err)
	}
}

func TestReaderSetMax(t *testing.T) {
	small := encode(t, &Frame{Type: TypeHello, Body: []byte(`{"versions":[1]}`)})
	big := encode(t, &Frame{Type: TypeRequest, Ref: 1, Name: "x", Body: make([]byte, HandshakeMaxFrame)})
	r := NewReader(bytes.NewReader(append(append([]byte(nil), small...), big...)), HandshakeMaxFrame)
	var f Frame
	if err := r.Next(&f); err != nil {
		t.Fatal(err)
	}
	r.SetMax(DefaultMaxFrame)
	if err := r.Next(&f); err != nil {
		t.Fatalf("after SetMax: %v", err)
	}
	r = NewReader(bytes.NewReader(big), HandshakeMaxFrame)
	if err := r.Next(&f); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("before SetMax: %v, want ErrFrameTooLarge", err)
	}
}

// TestReaderShortFrame checks that length prefixes under 3 bytes are
// malformed, not a reason to wait for more data.
func TestReaderShortFrame(t *testing.T) {
	for n := range 3 {
		p := prefixed(payload(TypePing, 0, 0)[:n])
		r := NewReader(bytes.NewReader(p), DefaultMaxFrame)
		err := r.Next(new(Frame))
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), fmt.Sprintf("%d bytes, need at least 3", n)) {
			t.Fatalf("len %d: %v, want ErrMalformed saying the frame is short", n, err)
		}
	}
}

// chunks returns its chunks one Read at a time.
type chunks [][]byte

func (c *chunks) Read(p []byte) (int, error) {
	if len(*c) == 0 {
		return 0, io.EOF
	}
	n := copy(p, (*c)[0])
	if (*c)[0] = (*c)[0][n:]; len((*c)[0]) == 0 {
		*c = (*c)[1:]
	}
	return n, nil
}

func TestReaderBuffered(t *testing.T) {
	a := encode(t, &Frame{Type: TypePing, Ref: 1})
	b := encode(t, &Frame{Type: TypePublish, Name: "x", Key: "y", Body: []byte("body")})
	c := encode(t, &Frame{Type: TypePong, Ref: 1})
	in := chunks{
		append(append(append([]byte(nil), a...), b...), c[:2]...), // a, b and 2 bytes of c
		c[2:6],
		c[6:],
	}
	r := NewReader(&in, DefaultMaxFrame)
	var f Frame
	steps := []struct {
		want     Type
		buffered bool // after reading it
	}{
		{TypePing, true},     // b is buffered
		{TypePublish, false}, // only part of c's prefix
		{TypePong, false},    // nothing
	}
	if r.Buffered() {
		t.Fatal("Buffered before any read")
	}
	for i, s := range steps {
		if err := r.Next(&f); err != nil || f.Type != s.want {
			t.Fatalf("step %d: %v %s, want %s", i, err, f.Type, s.want)
		}
		if got := r.Buffered(); got != s.buffered {
			t.Fatalf("step %d: Buffered() = %v, want %v", i, got, s.buffered)
		}
	}
	// A frame whose prefix is buffered but not all of its bytes.
	in = chunks{append(append([]byte(nil), a...), b[:len(b)-1]...), b[len(b)-1:]}
	r = NewReader(&in, DefaultMaxFrame)
	if err := r.Next(&f); err != nil {
		t.Fatal(err)
	}
	if r.Buffered() {
		t.Fatal("Buffered() with the last byte of the next frame missing")
	}
	if err := r.Next(&f); err != nil || f.Type != TypePublish {
		t.Fatalf("%v %s", err, f.Type)
	}
}

// TestReaderInternedStrings checks that names and tags the Reader interns
// come back right, also once the intern table is full.
func TestReaderInternedStrings(t *testing.T) {
	var buf []byte
	var frames []*Frame
	for i := range 5000 {
		f := &Frame{Type: TypeRequest, Ref: uint64(i + 1), Name: fmt.Sprintf("ex.%d", i%4500), Tag: fmt.Sprintf("t%d", i%3)}
		frames = append(frames, f)
		buf = append(buf, encode(t, f)...)
	}
	r := NewReader(bytes.NewReader(buf), DefaultMaxFrame)
	for i, want := range frames {
		var f Frame
		if err := r.Next(&f); err != nil {
			t.Fatal(err)
		}
		if d := sameFrame(&f, want); d != "" {
			t.Fatalf("frame %d: %s", i, d)
		}
	}
}

// TestReaderKeys: a Reader reuses the last routing key's string when the
// next frame has the same, and decodes a different one as it is.
func TestReaderKeys(t *testing.T) {
	keys := []string{"eu.prices", "eu.prices", "us.prices", "", "eu.prices", "eu.prices"}
	var buf []byte
	for i, k := range keys {
		var err error
		if buf, err = AppendFrame(buf, &Frame{Type: TypeMessage, Ref: uint64(i + 1), Key: k, Body: []byte("x")}, 0); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(bytes.NewReader(buf), DefaultMaxFrame)
	for i, want := range keys {
		var f Frame
		if err := r.Next(&f); err != nil {
			t.Fatal(err)
		}
		if f.Key != want || f.Ref != uint64(i+1) {
			t.Fatalf("frame %d: key %q ref %d, want %q", i, f.Key, f.Ref, want)
		}
	}
}
