package store

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

const testDir = "/db"

// smallOptions gives 4 KiB segments, so that tests roll over often.
func smallOptions() Options {
	o := DefaultOptions()
	o.SegmentSize = 4 << 10
	o.MaxRecordSize = 1 << 10
	return o
}

// mustOpen opens a log and closes it when the test ends (a second Close
// is harmless).
func mustOpen(t testing.TB, fs FS, dir string, opts Options) (*Log, *Recovery) {
	t.Helper()
	l, rec, err := Open(fs, dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l, rec
}

func mustClose(t testing.TB, l *Log) {
	t.Helper()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// payloadFor is a deterministic payload for record i, of a size that
// varies with i.
func payloadFor(i int) []byte {
	n := (i*37)%300 + 1
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(i + j*7)
	}
	copy(b, fmt.Sprintf("rec-%d-", i))
	return b
}

// appendN appends n records synchronously and returns their refs.
func appendN(t testing.TB, l *Log, from, n int) []Ref {
	t.Helper()
	refs := make([]Ref, 0, n)
	for i := from; i < from+n; i++ {
		ref, err := l.AppendSync(uint32(i%7), 1, payloadFor(i))
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		refs = append(refs, ref)
	}
	return refs
}

// checkRead reads ref and compares it with record i.
func checkRead(t testing.TB, l *Log, ref Ref, i int) {
	t.Helper()
	r, err := l.Read(ref, nil)
	if err != nil {
		t.Fatalf("read record %d at %v: %v", i, ref, err)
	}
	if !bytes.Equal(r.Payload, payloadFor(i)) || r.Queue != uint32(i%7) || r.Kind != 1 || r.Ref != ref {
		t.Fatalf("record %d at %v: got queue %d kind %d ref %v payload %q", i, ref, r.Queue, r.Kind, r.Ref, r.Payload)
	}
}

// replayAll collects the records Replay yields.
func replayAll(t testing.TB, l *Log) []Record {
	t.Helper()
	var out []Record
	err := l.Replay(func(r Record) error {
		r.Payload = bytes.Clone(r.Payload)
		out = append(out, r)
		return nil
	})
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	for _, fsys := range []struct {
		name string
		fs   FS
		dir  string
	}{
		{"mem", NewMemFS(), testDir},
		{"os", OSFS{}, t.TempDir()},
	} {
		t.Run(fsys.name, func(t *testing.T) {
			l, rec := mustOpen(t, fsys.fs, fsys.dir, smallOptions())
			if !rec.Clean() || rec.ReplayRecords != 0 {
				t.Fatalf("fresh log: %+v", rec)
			}
			refs := appendN(t, l, 0, 100)
			for i, ref := range refs {
				checkRead(t, l, ref, i)
			}
			if s := l.Stats(); s.Segments < 3 || s.LiveRecords != 100 || s.Records != 100 {
				t.Fatalf("stats: %+v", s)
			}
			mustClose(t, l)

			l, rec = mustOpen(t, fsys.fs, fsys.dir, smallOptions())
			if !rec.Clean() || rec.ReplayRecords != 100 || rec.State != nil {
				t.Fatalf("reopen: %+v", rec)
			}
			for i, ref := range refs {
				checkRead(t, l, ref, i)
			}
			got := replayAll(t, l)
			if len(got) != 100 {
				t.Fatalf("replayed %d records, want 100", len(got))
			}
			for i, r := range got {
				if r.Ref != refs[i] || !bytes.Equal(r.Payload, payloadFor(i)) {
					t.Fatalf("replay %d: %v %q", i, r.Ref, r.Payload)
				}
			}
			// Appends continue after the recovered end.
			more := appendN(t, l, 100, 10)
			if !refs[99].Less(more[0].Pos) {
				t.Fatalf("append after reopen at %v, before %v", more[0], refs[99])
			}
			for i, ref := range more {
				checkRead(t, l, ref, 100+i)
			}
			if s := l.Stats(); s.LiveRecords != 110 {
				t.Fatalf("live records after reopen: %d", s.LiveRecords)
			}
		})
	}
}

func TestAppendRefusesBadInput(t *testing.T) {
	l, _ := mustOpen(t, NewMemFS(), testDir, smallOptions())
	if _, err := l.Append(1, 0, nil, nil); !errors.Is(err, ErrBadKind) {
		t.Fatalf("kind 0: %v", err)
	}
	if _, err := l.Append(1, KindRelease, nil, nil); !errors.Is(err, ErrBadKind) {
		t.Fatalf("kind release: %v", err)
	}
	if _, err := l.Append(1, 1, make([]byte, 1025), nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too large: %v", err)
	}
	// The largest record fits a fresh segment.
	ref, err := l.AppendSync(1, 1, make([]byte, 1024))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Read(ref, nil); err != nil {
		t.Fatal(err)
	}
	// An empty payload is a record too.
	ref, err = l.AppendSync(1, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := l.Read(ref, nil); err != nil || r.Kind != 2 || len(r.Payload) != 0 {
		t.Fatalf("empty record: %+v %v", r, err)
	}
	if _, err := l.Read(Ref{Pos: Pos{Seg: 99, Off: 16}, Len: 3}, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read past end: %v", err)
	}
	mustClose(t, l)
	if _, err := l.Append(1, 1, nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	if err := l.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := DefaultOptions().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, o := range []Options{
		{SegmentSize: 100},
		{SegmentSize: 4 << 10, MaxRecordSize: 4 << 10},
		{Sync: 9},
		{SyncInterval: -1},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v: valid", o)
		}
	}
	// Zero fields take defaults; MaxRecordSize shrinks to fit small segments.
	o := Options{SegmentSize: 4 << 10}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestLockedDirectory(t *testing.T) {
	for _, fsys := range []struct {
		fs  FS
		dir string
	}{{NewMemFS(), testDir}, {OSFS{}, t.TempDir()}} {
		l, _ := mustOpen(t, fsys.fs, fsys.dir, smallOptions())
		if _, _, err := Open(fsys.fs, fsys.dir, smallOptions()); !errors.Is(err, ErrLocked) {
			t.Fatalf("second open: %v", err)
		}
		mustClose(t, l)
		l, _ = mustOpen(t, fsys.fs, fsys.dir, smallOptions())
		mustClose(t, l)
	}
}

// TestConcurrent runs appenders, readers and releasers together; run it
// with -race.
func TestConcurrent(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	opts.MaxPending = 8 << 10 // exercise flow control
	l, _ := mustOpen(t, fs, testDir, opts)

	const appenders, perAppender = 8, 300
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		appended = map[Ref]int{}
		confirm  atomic.Int64
		refs     = make(chan Ref, appenders*perAppender)
	)
	for a := range appenders {
		wg.Go(func() {
			for i := range perAppender {
				id := a*perAppender + i
				ref, err := l.Append(uint32(id%7), 1, payloadFor(id), func(err error) {
					if err != nil {
						t.Errorf("done %d: %v", id, err)
					}
					confirm.Add(1)
				})
				if err != nil {
					t.Errorf("append %d: %v", id, err)
					return
				}
				mu.Lock()
				appended[ref] = id
				mu.Unlock()
				refs <- ref
			}
		})
	}
	// Readers read records as they are appended (before they are durable),
	// then release them.
	var rwg sync.WaitGroup
	var released atomic.Int64
	for range 3 {
		rwg.Go(func() {
			var buf []byte
			for ref := range refs {
				r, err := l.Read(ref, buf)
				if err != nil {
					t.Errorf("read %v: %v", ref, err)
					continue
				}
				buf = r.Payload[:0]
				mu.Lock()
				id := appended[ref]
				mu.Unlock()
				if !bytes.Equal(r.Payload, payloadFor(id)) {
					t.Errorf("read %v: wrong payload for %d", ref, id)
				}
				if id%2 == 0 {
					if err := l.Release(r.Queue, []Ref{ref}, nil); err != nil {
						t.Errorf("release: %v", err)
					}
					released.Add(1)
				}
			}
		})
	}
	// A checkpointer runs meanwhile, so deletion runs too.
	stop := make(chan struct{})
	var cwg sync.WaitGroup
	cwg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("state"), nil }); err != nil {
				t.Errorf("checkpoint: %v", err)
				return
			}
		}
	})
	wg.Wait()
	close(refs)
	rwg.Wait()
	close(stop)
	cwg.Wait()
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := confirm.Load(); got != appenders*perAppender {
		t.Fatalf("%d confirms, want %d", got, appenders*perAppender)
	}
	s := l.Stats()
	if want := int64(appenders*perAppender) - released.Load(); s.LiveRecords != want {
		t.Fatalf("live records %d, want %d", s.LiveRecords, want)
	}
	if s.BadReleases != 0 {
		t.Fatalf("bad releases: %d", s.BadReleases)
	}
	mustClose(t, l)

	// Everything not released is still readable after a reopen, and the
	// accounting agrees.
	l, rec := mustOpen(t, fs, testDir, opts)
	if !rec.Clean() {
		t.Fatalf("recovery: %+v", rec)
	}
	for ref, id := range appended {
		if id%2 == 1 {
			r, err := l.Read(ref, nil)
			if err != nil || !bytes.Equal(r.Payload, payloadFor(id)) {
				t.Fatalf("after reopen, record %d at %v: %v", id, ref, err)
			}
		}
	}
	if got := l.Stats().LiveRecords; got != s.LiveRecords {
		t.Fatalf("live records after reopen %d, want %d", got, s.LiveRecords)
	}
}

