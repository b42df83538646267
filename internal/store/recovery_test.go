package store

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"testing"
)

// oneSegmentOptions keep a test's records in one segment.
func oneSegmentOptions() Options {
	o := DefaultOptions()
	o.SegmentSize = 1 << 20
	o.MaxRecordSize = 4 << 10
	return o
}

// buildLog writes n synced records to a fresh MemFS and closes the log.
func buildLog(t *testing.T, n int, opts Options) (*MemFS, []Ref) {
	t.Helper()
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, opts)
	refs := appendN(t, l, 0, n)
	mustClose(t, l)
	return fs, refs
}

func segPath(seg uint32) string { return path.Join(testDir, segName(seg)) }

// checkKept opens fs and checks that exactly the first keep records of
// refs survive, readable and replayed, and that the log takes appends.
func checkKept(t *testing.T, fs *MemFS, opts Options, refs []Ref, keep int) *Recovery {
	t.Helper()
	l, rec := mustOpen(t, fs, testDir, opts)
	got := replayAll(t, l)
	if len(got) != keep {
		t.Fatalf("replayed %d records, want %d (recovery %+v)", len(got), keep, rec)
	}
	for i := range keep {
		if got[i].Ref != refs[i] || !bytes.Equal(got[i].Payload, payloadFor(i)) {
			t.Fatalf("replayed record %d: %v, want %v", i, got[i].Ref, refs[i])
		}
		checkRead(t, l, refs[i], i)
	}
	for i := keep; i < len(refs); i++ {
		if _, err := l.Read(refs[i], nil); err == nil {
			t.Fatalf("dropped record %d at %v still reads", i, refs[i])
		}
	}
	// The log goes on: new records land after everything kept, and the
	// next open is clean.
	ref, err := l.AppendSync(3, 1, []byte("after"))
	if err != nil {
		t.Fatalf("append after recovery: %v", err)
	}
	if keep > 0 && !refs[keep-1].Less(ref.Pos) {
		t.Fatalf("append after recovery at %v, not after %v", ref, refs[keep-1])
	}
	if len(rec.Truncated) > 0 {
		// After a cut (not a clean end), no position is reused: a stale
		// ref can never read a different record.
		for i := keep; i < len(refs); i++ {
			if ref.Pos == refs[i].Pos {
				t.Fatalf("append after a cut reuses the position of dropped record %d", i)
			}
		}
	}
	mustClose(t, l)
	l, again := mustOpen(t, fs, testDir, opts)
	if !again.Clean() {
		t.Fatalf("second open after recovery not clean: %+v", again)
	}
	if r, err := l.Read(ref, nil); err != nil || string(r.Payload) != "after" {
		t.Fatalf("record appended after recovery: %v", err)
	}
	mustClose(t, l)
	return rec
}

// TestTornTailEveryOffset cuts the segment at every byte offset of its
// last three records (and of its header): open must keep every record
// that is whole, drop the torn one, and say so.
func TestTornTailEveryOffset(t *testing.T) {
	opts := oneSegmentOptions()
	const n = 8
	fs, refs := buildLog(t, n, opts)
	full, err := fs.ReadFile(segPath(1))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(full)) != int64(refs[n-1].end().Off) {
		t.Fatalf("segment is %d bytes, last record ends at %d", len(full), refs[n-1].end().Off)
	}
	from := 0
	for cut := from; cut <= len(full); cut++ {
		if cut > segHeaderSize && cut < int(refs[n-3].Off) {
			continue // whole records only in between: covered by the ends
		}
		t.Run(fmt.Sprintf("cut=%d", cut), func(t *testing.T) {
			crashed := NewMemFS()
			crashed.MkdirAll(testDir)
			crashed.WriteFile(segPath(1), full[:cut])
			keep := 0
			for keep < n && int(refs[keep].end().Off) <= cut {
				keep++
			}
			rec := checkKept(t, crashed, opts, refs, keep)
			switch {
			case cut == len(full):
				if !rec.Clean() || rec.DroppedBytes != 0 {
					t.Fatalf("whole log: %+v", rec)
				}
			case cut == 0:
				// An empty segment file (created, nothing written): a clean end.
				if !rec.Clean() {
					t.Fatalf("empty segment: %+v", rec)
				}
			case cut < segHeaderSize:
				// Not even the header: the segment is dropped whole.
				if len(rec.Truncated) != 1 || rec.DroppedBytes != int64(cut) {
					t.Fatalf("torn header: %+v", rec)
				}
			case cut == int(refs[keep].Off):
				// A cut on a record boundary is a clean end.
				if !rec.Clean() {
					t.Fatalf("cut at a boundary: %+v", rec)
				}
			default:
				want := Damage{Seg: 1, Off: int64(refs[keep].Off), Bytes: int64(cut) - int64(refs[keep].Off), Records: 1}
				if len(rec.Truncated) != 1 || rec.Truncated[0].Seg != want.Seg || rec.Truncated[0].Off != want.Off ||
					rec.Truncated[0].Bytes != want.Bytes || rec.Truncated[0].Records != want.Records ||
					!errors.Is(rec.Truncated[0].Err, ErrCorrupt) {
					t.Fatalf("truncated %+v, want %+v", rec.Truncated, want)
				}
				if rec.DroppedRecords != 1 || rec.DroppedBytes != want.Bytes {
					t.Fatalf("dropped %d records, %d bytes", rec.DroppedRecords, rec.DroppedBytes)
				}
			}
		})
	}
}

