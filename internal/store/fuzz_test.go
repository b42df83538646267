package store

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"testing"
)

// fuzzSeeds are segment files: valid ones, and ones cut or damaged.
func fuzzSeeds() map[string][]byte {
	fs := NewMemFS()
	opts := oneSegmentOptions()
	l, _, err := Open(fs, testDir, opts)
	if err != nil {
		panic(err)
	}
	var refs []Ref
	for i := range 5 {
		r, err := l.AppendSync(uint32(i), Kind(1+i%3), payloadFor(i))
		if err != nil {
			panic(err)
		}
		refs = append(refs, r)
	}
	if err := l.Release(2, refs[1:3], nil); err != nil {
		panic(err)
	}
	if _, err := l.AppendSync(9, 1, nil); err != nil {
		panic(err)
	}
	l.Close()
	valid, _ := fs.ReadFile(segPath(1))
	flipped := append([]byte(nil), valid...)
	flipped[int(refs[2].Off)+recHeaderSize+3] ^= 0x80
	bigLen := append([]byte(nil), valid...)
	bigLen[int(refs[1].Off)+7] = 0x7f
	return map[string][]byte{
		"valid":         valid,
		"torn-record":   valid[:refs[3].Off+20],
		"torn-header":   valid[:refs[3].Off+5],
		"header-only":   valid[:segHeaderSize],
		"short-header":  valid[:7],
		"flipped-byte":  flipped,
		"huge-length":   bigLen,
		"zero-tail":     append(append([]byte(nil), valid...), make([]byte, 64)...),
		"wrong-segment": appendSegHeader(nil, 2),
	}
}

// FuzzSegment opens a log whose only segment holds arbitrary bytes: Open
// must succeed, never panic, cut what does not check, and leave a log
// that replays, appends, reads back, and reopens clean.
func FuzzSegment(f *testing.F) {
	for _, seed := range fuzzSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fs := NewMemFS()
		fs.MkdirAll(testDir)
		fs.WriteFile(segPath(1), data)
		opts := oneSegmentOptions()
		l, rec, err := Open(fs, testDir, opts)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		n := 0
		if err := l.Replay(func(r Record) error {
			n++
			if r.Kind == KindRelease {
				r.Released(nil)
			}
			return nil
		}); err != nil {
			t.Fatalf("Replay: %v", err)
		}
		if int64(n) != rec.ReplayRecords {
			t.Fatalf("replayed %d records, recovery counted %d", n, rec.ReplayRecords)
		}
		ref, err := l.AppendSync(1, 1, []byte("fuzz"))
		if err != nil {
			t.Fatalf("append: %v", err)
		}
		if r, err := l.Read(ref, nil); err != nil || string(r.Payload) != "fuzz" {
			t.Fatalf("read back: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		l, rec, err = Open(fs, testDir, opts)
		if err != nil {
			t.Fatalf("second Open: %v", err)
		}
		if !rec.Clean() {
			t.Fatalf("second Open not clean: %+v", rec)
		}
		if r, err := l.Read(ref, nil); err != nil || string(r.Payload) != "fuzz" {
			t.Fatalf("read back after reopen: %v", err)
		}
		l.Close()
	})
}

// FuzzCheckpoint opens a log whose checkpoint file holds arbitrary bytes.
func FuzzCheckpoint(f *testing.F) {
	f.Add(encodeCheckpoint(&checkpoint{at: Pos{Seg: 1, Off: 100}, segs: []segCount{{seg: 1, live: 3, liveBytes: 90}}, state: []byte("state")}))
	f.Add(encodeCheckpoint(&checkpoint{at: Pos{Seg: 7}}))
	f.Add([]byte("CRCK"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if c, err := decodeCheckpoint(data); err == nil {
			// What decodes, encodes back to the same bytes.
			if got := encodeCheckpoint(c); string(got) != string(data) {
				t.Fatalf("re-encoded checkpoint differs")
			}
		}
		fs := NewMemFS()
		fs.MkdirAll(testDir)
		fs.WriteFile(path.Join(testDir, checkpointName), data)
		seeds := fuzzSeeds()
		fs.WriteFile(segPath(1), seeds["valid"])
		l, _, err := Open(fs, testDir, oneSegmentOptions())
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if err := l.Replay(func(Record) error { return nil }); err != nil {
			t.Fatalf("Replay: %v", err)
		}
		l.AppendSync(1, 1, []byte("x"))
		l.Close()
	})
}

// TestWriteFuzzCorpus regenerates testdata/fuzz/FuzzSegment from
// fuzzSeeds when COURIER_WRITE_CORPUS is set (after a format change).
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("COURIER_WRITE_CORPUS") == "" {
		t.Skip("set COURIER_WRITE_CORPUS=1 to rewrite the seed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzSegment")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range fuzzSeeds() {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
