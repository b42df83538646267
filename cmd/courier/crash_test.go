package main

import (
	"fmt"
	"strconv"
	"strings"
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
		n := killAfterConfirms(t, srv, round, producers, perRound, make(chan struct{}), &mu, confirmed,
			func(_ int, body string, done func(error)) error {
				return ex.SubmitAsync(ctx, courier.Task{Body: []byte(body)}, func(_ courier.TaskID, err error) { done(err) })
			})
		conn.Close()
		t.Logf("round %d: killed after %d confirms", round, n)
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

// TestCrashKeepsConfirmedPublishes kills a real server with SIGKILL while
// producers publish with confirms (PublishAsync) into a pub-sub exchange
// with a durable subscription, whose subscriber takes some of the
// messages, over several rounds, and checks after the restarts that every
// message confirmed and not taken before a crash is delivered from the
// subscription's queue: nothing confirmed is lost. Messages taken before
// a crash and delivered again after it are at-least-once duplicates;
// they are counted and logged.
func TestCrashKeepsConfirmedPublishes(t *testing.T) {
	dir := t.TempDir()
	addr := "127.0.0.1:" + cliFreePort(t)
	url := "courier://" + addr
	ctx := testutil.Context(t, 3*time.Minute)

	var mu sync.Mutex
	confirmed := map[string]bool{} // bodies confirmed by the broker
	taken := map[string]bool{}     // bodies the subscriber returned from before a crash
	const rounds, producers, perRound, takes = 5, 4, 3000, 1000

	for round := range rounds {
		srv := crashServer(t, addr, dir)
		conn, err := client.Dial(ctx, url, client.Options{Name: "crash-test"})
		if err != nil {
			t.Fatal(err)
		}
		ps, err := conn.PubSub(ctx, "crash-events")
		if err != nil {
			t.Fatal(err)
		}
		// The durable subscriber takes the first messages of the round,
		// then holds one until the crash, so that the rest wait in the
		// subscription's queue.
		stop := make(chan struct{})
		var got atomic.Int64
		if _, err := ps.Subscribe(ctx, "audit.#", func(d *courier.Delivery) {
			if got.Add(1) > takes {
				<-stop
				return
			}
			mu.Lock()
			taken[string(d.Body)] = true
			mu.Unlock()
		}, courier.Durable("audit"), courier.Prefetch(100)); err != nil {
			t.Fatal(err)
		}
		n := killAfterConfirms(t, srv, round, producers, perRound, stop, &mu, confirmed,
			func(p int, body string, done func(error)) error {
				return ps.PublishAsync(ctx, courier.Message{Key: "audit.p" + strconv.Itoa(p), Body: []byte(body)}, done)
			})
		conn.Close()
		t.Logf("round %d: killed after %d confirms", round, n)
	}

	// Restart and drain the subscription until every message confirmed
	// and not taken has come (a queue brought back by a restart delivers
	// its backlog in batches, not in one order with new messages, so a
	// last message published now would mark nothing). A lost message
	// makes this wait run out, and the count below says how many.
	crashServer(t, addr, dir)
	conn, err := client.Dial(ctx, url, client.Options{Name: "crash-drain"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ps, err := conn.PubSub(ctx, "crash-events", courier.Passive())
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	want := map[string]bool{}
	for body := range confirmed {
		if !taken[body] {
			want[body] = true
		}
	}
	mu.Unlock()
	delivered := map[string]int{}
	var dmu sync.Mutex
	missing := len(want)
	if _, err := ps.Subscribe(ctx, "", func(d *courier.Delivery) {
		dmu.Lock()
		delivered[string(d.Body)]++
		if want[string(d.Body)] && delivered[string(d.Body)] == 1 {
			missing--
		}
		dmu.Unlock()
	}, courier.Durable("audit"), courier.Prefetch(1000)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(time.Minute, func() bool {
		dmu.Lock()
		defer dmu.Unlock()
		return missing == 0
	})

	mu.Lock()
	defer mu.Unlock()
	dmu.Lock()
	defer dmu.Unlock()
	lost, dups, twice := 0, 0, 0
	for body := range confirmed {
		if !taken[body] && delivered[body] == 0 {
			lost++
			if lost <= 5 {
				t.Errorf("confirmed message %s lost", body)
			}
		}
	}
	for body, k := range delivered {
		if taken[body] {
			dups++
		}
		if k > 1 {
			twice++
		}
	}
	t.Logf("%d rounds: %d confirmed, %d taken before a crash, %d delivered after the restarts; %d lost, %d taken messages delivered again (at-least-once duplicates), %d delivered twice after the restart",
		rounds, len(confirmed), len(taken), len(delivered), lost, dups, twice)
	if lost > 0 {
		t.Fatalf("%d confirmed messages lost", lost)
	}
	if twice > 0 {
		t.Fatalf("%d messages delivered twice by one run of the server", twice)
	}
}

// TestCrashKeepsPubConfirmed: `courier pub --count N` (confirmed by
// default) into a durable subscription, then kill -9 of the server as
// soon as the command has exited: after a restart the subscription holds
// every message. So it does after `--confirm=false`, whose last message
// is confirmed and so the log holds everything before it.
func TestCrashKeepsPubConfirmed(t *testing.T) {
	dir := t.TempDir()
	addr := "127.0.0.1:" + cliFreePort(t)
	url := "courier://" + addr
	ctx := testutil.Context(t, 2*time.Minute)
	total := 0
	for round, args := range [][]string{
		{"--count", "2000"},
		{"--confirm", "--count", "1000"},
		{"--confirm=false", "--count", "1000"},
	} {
		srv := crashServer(t, addr, dir)
		if round == 0 {
			conn, err := client.Dial(ctx, url, client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			ps, err := conn.PubSub(ctx, "cli-events")
			if err != nil {
				t.Fatal(err)
			}
			a, err := ps.Subscribe(ctx, "audit.#", func(*courier.Delivery) {}, courier.Durable("audit"))
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Detach(ctx); err != nil {
				t.Fatal(err)
			}
			conn.Close()
		}
		out := cliOK(t, append([]string{"pub", "--url", url, "cli-events", "audit.x", "m"}, args...)...)
		n, _ := strconv.Atoi(args[len(args)-1])
		total += n
		if want := fmt.Sprintf("published %d message(s)", n); !strings.Contains(out, want) {
			t.Errorf("courier pub %v printed %q, want %q", args, out, want)
		}
		if err := srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-srv.done
	}

	crashServer(t, addr, dir)
	conn, err := client.Dial(ctx, url, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ps, err := conn.PubSub(ctx, "cli-events", courier.Passive())
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	if _, err := ps.Subscribe(ctx, "", func(*courier.Delivery) { got.Add(1) }, courier.Durable("audit"), courier.Prefetch(1000)); err != nil {
		t.Fatal(err)
	}
	if !testutil.Eventually(30*time.Second, func() bool { return got.Load() >= int64(total) }) {
		t.Fatalf("after kill -9 and a restart the subscription delivered %d of the %d messages `courier pub` published", got.Load(), total)
	}
}

// killAfterConfirms has producers send, each in a loop and with a body
// unique to the round, through send (which calls done with the
// broker's confirm) until perRound confirms came; it then kills srv
// with SIGKILL, closes stop and waits for the producers. Every body
// confirmed is recorded in confirmed, under mu. It returns the
// confirms of the round.
func killAfterConfirms(t *testing.T, srv *cliProc, round, producers, perRound int, stop chan struct{},
	mu *sync.Mutex, confirmed map[string]bool, send func(p int, body string, done func(error)) error) int64 {
	t.Helper()
	var n atomic.Int64
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf("r%d-p%d-%d", round, p, i)
				err := send(p, body, func(err error) {
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
	testutil.WaitForf(t, time.Minute, func() bool { return n.Load() >= int64(perRound) }, "%d confirms before the crash", perRound)
	if err := srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-srv.done
	close(stop)
	wg.Wait()
	return n.Load()
}