// TestCorruptByteInTail flips one byte in the middle of the last segment:
// the record holding it and everything after it are cut, and the count
// of records lost says so.
func TestCorruptByteInTail(t *testing.T) {
	opts := oneSegmentOptions()
	const n = 10
	fs, refs := buildLog(t, n, opts)
	full, _ := fs.ReadFile(segPath(1))
	const k = 4 // the damaged record
	for _, at := range []struct {
		name    string
		off     int
		records int64
	}{
		{"payload", int(refs[k].Off) + recHeaderSize + int(refs[k].Len)/2, n - k},
		{"crc", int(refs[k].Off), n - k},
		{"queue", int(refs[k].Off) + 9, n - k},
		{"kind", int(refs[k].Off) + 12, n - k}, // kind 0: a bad header, but its length still fits
		{"length", int(refs[k].Off) + 6, 1},
	} {
		t.Run(at.name, func(t *testing.T) {
			bad := bytes.Clone(full)
			if at.name == "kind" {
				bad[at.off] = 0
			} else {
				bad[at.off] ^= 0x40
			}
			crashed := NewMemFS()
			crashed.MkdirAll(testDir)
			crashed.WriteFile(segPath(1), bad)
			rec := checkKept(t, crashed, opts, refs, k)
			if len(rec.Truncated) != 1 || rec.Truncated[0].Off != int64(refs[k].Off) ||
				rec.Truncated[0].Bytes != int64(len(full))-int64(refs[k].Off) || rec.DroppedRecords != at.records {
				t.Fatalf("recovery: %+v %+v", rec, rec.Truncated)
			}
		})
	}
}

// TestCorruptSealedSegment damages a segment that is not the last: it is
// reported and stepped over, later segments are kept, and records after
// the damage in it still read by ref (each has its checksum).
func TestCorruptSealedSegment(t *testing.T) {
	opts := smallOptions()
	fs, refs := buildLog(t, 60, opts)
	var inSeg1 []int
	for i, r := range refs {
		if r.Seg == 1 {
			inSeg1 = append(inSeg1, i)
		}
	}
	if len(inSeg1) < 5 || refs[len(refs)-1].Seg < 3 {
		t.Fatalf("want several segments: %v", refs[len(refs)-1])
	}
	k := inSeg1[2]
	data, _ := fs.ReadFile(segPath(1))
	data[refs[k].Off+recHeaderSize] ^= 1
	fs.WriteFile(segPath(1), data)

	l, rec := mustOpen(t, fs, testDir, opts)
	if len(rec.Corrupt) != 1 || rec.Corrupt[0].Seg != 1 || rec.Corrupt[0].Off != int64(refs[k].Off) || len(rec.Truncated) != 0 {
		t.Fatalf("recovery: %+v", rec)
	}
	if want := int64(len(inSeg1) - 2); rec.Corrupt[0].Records != want {
		t.Fatalf("corrupt records %d, want %d", rec.Corrupt[0].Records, want)
	}
	got := replayAll(t, l)
	if want := len(refs) - (len(inSeg1) - 2); len(got) != want {
		t.Fatalf("replayed %d, want %d", len(got), want)
	}
	for i, r := range refs {
		if i == k {
			if _, err := l.Read(r, nil); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("read of the damaged record: %v", err)
			}
			continue
		}
		checkRead(t, l, r, i)
	}
}

// TestTornNewSegment crashes just after a segment file was created:
// empty, or with part of its header.
func TestTornNewSegment(t *testing.T) {
	opts := smallOptions()
	fs, refs := buildLog(t, 30, opts)
	last := refs[len(refs)-1].Seg
	for _, size := range []int{0, 5, segHeaderSize - 1} {
		crashed := fs.Crash(nil)
		crashed.WriteFile(segPath(last+1), appendSegHeader(nil, last+1)[:size])
		rec := checkKept(t, crashed, opts, refs, len(refs))
		if size == 0 {
			if !rec.Clean() {
				t.Fatalf("empty new segment: %+v", rec)
			}
			continue
		}
		if len(rec.Truncated) != 1 || rec.Truncated[0].Seg != last+1 || rec.DroppedBytes != int64(size) {
			t.Fatalf("size %d: %+v", size, rec)
		}
	}
}

// TestSyncLies: a disk that acknowledges syncs and keeps nothing loses
// confirmed records. The store cannot see that, but it must open cleanly
// on what is left: here, the first checkpoint and what it covers.
func TestSyncLies(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	l, _ := mustOpen(t, fs, testDir, opts)
	refs := appendN(t, l, 0, 10)
	if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("s1"), nil }); err != nil {
		t.Fatal(err)
	}
	fs.SetSyncLies(true)
	appendN(t, l, 10, 40)
	if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("s2"), nil }); err != nil {
		t.Fatal(err)
	}
	l.Close()

	l, rec := mustOpen(t, fs.Crash(nil), testDir, opts)
	if string(rec.State) != "s1" || rec.ReplayRecords != 0 || !rec.Clean() {
		t.Fatalf("recovery: %+v", rec)
	}
	for i, ref := range refs {
		checkRead(t, l, ref, i)
	}
	if _, err := l.AppendSync(1, 1, []byte("x")); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointBeyondEnd: the checkpoint says segment 1 reaches further
