package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite the seed corpus in testdata/fuzz")

// fuzzMax is the frame limit of FuzzReader: small, so that the fuzzer
// reaches both sides of it.
const fuzzMax = 512

// seed is one named fuzz input.
type seed struct {
	name string
	data []byte
}

// decodeSeeds returns frames without their length prefix: one valid frame
// of every type, as the protocol uses it, and a few malformed ones. Each
// has at most one header so that its encoding is deterministic.
func decodeSeeds(tb testing.TB) []seed {
	hdr := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	valid := []*Frame{
		{Type: TypeHello, Body: []byte(`{"versions":[1],"name":"fuzz","heartbeat_ms":1000}`)},
		{Type: TypeWelcome, Body: []byte(`{"version":1,"server":"courier","node":"n1","conn":"n1/c1","heartbeat_ms":1000,"timeout_ms":3000,"max_frame":4194304,"credit":65536}`)},
		{Type: TypePing, Ref: 1},
		{Type: TypePong, Ref: 1},
		{Type: TypeClose, Aux: uint64(CodeShutdown), Tag: "bye"},
		{Type: TypeError, Flags: FlagFatal, Ref: 3, Aux: uint64(CodeProtocol), Tag: "wire: malformed frame"},
		{Type: TypeOK, Ref: 3, Body: []byte(`{"member":"n1/c1.1"}`)},
		{Type: TypeCredit, Aux: 32768},
		{Type: TypeDeclare, Ref: 4, Name: "users", Aux: 1, Body: []byte(`{"pattern":"reqresp","strategy":"round-robin"}`)},
		{Type: TypeDelete, Ref: 5, Name: "users"},
		{Type: TypeList, Ref: 6},
		{Type: TypeAttach, Ref: 7, Attach: 1, Name: "prices", Aux: RoleSubscriber, Tag: "eu", Body: []byte(`{"patterns":["fx.*","#"],"conn_tag":"a"}`)},
		{Type: TypeDetach, Ref: 8, Attach: 1},
		{Type: TypeSubscribe, Ref: 9, Attach: 2, Name: "n1/c1.1", Body: []byte(`{"patterns":["a.#"]}`)},
		{Type: TypeUnsubscribe, Ref: 10, Attach: 2, Body: []byte(`{"patterns":["a.#"]}`)},
		{Type: TypeDecision, Ref: 11, Attach: 2, Aux: VerdictRefuse, Tag: "not allowed"},
		{Type: TypeSubRequest, Ref: 11, Attach: 2, Name: "n1/c1.1", Body: []byte(`{"member":{"id":"n1/c1.1","role":"subscriber"},"patterns":["a.*"]}`)},
		{Type: TypeEvent, Attach: 1, Aux: EventLeader, Name: "users", Body: []byte(`{"leader":"n1/c1.1","members":[{"id":"n1/c1.1","role":"handler"}]}`)},
		{Type: TypeRequest, Ref: 12, Aux: 5000, Name: "users", Key: "user.42", Tag: "blue", Header: hdr, Body: []byte("ping")},
		{Type: TypeRequest, Ref: 1<<32 | 1, Attach: 1<<32 - 1, Name: "n1/c2", Body: []byte("handler leg")},
		{Type: TypeResponse, Flags: FlagLast, Ref: 12, Name: "n1/c2.1", Body: []byte("pong")},
		{Type: TypeResponse, Flags: FlagChunk, Ref: 12, Body: []byte("chunk")},
		{Type: TypeResponse, Flags: FlagEnd | FlagLast, Ref: 12},
		{Type: TypeResponse, Flags: FlagError | FlagLast, Ref: 12, Aux: uint64(CodeNoHandler), Tag: "no handler"},
		{Type: TypeCancel, Ref: 12},
		{Type: TypeAsk, Ref: 12, Aux: 1<<32 | 1, Name: "n1/c2.1", Body: []byte("sure?")},
		{Type: TypeAnswer, Ref: 12, Aux: 1<<32 | 1, Body: []byte("yes")},
		{Type: TypePublish, Flags: FlagReply, Ref: 13, Name: "prices", Key: "fx.eur.usd", Header: hdr, Body: []byte("1.08")},
		{Type: TypeMessage, Attach: 1, Key: "fx.eur.usd", Body: []byte("1.08")},
		{Type: TypeMessage, Flags: allFlags, Ref: 1<<64 - 1, Attach: 1<<32 - 1, Aux: 1<<64 - 1, Name: "n", Key: "k", Tag: "t", Header: map[string]string{"": ""}, Body: []byte{0}},
	}
	var seeds []seed
	for i, f := range valid {
		p := encode(tb, f)[4:]
		seeds = append(seeds, seed{fmt.Sprintf("valid-%02d-%s", i, f.Type), p})
	}
	malformed := []seed{
		{"short", []byte{byte(TypePing), 0}},
		{"unknown-type", payload(0x2a, 0, 0)},
		{"unknown-flags", payload(TypeRequest, 0x40, 0)},
		{"truncated-varint", payload(TypePing, 0, fRef, []byte{0x80})},
		{"string-past-frame", payload(TypeDeclare, 0, fName, uv(9), []byte("abc"))},
		{"not-utf8", payload(TypePublish, 0, fKey, uv(2), []byte{0xff, 0xfe})},
		{"too-many-headers", payload(TypeRequest, 0, fHeader, uv(MaxHeaders+1))},
		{"trailing-bytes", payload(TypePing, 0, fRef, uv(1), []byte("zz"))},
		{"empty-body-flagged", payload(TypeMessage, 0, fAttach|fBody, uv(1))},
		{"attach-33-bits", payload(TypeMessage, 0, fAttach, uv(1<<32))},
	}
	for _, s := range malformed {
		seeds = append(seeds, seed{"malformed-" + s.name, s.data})
	}
	return seeds
}