func TestSyncErrorFailsConfirms(t *testing.T) {
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, smallOptions())
	good := appendN(t, l, 0, 5)

	fs.SetInjector(func(op Op, name string) error {
		if op == OpSync {
			return ErrInjected
		}
		return nil
	})
	errs := make(chan error, 10)
	for i := range 10 {
		if _, err := l.Append(1, 1, payloadFor(i), func(err error) { errs <- err }); err != nil {
			// Appends after the failure is seen are refused outright.
			if !errors.Is(err, ErrFailed) {
				t.Fatalf("append %d: %v", i, err)
			}
			errs <- err
		}
	}
	for range 10 {
		if err := <-errs; !errors.Is(err, ErrFailed) || !errors.Is(err, ErrInjected) {
			t.Fatalf("done after a failed sync: %v", err)
		}
	}
	if _, err := l.Append(1, 1, nil, nil); !errors.Is(err, ErrFailed) {
		t.Fatalf("append after failure: %v", err)
	}
	if err := l.Sync(); !errors.Is(err, ErrFailed) {
		t.Fatalf("sync after failure: %v", err)
	}
	if !l.Stats().Failed {
		t.Fatal("stats do not say failed")
	}
	if err := l.Close(); !errors.Is(err, ErrFailed) {
		t.Fatalf("close: %v", err)
	}

	// Reopening recovers what was confirmed.
	fs.SetInjector(nil)
	l, _ = mustOpen(t, fs.Crash(nil), testDir, smallOptions())
	for i, ref := range good {
		checkRead(t, l, ref, i)
	}
}

