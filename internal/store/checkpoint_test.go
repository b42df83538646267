package store

import (
	"bytes"
	"errors"
	"path"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

func checkpointT(t testing.TB, l *Log, state string) Pos {
	t.Helper()
	at, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte(state), nil })
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	return at
}

// segFiles lists the segment numbers on disk.
func segFiles(t testing.TB, fs FS) []uint32 {
	t.Helper()
	names, err := listSorted(fs, testDir)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint32
	for _, n := range names {
		if s, ok := parseSegName(n); ok {
			out = append(out, s)
		}
	}
	return out
}

// TestCheckpointReplay: after a checkpoint, Open returns its state and
// Replay yields only the records appended after it.
func TestCheckpointReplay(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	l, _ := mustOpen(t, fs, testDir, opts)
	before := appendN(t, l, 0, 50)
	var seen Pos
	at, err := l.Checkpoint(func(p Pos) ([]byte, error) { seen = p; return []byte("state-1"), nil })
	if err != nil {
		t.Fatal(err)
	}
	if at != seen || !before[49].Less(at) {
		t.Fatalf("checkpoint at %v (snapshot saw %v), last record %v", at, seen, before[49])
	}
	after := appendN(t, l, 50, 30)
	mustClose(t, l)

	l, rec := mustOpen(t, fs, testDir, opts)
	if string(rec.State) != "state-1" || rec.From != at || rec.ReplayRecords != 30 || !rec.Clean() {
		t.Fatalf("recovery: %+v", rec)
	}
	got := replayAll(t, l)
	if len(got) != 30 {
		t.Fatalf("replayed %d, want 30", len(got))
	}
	for i, r := range got {
		if r.Ref != after[i] || !bytes.Equal(r.Payload, payloadFor(50+i)) {
			t.Fatalf("replay %d: %v want %v", i, r.Ref, after[i])
		}
	}
	for i, ref := range before {
		checkRead(t, l, ref, i)
	}
	// Restart work follows what was written since the checkpoint: a new
	// checkpoint with nothing after it replays nothing.
	at2 := checkpointT(t, l, "state-2")
	mustClose(t, l)
	l, rec = mustOpen(t, fs, testDir, opts)
	if string(rec.State) != "state-2" || rec.From != at2 || rec.ReplayRecords != 0 || len(replayAll(t, l)) != 0 {
		t.Fatalf("recovery after an idle checkpoint: %+v", rec)
	}
}

// TestCheckpointOnFreshLog checkpoints before anything was appended.
func TestCheckpointOnFreshLog(t *testing.T) {
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, smallOptions())
	checkpointT(t, l, "empty")
	refs := appendN(t, l, 0, 3)
	mustClose(t, l)
	l, rec := mustOpen(t, fs, testDir, smallOptions())
	if string(rec.State) != "empty" || len(replayAll(t, l)) != 3 || !rec.Clean() {
		t.Fatalf("recovery: %+v", rec)
	}
	for i, ref := range refs {
		checkRead(t, l, ref, i)
	}
}

// TestCheckpointCrashDuringWrite fails each step of writing a checkpoint,
// and crashes there: the previous checkpoint stands.
func TestCheckpointCrashDuringWrite(t *testing.T) {
	for _, step := range []struct {
		op   Op
		name string
	}{
		{OpCreate, checkpointTemp},
		{OpWrite, checkpointTemp},
		{OpSync, checkpointTemp},
		{OpRename, checkpointName},
		{OpSyncDir, "db"},
	} {
		t.Run(step.op.String(), func(t *testing.T) {
			fs := NewMemFS()
			opts := smallOptions()
			l, _ := mustOpen(t, fs, testDir, opts)
			appendN(t, l, 0, 20)
			at1 := checkpointT(t, l, "old")
			appendN(t, l, 20, 20)
			fs.SetInjector(func(op Op, name string) error {
				if op == step.op && path.Base(name) == step.name {
					return ErrInjected
				}
				return nil
			})
			_, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("new"), nil })
			if !errors.Is(err, ErrInjected) {
				t.Fatalf("checkpoint with a failing %v: %v", step.op, err)
			}
			if got := l.Stats().CheckpointPos; got != at1 {
				t.Fatalf("failed checkpoint moved the position to %v", got)
			}
			crashed := fs.Crash(func(_ string, n int) int { return n / 2 })
			fs.SetInjector(nil)
			l2, rec := mustOpen(t, crashed, testDir, opts)
			if string(rec.State) != "old" || rec.From != at1 || rec.CheckpointErr != nil {
				t.Fatalf("recovery: %+v", rec)
			}
			if got := replayAll(t, l2); len(got) != 20 {
				t.Fatalf("replayed %d, want 20", len(got))
			}
		})
	}
}

