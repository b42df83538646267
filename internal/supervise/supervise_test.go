package supervise

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

const wait = 10 * time.Second

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, cfg Config, comps ...Component) *Supervisor {
	t.Helper()
	if cfg.Log == nil {
		cfg.Log = quiet()
	}
	if cfg.RestartDelay == 0 {
		cfg.RestartDelay = time.Millisecond
	}
	s := New(cfg)
	for _, c := range comps {
		s.Add(c)
	}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

func status(s *Supervisor, name string) Status {
	for _, st := range s.Status() {
		if st.Name == name {
			return st
		}
	}
	return Status{}
}

// TestPanicLoopEndsFailed: a component that panics every time it starts
// is restarted MaxRestarts times, then marked failed and left alone; a
// critical one is reported on Failed. Its neighbour keeps running.
func TestPanicLoopEndsFailed(t *testing.T) {
	var runs atomic.Int32
	neighbour := make(chan struct{})
	s := start(t, Config{MaxRestarts: 5, Window: time.Minute},
		Component{Name: "crasher", Critical: true, Run: func(context.Context) error {
			runs.Add(1)
			panic("boom")
		}},
		Component{Name: "steady", Run: func(ctx context.Context) error {
			close(neighbour)
			<-ctx.Done()
			return nil
		}},
	)
	err := testutil.Recv(t, s.Failed(), wait)
	if !strings.Contains(err.Error(), "crasher") || !strings.Contains(err.Error(), "boom") {
		t.Errorf("failure %q does not name the component and its panic", err)
	}
	st := status(s, "crasher")
	if st.State != Failed || st.Restarts != 5 || !strings.Contains(st.LastError, "boom") {
		t.Errorf("crasher: %+v, want failed after 5 restarts", st)
	}
	// Failed means left alone: suture dropped it, so no run follows.
	if n := runs.Load(); n != 6 {
		t.Errorf("crasher ran %d times, want 6 (the start and 5 restarts)", n)
	}
	<-neighbour
	if st := status(s, "steady"); st.State != Running {
		t.Errorf("the neighbour is %s, want running", st.State)
	}
	s.Stop()
	if st := status(s, "steady"); st.State != Stopped {
		t.Errorf("after Stop the neighbour is %s, want stopped", st.State)
	}
	if st := status(s, "crasher"); st.State != Failed {
		t.Errorf("after Stop the crasher is %s, want still failed", st.State)
	}
}

// TestCrashesSpreadOutKeepRestarting: crashes further apart than the
// window allows never add up to a failure.
func TestCrashesSpreadOutKeepRestarting(t *testing.T) {
	var mu sync.Mutex
	clock := time.Unix(1_000_000, 0)
	now := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	var runs atomic.Int32
	s := start(t, Config{MaxRestarts: 2, Window: time.Minute, now: now},
		Component{Name: "flaky", Critical: true, Run: func(context.Context) error {
			if runs.Add(1) == 20 {
				return nil // done
			}
			mu.Lock()
			clock = clock.Add(61 * time.Second)
			mu.Unlock()
			return errors.New("flaked")
		}})
	testutil.WaitFor(t, wait, func() bool { return status(s, "flaky").State == Stopped })
	if st := status(s, "flaky"); st.Restarts != 19 {
		t.Errorf("flaky: %+v, want 19 restarts", st)
	}
	select {
	case err := <-s.Failed():
		t.Fatalf("reported failed: %v", err)
	default:
	}
}

// TestNonCriticalFailure: a component that is not critical fails alone;
// nothing is reported on Failed.
func TestNonCriticalFailure(t *testing.T) {
	s := start(t, Config{MaxRestarts: 1, Window: time.Minute},
		Component{Name: "sampler", Run: func(context.Context) error { return errors.New("no") }})
	testutil.WaitFor(t, wait, func() bool { return status(s, "sampler").State == Failed })
	select {
	case err := <-s.Failed():
		t.Fatalf("a non-critical failure was reported: %v", err)
	default:
	}
}

// TestDoneIsNotACrash: a component whose Run returns nil is stopped, not
// restarted.
func TestDoneIsNotACrash(t *testing.T) {
	var runs atomic.Int32
	s := start(t, Config{}, Component{Name: "once", Run: func(context.Context) error {
		runs.Add(1)
		return nil
	}})
	testutil.WaitFor(t, wait, func() bool { return status(s, "once").State == Stopped })
	s.Stop()
	if n := runs.Load(); n != 1 {
		t.Errorf("ran %d times, want 1", n)
	}
}
