package main

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
)

// crashServer runs `courier server` on addr with data in dir and waits
// until it accepts connections.
func crashServer(t *testing.T, addr, dir string) *cliProc {
	t.Helper()
	srv := cliStart(t, "", nil, "server", "--listen", addr, "--data", dir, "--http", "off", "--log-level", "warn")
	cliAccepting(t, srv, addr)
	return srv
}

// TestCrashKeepsConfirmedTasks kills a real server with SIGKILL while
// producers submit tasks with confirms and a worker acks some of them,
// twice over, and checks after each restart that every task confirmed and
// not acked is delivered: nothing confirmed is lost. Tasks delivered again
// after a crash although acked before it are duplicates, as at-least-once
// allows; they are counted and logged.
func TestCrashKeepsConfirmedTasks(t *testing.T) {
	dir := t.TempDir()
	addr := "127.0.0.1:" + cliFreePort(t)
	url := "courier://" + addr
	ctx := testutil.Context(t, 2*time.Minute)

	var mu sync.Mutex
	confirmed := map[string]bool{} // bodies confirmed by the broker
	acked := map[string]bool{}     // bodies acked by the worker before a crash
	const producers, perRound = 4, 6000

	for round := range 2 {
		srv := crashServer(t, addr, dir)
		conn, err := client.Dial(ctx, url, client.Options{Name: "crash-test"})
		if err != nil {
			t.Fatal(err)
		}
		ex, err := conn.Tasks(ctx, "crash", courier.MaxAttempts(-1))
		if err != nil {
			t.Fatal(err)
		}
		// A worker acks every other task it gets, and holds the rest.
		var seen atomic.Int64
		if _, err := ex.Work(ctx, func(j *courier.Job) error {
			if seen.Add(1)%2 == 0 {
				j.Defer()
				return nil
			}
			mu.Lock()
			acked[string(j.Body)] = true
			mu.Unlock()
			return nil
		}, courier.Prefetch(200)); err != nil {
			t.Fatal(err)
		}
		var n atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for p := range producers {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					body := fmt.Sprintf("r%d-p%d-%d", round, p, i)
					err := ex.SubmitAsync(ctx, courier.Task{Body: []byte(body)}, func(_ courier.TaskID, err error) {
						if err == nil {
							mu.Lock()
							confirmed[body] = true
							mu.Unlock()
							n.Add(1)
						}
					})
					if err != nil {
						return // the server is gone
					}
				}
			})
		}
		testutil.WaitForf(t, time.Minute, func() bool { return n.Load() >= perRound }, "%d confirms before the crash", perRound)
		if err := srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-srv.done
		close(stop)
		wg.Wait()
		conn.Close()
		t.Logf("round %d: killed after %d confirms", round, n.Load())
	}

	// Restart and drain the queue.
	crashServer(t, addr, dir)
	conn, err := client.Dial(ctx, url, client.Options{Name: "crash-drain"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ex, err := conn.Tasks(ctx, "crash")
	if err != nil {
		t.Fatal(err)
	}
	info := ex.Info()
	if info.Queue == nil {
		t.Fatal("no queue in the exchange's description")
	}
	depth := info.Queue.Messages
	delivered := map[string]int{}
	var dmu sync.Mutex
	if _, err := ex.Work(ctx, func(j *courier.Job) error {
		dmu.Lock()
		delivered[string(j.Body)]++
		dmu.Unlock()
		return nil
	}, courier.Prefetch(1000)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForf(t, time.Minute, func() bool {
		dmu.Lock()
		defer dmu.Unlock()
		return int64(len(delivered)) >= depth
	}, "the %d queued tasks delivered", depth)

	mu.Lock()
	defer mu.Unlock()
	dmu.Lock()
	defer dmu.Unlock()
	lost, dups, twice := 0, 0, 0
	for body := range confirmed {
		if !acked[body] && delivered[body] == 0 {
			lost++
			if lost <= 5 {
				t.Errorf("confirmed task %s lost", body)
			}
		}
	}
	for body, k := range delivered {
		if acked[body] {
			dups++
		}
		if k > 1 {
			twice++
		}
	}
	t.Logf("%d confirmed, %d acked before a crash, %d delivered after the restarts; %d lost, %d acked tasks delivered again (at-least-once duplicates), %d delivered twice after the restart",
		len(confirmed), len(acked), len(delivered), lost, dups, twice)
	if lost > 0 {
		t.Fatalf("%d confirmed tasks lost", lost)
	}
	if twice > 0 {
		t.Fatalf("%d tasks delivered twice by one run of the server", twice)
	}
}