// TestCheckpointCrashAfterRename: the rename happened but the directory
// was not synced; a crash may show either checkpoint, whole.
func TestCheckpointCrashAfterRename(t *testing.T) {
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, smallOptions())
	appendN(t, l, 0, 5)
	checkpointT(t, l, "old")
	// Keep the new checkpoint's rename from becoming durable.
	fs.SetInjector(func(op Op, name string) error {
		if op == OpSyncDir {
			return ErrInjected
		}
		return nil
	})
	if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("new"), nil }); err == nil {
		t.Fatal("checkpoint succeeded without a durable rename")
	}
	fs.SetInjector(nil)
	_, rec := mustOpen(t, fs.Crash(nil), testDir, smallOptions())
	if string(rec.State) != "old" {
		t.Fatalf("state after crash: %q", rec.State)
	}
	// Without a crash (the rename is visible), the new one is read.
	l.Close()
	_, rec = mustOpen(t, fs, testDir, smallOptions())
	if string(rec.State) != "new" {
		t.Fatalf("state without crash: %q", rec.State)
	}
}

// TestSegmentDeletion: segments roll over; one whose records are all
// released is deleted once a checkpoint is past it, never before, and
// never the active one.
func TestSegmentDeletion(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	l, _ := mustOpen(t, fs, testDir, opts)
	refs := appendN(t, l, 0, 80)
	last := refs[len(refs)-1].Seg
	if last < 4 {
		t.Fatalf("only %d segments", last)
	}
	var seg1, seg2, rest []Ref
	for _, r := range refs {
		switch r.Seg {
		case 1:
			seg1 = append(seg1, r)
		case 2:
			seg2 = append(seg2, r)
		default:
			rest = append(rest, r)
		}
	}
	// Release all of segment 1 and all but one record of segment 2.
	if err := l.Release(0, seg1, nil); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(0, seg2[1:], nil); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := segFiles(t, fs); len(got) != int(last) {
		t.Fatalf("segments deleted before a checkpoint: %v", got)
	}
	checkpointT(t, l, "s")
	if got := segFiles(t, fs); len(got) != int(last)-1 || got[0] != 2 {
		t.Fatalf("after checkpoint: %v", got)
	}
	// From here on, a checkpoint is past the segments, so the janitor may
	// delete them as soon as their release is durable, in the background.
	if s := l.Stats(); s.SegmentsDeleted != 1 || s.LiveRecords != int64(1+len(rest)) {
		t.Fatalf("stats: %+v", s)
	}
	// The last record of segment 2 goes: deleted at the next checkpoint.
	if err := l.Release(0, seg2[:1], nil); err != nil {
		t.Fatal(err)
	}
	checkpointT(t, l, "s")
	testutil.WaitForf(t, 5*time.Second, func() bool { return segFiles(t, fs)[0] == 3 }, "segment 2 deleted: %v", segFiles(t, fs))
	// Releasing everything keeps the active segment.
	if err := l.Release(0, rest, nil); err != nil {
		t.Fatal(err)
	}
	checkpointT(t, l, "s")
	testutil.WaitForf(t, 5*time.Second, func() bool { return len(segFiles(t, fs)) == 1 }, "all but the active segment deleted: %v", segFiles(t, fs))
	if got := segFiles(t, fs); got[0] != l.Stats().End.Seg {
		t.Fatalf("after releasing everything: %v (end %v)", got, l.Stats().End)
	}
	if s := l.Stats(); s.LiveRecords != 0 || s.BadReleases != 0 || s.SegmentsDeleted != uint64(last)-1 {
		t.Fatalf("stats: %+v", s)
	}
	// And the accounting survives a restart.
	mustClose(t, l)
	l, rec := mustOpen(t, fs, testDir, opts)
	if s := l.Stats(); s.LiveRecords != 0 || s.Segments != 1 || !rec.Clean() {
		t.Fatalf("after reopen: %+v %+v", s, rec)
	}
}