// readerSeeds returns streams of length-prefixed frames for FuzzReader.
func readerSeeds(tb testing.TB) []seed {
	var all []byte
	var seeds []seed
	for _, s := range decodeSeeds(tb) {
		p := prefixed(s.data)
		if len(p)-4 <= fuzzMax {
			all = append(all, p...)
		}
		seeds = append(seeds, seed{"one-" + s.name, p})
	}
	ping := encode(tb, &Frame{Type: TypePing, Ref: 1})
	req := encode(tb, &Frame{Type: TypeRequest, Ref: 2, Name: "users", Body: []byte("ping")})
	seeds = append(seeds,
		seed{"stream-all", all},
		seed{"stream-cut", all[:len(all)-3]},
		seed{"stream-two", append(append([]byte(nil), ping...), req...)},
		seed{"prefix-only", ping[:3]},
		seed{"too-large", append(binary.BigEndian.AppendUint32(nil, fuzzMax+1), ping[4:]...)},
		seed{"huge-length", append(append([]byte(nil), ping...), 0xff, 0xff, 0xff, 0xff)},
		seed{"zero-length", append(append([]byte(nil), ping...), 0, 0, 0, 0)},
		seed{"bad-then-good", append(prefixed(payload(0x00, 0, 0)), ping...)},
	)
	return seeds
}

// writeCorpus writes seeds as `go test fuzz v1` files under
// testdata/fuzz/<name>.
func writeCorpus(t *testing.T, name string, seeds []seed) {
	dir := filepath.Join("testdata", "fuzz", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range seeds {
		text := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s.data)) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, s.name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWriteFuzzCorpus regenerates the committed seed corpus:
//
//	go test ./wire -run TestWriteFuzzCorpus -update-corpus
func TestWriteFuzzCorpus(t *testing.T) {
	if !*updateCorpus {
		t.Skip("run with -update-corpus to rewrite testdata/fuzz")
	}
	writeCorpus(t, "FuzzDecode", decodeSeeds(t))
	writeCorpus(t, "FuzzReader", readerSeeds(t))
}

// FuzzDecode checks that Decode never panics, fails only with
// ErrMalformed, does not modify its input, and that what it accepts
// encodes back to a frame that decodes equal.
func FuzzDecode(f *testing.F) {
	for _, s := range decodeSeeds(f) {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		orig := bytes.Clone(p)
		var fr Frame
		err := Decode(p, &fr)
		if !bytes.Equal(p, orig) {
			t.Fatal("Decode modified its input")
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode error %v does not wrap ErrMalformed", err)
			}
			return
		}
		enc, err := AppendFrame(nil, &fr, 0)
		if err != nil {
			t.Fatalf("AppendFrame of a decoded frame: %v", err)
		}
		if n := binary.BigEndian.Uint32(enc); int(n) != len(enc)-4 {
			t.Fatalf("length prefix %d, %d bytes follow", n, len(enc)-4)
		}
		// The encoding is canonical: minimal varints, zero fields left
		// out, duplicate headers merged. It is never longer.
		if len(enc)-4 > len(p) {
			t.Fatalf("re-encoding grew the frame from %d to %d bytes", len(p), len(enc)-4)
		}
		var again Frame
		if err := Decode(enc[4:], &again); err != nil {
			t.Fatalf("decoding the re-encoded frame: %v\ninput   % x\nencoded % x", err, p, enc)
		}
		if d := sameFrame(&fr, &again); d != "" {
			t.Fatalf("frame changed through AppendFrame and Decode: %s\ninput % x", d, p)
		}
	})
}