func TestWriteErrorFailsConfirms(t *testing.T) {
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, smallOptions())
	good := appendN(t, l, 0, 3)
	fs.SetInjector(func(op Op, name string) error {
		if op == OpWrite {
			return ErrInjected
		}
		return nil
	})
	if _, err := l.AppendSync(1, 1, payloadFor(3)); !errors.Is(err, ErrFailed) {
		t.Fatalf("append with a failing write: %v", err)
	}
	l.Close()
	fs.SetInjector(nil)
	// The torn write is cut at reopen; confirmed records stay.
	l, rec := mustOpen(t, fs.Crash(func(string, int) int { return 1 << 30 }), testDir, smallOptions())
	if len(rec.Truncated) != 1 || rec.DroppedRecords != 1 {
		t.Fatalf("recovery: %+v", rec)
	}
	for i, ref := range good {
		checkRead(t, l, ref, i)
	}
}

func TestSegmentCreateErrorFailsConfirms(t *testing.T) {
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, smallOptions())
	fs.SetInjector(func(op Op, name string) error {
		if op == OpSyncDir {
			return ErrInjected
		}
		return nil
	})
	if _, err := l.AppendSync(1, 1, payloadFor(0)); !errors.Is(err, ErrInjected) {
		t.Fatalf("append when the segment cannot be made durable: %v", err)
	}
}