// TestDeletionWaitsForDurableRelease: a checkpoint is past a segment but
// the release that killed it is not yet durable: the segment stays until
// it is.
func TestDeletionWaitsForDurableRelease(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	opts.Sync = Interval
	opts.SyncInterval = time.Hour // only Sync (and Close) sync
	l, _ := mustOpen(t, fs, testDir, opts)
	var refs []Ref
	for i := range 60 {
		r, err := l.Append(uint32(i%7), 1, payloadFor(i), nil)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r)
	}
	checkpointT(t, l, "s") // syncs
	var seg1 []Ref
	for _, r := range refs {
		if r.Seg == 1 {
			seg1 = append(seg1, r)
		}
	}
	if err := l.Release(0, seg1, nil); err != nil {
		t.Fatal(err)
	}
	l.collect()
	if got := segFiles(t, fs); got[0] != 1 {
		t.Fatalf("segment deleted before its release was durable: %v", got)
	}
	// A crash now must not lose segment 1: its records are live again.
	crashed := fs.Crash(nil)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, func() bool { return segFiles(t, fs)[0] == 2 })

	l2, rec := mustOpen(t, crashed, testDir, opts)
	if !rec.Clean() {
		t.Fatalf("recovery: %+v", rec)
	}
	for i, r := range seg1 {
		checkRead(t, l2, r, i)
	}
}

// TestReleaseRecovered: releases made after the checkpoint are replayed,
// both to the caller (release records) and to the live counts; a crash
// after segments were deleted brings nothing back.
func TestReleaseRecovered(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	l, _ := mustOpen(t, fs, testDir, opts)
	refs := appendN(t, l, 0, 80)
	checkpointT(t, l, "s")
	// Release every even record, after the checkpoint.
	var dead []Ref
	for i, r := range refs {
		if i%2 == 0 {
			dead = append(dead, r)
		}
	}
	for _, r := range dead {
		if err := l.Release(7, []Ref{r}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	want := l.Stats()
	l2, rec := mustOpen(t, fs.Crash(nil), testDir, opts)
	if !rec.Clean() {
		t.Fatalf("recovery: %+v", rec)
	}
	got := l2.Stats()
	if got.LiveRecords != want.LiveRecords || got.LiveBytes != want.LiveBytes {
		t.Fatalf("live after crash %d/%d, want %d/%d", got.LiveRecords, got.LiveBytes, want.LiveRecords, want.LiveBytes)
	}
	var released []Ref
	for _, r := range replayAll(t, l2) {
		if r.Kind != KindRelease {
			t.Fatalf("replayed a %d record at %v", r.Kind, r.Ref)
		}
		if r.Queue != 7 {
			t.Fatalf("release record for queue %d", r.Queue)
		}
		released, _ = r.Released(released)
	}
	if len(released) != len(dead) {
		t.Fatalf("replayed %d releases, want %d", len(released), len(dead))
	}
	for i := range dead {
		if released[i] != dead[i] {
			t.Fatalf("release %d: %v want %v", i, released[i], dead[i])
		}
	}
	l2.Close()

	// Now delete: a new checkpoint is past everything released; segments
	// with only odd records left stay.
	checkpointT(t, l, "s2")
	l.Close()
	before := segFiles(t, fs)
	l3, rec := mustOpen(t, fs.Crash(nil), testDir, opts)
	if !rec.Clean() || len(rec.Missing) != 0 {
		t.Fatalf("recovery: %+v", rec)
	}
	if after := segFiles(t, l3.fs); len(after) != len(before) {
		t.Fatalf("segments %v after reopen, %v before", after, before)
	}
	for i, r := range refs {
		if i%2 == 1 {
			checkRead(t, l3, r, i)
		}
	}
	if s := l3.Stats(); s.LiveRecords != int64(len(refs)/2) {
		t.Fatalf("live %d", s.LiveRecords)
	}
}

// TestBigRelease splits a release larger than one record.
func TestBigRelease(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	opts.MaxRecordSize = 120 // 10 refs per release record
	l, _ := mustOpen(t, fs, testDir, opts)
	var refs []Ref
	for i := range 95 {
		r, err := l.AppendSync(1, 1, []byte{byte(i)})
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r)
	}
	done := make(chan error, 1)
	if err := l.Release(1, refs, func(err error) { done <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.LiveRecords != 0 || s.Records != 95+10 {
		t.Fatalf("stats: %+v", s)
	}
}