// than it does (synced data lost): reported as corruption, not a failure,
// and appends go to a new segment.
func TestCheckpointBeyondEnd(t *testing.T) {
	opts := smallOptions()
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, opts)
	refs := appendN(t, l, 0, 5)
	at, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("s"), nil })
	if err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)
	data, _ := fs.ReadFile(segPath(1))
	fs.WriteFile(segPath(1), data[:refs[2].Off])

	l, rec := mustOpen(t, fs, testDir, opts)
	if len(rec.Corrupt) != 1 || rec.From != at || string(rec.State) != "s" {
		t.Fatalf("recovery: %+v", rec)
	}
	ref, err := l.AppendSync(1, 1, []byte("x"))
	if err != nil || ref.Seg != 2 {
		t.Fatalf("append after: %v %v", ref, err)
	}
}

func TestBadCheckpointFile(t *testing.T) {
	opts := smallOptions()
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, opts)
	refs := appendN(t, l, 0, 30)
	if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("state"), nil }); err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)
	name := path.Join(testDir, checkpointName)
	good, _ := fs.ReadFile(name)
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x10
		fs.WriteFile(name, bad)
		l, rec := mustOpen(t, fs, testDir, opts)
		if !errors.Is(rec.CheckpointErr, ErrBadCheckpoint) || rec.State != nil || rec.From != (Pos{}) {
			t.Fatalf("byte %d: %+v", i, rec)
		}
		// Without it, Replay covers the whole log.
		if got := replayAll(t, l); len(got) != len(refs) {
			t.Fatalf("byte %d: replayed %d", i, len(got))
		}
		mustClose(t, l)
	}
	fs.WriteFile(name, good[:10])
	l, rec := mustOpen(t, fs, testDir, opts)
	if !errors.Is(rec.CheckpointErr, ErrBadCheckpoint) {
		t.Fatalf("short checkpoint: %+v", rec)
	}
	mustClose(t, l)
}

func TestMissingSegment(t *testing.T) {
	opts := smallOptions()
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, opts)
	appendN(t, l, 0, 60)
	if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)
	if err := fs.Remove(segPath(2)); err != nil {
		t.Fatal(err)
	}
	_, rec := mustOpen(t, fs, testDir, opts)
	if len(rec.Missing) != 1 || rec.Missing[0] != 2 {
		t.Fatalf("recovery: %+v", rec)
	}
}

func TestUnknownFilesIgnored(t *testing.T) {
	fs := NewMemFS()
	fs.MkdirAll(testDir)
	fs.WriteFile(path.Join(testDir, "notes.txt"), []byte("hello"))
	fs.WriteFile(path.Join(testDir, "zz.seg"), []byte("junk"))
	fs.WriteFile(path.Join(testDir, checkpointTemp), []byte("half a checkpoint"))
	l, rec := mustOpen(t, fs, testDir, smallOptions())
	if !rec.Clean() {
		t.Fatalf("recovery: %+v", rec)
	}
	appendN(t, l, 0, 3)
	if _, err := fs.ReadFile(path.Join(testDir, checkpointTemp)); err == nil {
		t.Fatal("stale checkpoint temp file kept")
	}
}

// TestTornSealedSegment: one unsynced round can span segments, so a crash
// may tear the end of a segment that is not the last: it is cut, reported
// as a torn tail, and the next open is clean.
func TestTornSealedSegment(t *testing.T) {
	opts := smallOptions()
	fs, refs := buildLog(t, 60, opts)
	var last1 int
	for i, r := range refs {
		if r.Seg == 1 {
			last1 = i
		}
	}
	data, _ := fs.ReadFile(segPath(1))
	cut := int(refs[last1].Off) + 7
	fs.WriteFile(segPath(1), data[:cut])
	l, rec := mustOpen(t, fs, testDir, opts)
	if len(rec.Truncated) != 1 || rec.Truncated[0].Seg != 1 || rec.Truncated[0].Off != int64(refs[last1].Off) || len(rec.Corrupt) != 0 {
		t.Fatalf("recovery: %+v", rec)
	}
	if got := len(replayAll(t, l)); got != len(refs)-1 {
		t.Fatalf("replayed %d, want %d", got, len(refs)-1)
	}
	for i, r := range refs {
		if i == last1 {
			if _, err := l.Read(r, nil); !errors.Is(err, ErrNotFound) {
				t.Fatalf("torn record reads: %v", err)
			}
			continue
		}
		checkRead(t, l, r, i)
	}
	mustClose(t, l)
	_, rec = mustOpen(t, fs, testDir, opts)
	if !rec.Clean() {
		t.Fatalf("second open: %+v", rec)
	}
}