func TestIntervalPolicy(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	opts.Sync = Interval
	opts.SyncInterval = 20 * time.Millisecond
	l, _ := mustOpen(t, fs, testDir, opts)
	var wg sync.WaitGroup
	var confirmed atomic.Int64
	start := time.Now()
	for i := range 50 {
		wg.Add(1)
		if _, err := l.Append(1, 1, payloadFor(i), func(err error) {
			if err != nil {
				t.Error(err)
			}
			confirmed.Add(1)
			wg.Done()
		}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if s := l.Stats(); s.Syncs > 10 {
		t.Fatalf("%d syncs for 50 appends within %v at a 20ms interval", s.Syncs, time.Since(start))
	}
	// Sync does not wait for the interval.
	if _, err := l.Append(1, 1, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	// Everything confirmed is durable: a crash keeps it all.
	mustClose(t, l)
	_, rec := mustOpen(t, fs.Crash(nil), testDir, opts)
	if rec.ReplayRecords != 51 || !rec.Clean() {
		t.Fatalf("recovery: %+v", rec)
	}
}

// TestConfirmedSurvivesCrash crashes the MemFS at random moments while
// appenders run, and checks that every confirmed record is in the
// recovered log, with torn unsynced tails of every length.
func TestConfirmedSurvivesCrash(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	opts := smallOptions()
	opts.MaxPending = 16 << 10 // keep the appenders near the syncs
	for round := range 20 {
		fs := NewMemFS()
		l, _ := mustOpen(t, fs, testDir, opts)
		var (
			mu        sync.Mutex
			confirmed = map[Ref]int{}
			target    = 1 + rng.IntN(400)
			reached   = make(chan struct{})
			wg        sync.WaitGroup
			stop      atomic.Bool
		)
		for a := range 4 {
			wg.Go(func() {
				for i := 0; !stop.Load(); i++ {
					id := a*100000 + i
					var ref Ref
					ready := make(chan struct{})
					r, err := l.Append(uint32(a), 1, payloadFor(id), func(err error) {
						<-ready
						if err == nil {
							mu.Lock()
							confirmed[ref] = id
							if len(confirmed) == target {
								close(reached)
							}
							mu.Unlock()
						}
					})
					ref = r
					close(ready)
					if err != nil {
						return
					}
				}
			})
		}
		// Crash once a random number of records is confirmed, while
		// appends and syncs are in flight.
		<-reached
		mu.Lock()
		snapshot := maps.Clone(confirmed)
		crashed := fs.Crash(func(_ string, n int) int { return rng.IntN(n + 1) })
		mu.Unlock()
		stop.Store(true)
		wg.Wait()
		l.Close()

		l2, rec := mustOpen(t, crashed, testDir, opts)
		for ref, id := range snapshot {
			r, err := l2.Read(ref, nil)
			if err != nil || !bytes.Equal(r.Payload, payloadFor(id)) {
				t.Fatalf("round %d: confirmed record %d at %v lost: %v (recovery %+v)", round, id, ref, err, rec)
			}
		}
		l2.Close()
	}
}

func TestReadErrorsOnDeletedSegment(t *testing.T) {
	l, _ := mustOpen(t, NewMemFS(), testDir, smallOptions())
	refs := appendN(t, l, 0, 40)
	if err := l.Release(0, refs, nil); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Read(refs[0], nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read of a record in a deleted segment: %v", err)
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild()
		return
	}
	os.Exit(m.Run())
}

// TestFlowControl: with the disk stalled, appenders block once
// MaxPending bytes wait, instead of buffering without bound, and go on
// when the disk does.
func TestFlowControl(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	opts.MaxPending = 2 << 10
	l, _ := mustOpen(t, fs, testDir, opts)
	appendN(t, l, 0, 1) // the segment exists

	stalled := make(chan struct{})
	unstall := make(chan struct{})
	var once sync.Once
	fs.SetInjector(func(op Op, name string) error {
		if op == OpWrite {
			once.Do(func() { close(stalled) })
			<-unstall
		}
		return nil
	})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for range 100 {
			if _, err := l.Append(1, 1, make([]byte, 200), nil); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	<-stalled
	pending := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.pend.bytes
	}
	testutil.WaitFor(t, 5*time.Second, func() bool { return pending() >= opts.MaxPending })
	select {
	case <-finished:
		t.Fatal("100 appends of 200 bytes finished with the disk stalled and 2 KiB of room")
	default:
	}
	if p := pending(); p > opts.MaxPending+recHeaderSize+200 {
		t.Fatalf("%d bytes pending, bound %d", p, opts.MaxPending)
	}
	close(unstall)
	<-finished
	fs.SetInjector(nil)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.LiveRecords != 101 {
		t.Fatalf("live %d", s.LiveRecords)
	}
}

// TestDoneMayAppend: a done callback may append and release (here it
// releases its own record and appends an ack), even under flow control.
func TestDoneMayAppend(t *testing.T) {
	opts := smallOptions()
	opts.MaxPending = 1 << 10
	l, _ := mustOpen(t, NewMemFS(), testDir, opts)
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		var ref Ref
		ready := make(chan struct{})
		r, err := l.Append(1, 1, payloadFor(i), func(err error) {
			defer wg.Done()
			<-ready
			if err != nil {
				t.Error(err)
				return
			}
			if err := l.Release(1, []Ref{ref}, nil); err != nil {
				t.Error(err)
			}
			if _, err := l.Append(1, 2, []byte("ack"), nil); err != nil {
				t.Error(err)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		ref = r
		close(ready)
	}
	wg.Wait()
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.LiveRecords != 200 || s.BadReleases != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

// TestCallbackOrderAcrossFailure: callbacks come in append order, and
// once one reports a failure, every later one does.
func TestCallbackOrderAcrossFailure(t *testing.T) {
	for round := range 20 {
		fs := NewMemFS()
		l, _ := mustOpen(t, fs, testDir, smallOptions())
		var (
			mu    sync.Mutex
			order []int
			errs  []error
			wg    sync.WaitGroup
		)
		var writes atomic.Int32
		fs.SetInjector(func(op Op, name string) error {
			if op == OpWrite && writes.Add(1) > int32(round%5+1) {
				return ErrInjected
			}
			return nil
		})
		for i := range 200 {
			wg.Add(1)
			_, err := l.Append(1, 1, payloadFor(i), func(err error) {
				mu.Lock()
				order = append(order, i)
				errs = append(errs, err)
				mu.Unlock()
				wg.Done()
			})
			if err != nil {
				wg.Done()
				break
			}
		}
		wg.Wait()
		failed := false
		for k, i := range order {
			if k > 0 && order[k-1] >= i {
				t.Fatalf("round %d: callback %d after %d", round, i, order[k-1])
			}
			if errs[k] != nil {
				failed = true
			} else if failed {
				t.Fatalf("round %d: record %d confirmed after an earlier failure", round, i)
			}
		}
		if !failed {
			t.Fatalf("round %d: no failure reported", round)
		}
		l.Close()
	}
}