// halves returns data in two reads, split at the middle, as nats-server's
// FuzzParser feeds its parser.
type halves struct {
	parts [2][]byte
	i     int
}

func (h *halves) Read(p []byte) (int, error) {
	for h.i < 2 && len(h.parts[h.i]) == 0 {
		h.i++
	}
	if h.i == 2 {
		return 0, io.EOF
	}
	n := copy(p, h.parts[h.i])
	h.parts[h.i] = h.parts[h.i][n:]
	return n, nil
}

// FuzzReader feeds arbitrary bytes through a Reader with a small limit, in
// two reads, and checks it against a plain walk over the bytes with
// Decode: the same frames, then the same error.
func FuzzReader(f *testing.F) {
	for _, s := range readerSeeds(f) {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		wantFrames, wantErr := walk(data, fuzzMax)
		mid := len(data) / 2
		r := NewReader(&halves{parts: [2][]byte{data[:mid], data[mid:]}}, fuzzMax)
		var got []Frame
		var err error
		// Every frame takes at least 7 bytes, so a Reader that returns
		// more frames than that is looping.
		for limit := len(data)/(4+minFrame) + 1; ; limit-- {
			if limit < 0 {
				t.Fatalf("Reader returned more frames than %d bytes can hold", len(data))
			}
			var fr Frame
			if err = r.Next(&fr); err != nil {
				break
			}
			got = append(got, fr)
		}
		if len(got) != len(wantFrames) {
			t.Fatalf("Reader returned %d frames, want %d (then %v, want %v)", len(got), len(wantFrames), err, wantErr)
		}
		for i := range got {
			if d := sameFrame(&got[i], &wantFrames[i]); d != "" {
				t.Fatalf("frame %d: %s", i, d)
			}
		}
		switch {
		case errors.Is(wantErr, ErrMalformed) || errors.Is(wantErr, ErrFrameTooLarge):
			if err == nil || err.Error() != wantErr.Error() {
				t.Fatalf("Reader error %v, want %v", err, wantErr)
			}
		case err != wantErr:
			t.Fatalf("Reader error %v, want %v", err, wantErr)
		}
		// Bodies returned earlier must be intact after all the reads.
		for i := range got {
			if !bytes.Equal(got[i].Body, wantFrames[i].Body) {
				t.Fatalf("body %d changed after later reads", i)
			}
		}
	})
}

// walk decodes a stream of frames the simple way, as a reference for the
// Reader: the frames up to the first error, and that error.
func walk(data []byte, max int) ([]Frame, error) {
	var frames []Frame
	for {
		if len(data) == 0 {
			return frames, io.EOF
		}
		if len(data) < 4 {
			return frames, io.ErrUnexpectedEOF
		}
		n := binary.BigEndian.Uint32(data)
		if uint64(n) > uint64(max) {
			return frames, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, max)
		}
		if len(data)-4 < int(n) {
			return frames, io.ErrUnexpectedEOF
		}
		var f Frame
		if err := Decode(data[4:4+n], &f); err != nil {
			return frames, err
		}
		frames = append(frames, f)
		data = data[4+n:]
	}
}
