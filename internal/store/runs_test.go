package store

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

func TestRunsWriteReadDrop(t *testing.T) {
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, smallOptions())
	a, err := l.WriteRun(7, []byte("hello, run"))
	must(t, err)
	b, err := l.WriteRun(7, []byte("second"))
	must(t, err)
	c, err := l.WriteRun(8, []byte("other queue"))
	must(t, err)
	if a == b || b == c {
		t.Fatalf("run numbers %d %d %d", a, b, c)
	}
	if got := l.Runs(7); !slices.Equal(got, []uint32{a, b}) {
		t.Fatalf("runs of 7: %v", got)
	}
	buf := make([]byte, 4)
	n, err := l.ReadRun(7, a, 7, buf)
	must(t, err)
	if string(buf[:n]) != "run" {
		t.Fatalf("read %q", buf[:n])
	}
	if _, err := l.ReadRun(7, 999, 0, buf); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read of a missing run: %v", err)
	}
	// A dropped run stays until the next checkpoint is durable.
	l.DropRun(7, a)
	if got := l.Runs(7); !slices.Equal(got, []uint32{b}) {
		t.Fatalf("runs of 7 after the drop: %v", got)
	}
	if _, err := fs.ReadFile(testDir + "/" + runName(runKey{7, a})); err != nil {
		t.Fatalf("dropped run deleted before a checkpoint: %v", err)
	}
	checkpointT(t, l, "s")
	if _, err := fs.ReadFile(testDir + "/" + runName(runKey{7, a})); err == nil {
		t.Fatal("dropped run still there after a checkpoint")
	}
	if s := l.Stats(); s.Runs != 2 || s.RunsWritten != 3 || s.RunsDeleted != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestRunsDurableAtCheckpoint: a run written before a checkpoint
// survives a crash whole; one written after it may be lost; Open finds
// the runs left and numbers new ones after them (a lost run's number
// may come back: nothing durable names it).
func TestRunsDurableAtCheckpoint(t *testing.T) {
	fs := NewMemFS()
	l, _ := mustOpen(t, fs, testDir, smallOptions())
	data := bytes.Repeat([]byte("x"), 5000)
	a, err := l.WriteRun(1, data)
	must(t, err)
	checkpointT(t, l, "s")
	b, err := l.WriteRun(1, data)
	must(t, err)

	crashed := fs.Crash(nil)
	l2, rec := mustOpen(t, crashed, testDir, smallOptions())
	if got := l2.Runs(1); !slices.Contains(got, a) || slices.Contains(got, b) {
		t.Fatalf("runs after the crash: %v (a %d, b %d); recovery %+v", got, a, b, rec)
	}
	buf := make([]byte, len(data))
	n, err := l2.ReadRun(1, a, 0, buf)
	must(t, err)
	if n != len(data) || !bytes.Equal(buf, data) {
		t.Fatalf("run %d: read %d bytes", a, n)
	}
	c, err := l2.WriteRun(1, data)
	must(t, err)
	if c <= a {
		t.Fatalf("new run %d reuses the number of a run found (%d)", c, a)
	}
}

// TestReleaseDoesNotWaitForFlowControl: with the disk stalled and
// MaxPending reached, appends wait but releases (acks) go through.
func TestReleaseDoesNotWaitForFlowControl(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	opts.MaxPending = 2 << 10
	l, _ := mustOpen(t, fs, testDir, opts)
	refs := appendN(t, l, 0, 20)
	must(t, l.Sync())

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
	defer fs.SetInjector(nil)
	filled := make(chan struct{})
	go func() {
		defer close(filled)
		for range 40 {
			if _, err := l.Append(1, 1, make([]byte, 200), nil); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	<-stalled
	testutil.WaitFor(t, 5*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.pend.bytes >= opts.MaxPending
	})
	for _, r := range refs {
		must(t, l.Release(1, []Ref{r}, nil))
	}
	if _, err := l.AppendNoWait(1, 1, []byte("no wait"), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := l.WaitSpace(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitSpace with the disk stalled: %v", err)
	}
	close(unstall)
	<-filled
	must(t, l.WaitSpace(context.Background()))
	must(t, l.Sync())
}

func TestDiskAlarm(t *testing.T) {
	fs := NewMemFS()
	opts := smallOptions()
	opts.MinFreeDisk = 1 << 20
	opts.DiskCheckInterval = time.Millisecond
	l, _ := mustOpen(t, fs, testDir, opts)
	if l.DiskAlarm() {
		t.Fatal("alarm with a free disk")
	}
	fs.SetFreeSpace(512 << 10)
	testutil.WaitFor(t, 5*time.Second, l.DiskAlarm)
	if s := l.Stats(); !s.DiskAlarm || s.DiskFree != 512<<10 {
		t.Fatalf("stats %+v", s)
	}
	// Above the limit but not by a segment: still on.
	fs.SetFreeSpace(opts.MinFreeDisk + 1)
	l.checkDisk()
	if !l.DiskAlarm() {
		t.Fatal("alarm cleared without hysteresis")
	}
	fs.SetFreeSpace(4 << 20)
	testutil.WaitFor(t, 5*time.Second, func() bool { return !l.DiskAlarm() })
	// Appends go on under the alarm: it is for flow control upstream.
	fs.SetFreeSpace(0)
	l.checkDisk()
	appendN(t, l, 0, 3)
	must(t, l.Sync())
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
