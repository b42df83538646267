package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
)

// reconnectPromise is how soon a client reaches a server that is up
// after losing its own (docs/cluster.md "Client failover"); the tests
// allow failoverTolerance more for the loaded machine.
const (
	reconnectPromise  = 3 * time.Second
	failoverTolerance = 2 * time.Second
)

// connEventsOf returns a channel of a client's ConnEvents and the
// function that feeds it.
func connEventsOf() (chan courier.ConnEvent, func(courier.ConnEvent)) {
	ch := make(chan courier.ConnEvent, 256)
	return ch, func(ev courier.ConnEvent) { ch <- ev }
}

// nextConnEvent waits for the next event of kind, skipping others.
func nextConnEvent(t *testing.T, ch <-chan courier.ConnEvent, kind courier.ConnEventKind) courier.ConnEvent {
	t.Helper()
	deadline := time.After(cliWait)
	for {
		select {
		case ev := <-ch:
			if ev.Kind == kind {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s event within %v", kind, cliWait)
		}
	}
}

// failoverClient is a client with a handler, a subscriber and a worker,
// which a test checks are served wherever the client is connected.
type failoverClient struct {
	conn   *courier.Conn
	events chan courier.ConnEvent
	h      *courier.Attachment
	got    chan string // keys delivered to the subscriber
	done   chan string // bodies of the tasks the worker handled

	mu  sync.Mutex
	ids map[string]map[courier.TaskID]bool // task ids the worker saw, by body

	checked map[string]bool // the tags of the checks done (used by check only)
}

// taskIDs returns the ids of the tasks the worker handled with body.
func (fc *failoverClient) taskIDs(body string) int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return len(fc.ids[body])
}

func newFailoverClient(t *testing.T, ctx context.Context, url string) *failoverClient {
	t.Helper()
	fc := &failoverClient{got: make(chan string, 1024), done: make(chan string, 1024), ids: map[string]map[courier.TaskID]bool{}}
	var fn func(courier.ConnEvent)
	fc.events, fn = connEventsOf()
	var err error
	fc.conn, err = client.Dial(ctx, url, client.Options{Name: "failover", OnConnEvent: fn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fc.conn.Close() })
	// Transient: a server that did not have them, or lost them, gets
	// them from the client's declarations.
	rr, err := fc.conn.ReqResp(ctx, "fo.rr", courier.RoundRobin, courier.Transient())
	if err != nil {
		t.Fatal(err)
	}
	if fc.h, err = rr.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
		t.Fatal(err)
	}
	ps, err := fc.conn.PubSub(ctx, "fo.news", courier.Transient())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Subscribe(ctx, "fo.#", func(d *courier.Delivery) { fc.got <- d.Key }); err != nil {
		t.Fatal(err)
	}
	jobs, err := fc.conn.Tasks(ctx, "fo.jobs")
	if err != nil {
		t.Fatal(err)
	}
	work := func(j *courier.Job) error {
		fc.mu.Lock()
		if fc.ids[string(j.Body)] == nil {
			fc.ids[string(j.Body)] = map[courier.TaskID]bool{}
		}
		fc.ids[string(j.Body)][j.ID] = true
		fc.mu.Unlock()
		fc.done <- string(j.Body)
		return nil
	}
	if _, err := jobs.Work(ctx, work, courier.Prefetch(8)); err != nil {
		t.Fatal(err)
	}
	return fc
}

// check probes the server at addr with a client of its own: the
// exchanges are there, and the handler, subscriber and worker serve.
func (fc *failoverClient) check(t *testing.T, ctx context.Context, addr, tag string) {
	t.Helper()
	c, err := client.Dial(ctx, "courier://"+addr, client.Options{NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rr, err := c.ReqResp(ctx, "fo.rr", courier.Passive())
	if err != nil {
		t.Fatalf("%s: fo.rr not declared again on %s: %v", tag, addr, err)
	}
	r, err := rr.Request(ctx, courier.Message{Body: []byte(tag)})
	if err != nil || string(r.Body) != tag || r.From != fc.h.ID() {
		t.Fatalf("%s: request on %s: %v, %v; want %q from %s", tag, addr, r, err, tag, fc.h.ID())
	}
	ps, err := c.PubSub(ctx, "fo.news", courier.Passive())
	if err != nil {
		t.Fatalf("%s: fo.news not declared again on %s: %v", tag, addr, err)
	}
	if err := ps.PublishSync(ctx, courier.Message{Key: "fo." + tag}); err != nil {
		t.Fatal(err)
	}
	if g := testutil.Recv(t, fc.got, cliWait); g != "fo."+tag {
		t.Fatalf("%s: subscriber got %q", tag, g)
	}
	jobs, err := c.Tasks(ctx, "fo.jobs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jobs.Submit(ctx, courier.Task{Body: []byte(tag)}); err != nil {
		t.Fatal(err)
	}
	// A task handled before a kill may come again first: its ack's
	// release may not have reached the disk when the server was killed
	// (at-least-once). Anything else is wrong.
	for {
		g := testutil.Recv(t, fc.done, cliWait)
		if g == tag {
			break
		}
		if !fc.checked[g] {
			t.Fatalf("%s: worker got %q", tag, g)
		}
	}
	if fc.checked == nil {
		fc.checked = map[string]bool{}
	}
	fc.checked[tag] = true
}

// TestFailoverBetweenServers runs two independent `courier server`
// processes, a client given both (courier://a,b) with a handler, a
// subscriber and a worker, and kills (SIGKILL) the server it is
// connected to, over and over, restarting it each time: the client is
// on the other one within the promise, its exchanges declared there and
// its attachments back. It reports the distribution of the time from
// the kill to the reconnected event. COURIER_FAILOVER_KILLS sets the
// number of kills (default 20; 3 with -short).
func TestFailoverBetweenServers(t *testing.T) {
	kills := 20
	if testing.Short() {
		kills = 3
	}
	if s := os.Getenv("COURIER_FAILOVER_KILLS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("COURIER_FAILOVER_KILLS=%q", s)
		}
		kills = n
	}
	addrs := []string{"127.0.0.1:" + cliFreePort(t), "127.0.0.1:" + cliFreePort(t)}
	dirs := []string{t.TempDir(), t.TempDir()}
	srvs := []*cliProc{crashServer(t, addrs[0], dirs[0]), crashServer(t, addrs[1], dirs[1])}
	ctx := testutil.Context(t, time.Duration(kills)*cliWait)
	fc := newFailoverClient(t, ctx, "courier://"+addrs[0]+","+addrs[1])
	fc.check(t, ctx, addrs[0], "start")

	on := 0 // Dial tries the list in order
	var sinceKill, down []time.Duration
	for i := range kills {
		killed := time.Now()
		srvs[on].kill()
		ev := nextConnEvent(t, fc.events, courier.ConnReconnected)
		took := time.Since(killed)
		other := 1 - on
		if ev.URL != addrs[other] {
			t.Fatalf("kill %d: reconnected to %s, want %s (the one up)", i, ev.URL, addrs[other])
		}
		if ev.Err != nil {
			t.Errorf("kill %d: not restored: %v", i, ev.Err)
		}
		if took > reconnectPromise+failoverTolerance {
			t.Errorf("kill %d: reconnected %v after the kill; promised %v (+%v tolerance)", i, took, reconnectPromise, failoverTolerance)
		}
		sinceKill, down = append(sinceKill, took), append(down, ev.Down)
		fc.check(t, ctx, addrs[other], fmt.Sprintf("kill%d", i))
		srvs[on] = crashServer(t, addrs[on], dirs[on])
		on = other
	}
	p50, p99 := percentiles(sinceKill)
	d50, d99 := percentiles(down)
	t.Logf("failover over %d kills (SIGKILL → reconnected, re-declared, re-attached): p50 %v p99 %v max %v; from the loss seen: p50 %v p99 %v",
		kills, p50, p99, slices.Max(sinceKill), d50, d99)
}

// percentiles returns the 50th and 99th percentiles of ds (nearest rank).
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)].Round(100 * time.Microsecond)
	}
	return rank(0.50), rank(0.99)
}

// TestRestartSIGKILL kills a `courier server` (SIGKILL) and restarts it
// on the same port and data directory: a request in flight fails at
// once with ErrConnectionLost, submits not yet confirmed are sent again
// (every task is handled; none fails) and stored once (a task whose
// confirm was lost with the server is deduplicated by its producer and
// seq: its resend gets the same task id), and the client's handler,
// subscriber and worker serve again.
func TestRestartSIGKILL(t *testing.T) {
	addr, dir := "127.0.0.1:"+cliFreePort(t), t.TempDir()
	srv := crashServer(t, addr, dir)
	ctx := testutil.Context(t, 4*cliWait)
	fc := newFailoverClient(t, ctx, "courier://"+addr)
	reqEvents, fn := connEventsOf()
	rc, err := client.Dial(ctx, "courier://"+addr, client.Options{Name: "requester", OnConnEvent: fn})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	slow, err := fc.conn.ReqResp(ctx, "fo.slow", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan *courier.Request, 4)
	if _, err := slow.Handle(ctx, func(r *courier.Request) { held <- r }); err != nil {
		t.Fatal(err)
	}
	rr, err := rc.ReqResp(ctx, "fo.slow")
	if err != nil {
		t.Fatal(err)
	}
	failed := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		_, err := rr.Request(rctx, courier.Message{})
		failed <- err
	}()
	testutil.Recv(t, held, cliWait)

	// Producers submit without waiting, through the kill.
	jobs, err := rc.Tasks(ctx, "fo.jobs")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var submitErrs []error
	confirmed := 0
	const tasks = 400
	var wg sync.WaitGroup
	submitted := make(chan struct{})
	go func() {
		defer close(submitted)
		for i := range tasks {
			wg.Add(1)
			err := jobs.SubmitAsync(ctx, courier.Task{Body: []byte("t" + strconv.Itoa(i))}, func(_ courier.TaskID, err error) {
				mu.Lock()
				if err != nil {
					submitErrs = append(submitErrs, err)
				} else {
					confirmed++
				}
				mu.Unlock()
				wg.Done()
			})
			if err != nil {
				wg.Done()
				mu.Lock()
				submitErrs = append(submitErrs, err)
				mu.Unlock()
			}
			if i == tasks/4 {
				srv.kill()
			}
		}
	}()
	err = testutil.Recv(t, failed, cliWait) // not at its two minutes
	if !errors.Is(err, courier.ErrConnectionLost) {
		t.Fatalf("the request in flight failed with %v; want ErrConnectionLost", err)
	}
	<-submitted
	crashServer(t, addr, dir)
	ev := nextConnEvent(t, fc.events, courier.ConnReconnected)
	nextConnEvent(t, reqEvents, courier.ConnReconnected)
	t.Logf("reconnected after %v, %d attempts", ev.Down, ev.Attempts)
	testutil.Closed(t, waitCh(&wg), cliWait, "the submits' confirms")
	if len(submitErrs) > 0 || confirmed != tasks {
		t.Fatalf("%d of %d submits confirmed; errors: %v", confirmed, tasks, submitErrs)
	}
	seen := map[string]bool{}
	for len(seen) < tasks {
		seen[testutil.Recv(t, fc.done, cliWait)] = true
	}
	// A task stored twice would be behind the last of them in the queue:
	// a last task, submitted now and handled after them, flushes it out.
	if _, err := jobs.Submit(ctx, courier.Task{Body: []byte("last")}); err != nil {
		t.Fatal(err)
	}
	for testutil.Recv(t, fc.done, cliWait) != "last" {
	}
	dups := 0
	for i := range tasks {
		if n := fc.taskIDs("t" + strconv.Itoa(i)); n != 1 {
			dups++
			t.Errorf("task t%d stored %d times (distinct task ids)", i, n)
		}
	}
	t.Logf("%d tasks through the kill: %d stored twice", tasks, dups)
	fc.check(t, ctx, addr, "restarted")
}

// waitCh returns a channel closed when wg is done.
func waitCh(wg *sync.WaitGroup) <-chan struct{} {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	return ch
}

// TestCLIURLList: every CLI --url takes a list: a dead server first, a
// live one second; and `courier sub --reconnect` keeps its subscription
// across a restart of its server.
func TestCLIURLList(t *testing.T) {
	dead, dead2 := "127.0.0.1:"+cliFreePort(t), "127.0.0.1:"+cliFreePort(t)
	addr, dir := "127.0.0.1:"+cliFreePort(t), t.TempDir()
	srv := crashServer(t, addr, dir)
	list := "courier://" + dead + "," + addr
	cliOK(t, "exchanges", "create", "cli.list", "--pattern", "pubsub", "--url", list)
	if out := cliOK(t, "exchanges", "--url", list); !strings.Contains(out, "cli.list") {
		t.Fatalf("exchanges through a list: %q", out)
	}
	cliFails(t, exitConnect, []string{"exchanges", "--url", "courier://" + dead + "," + dead2}, "no server of 2 reachable", "connection refused")

	sub := cliStart(t, "", nil, "sub", "cli.list", "#", "--url", list, "--reconnect", "--count", "1")
	sub.waitStderr(t, "subscribed to # on cli.list")
	srv.kill()
	crashServer(t, addr, dir)
	sub.waitStderr(t, "reconnected to "+addr)
	testutil.WaitForf(t, cliWait, func() bool {
		cliOK(t, "pub", "cli.list", "k", "after", "--url", list)
		return sub.exited()
	}, "the subscriber got a message after the restart")
	if code := sub.wait(t); code != 0 || !strings.Contains(sub.stdout.String(), "after") {
		t.Fatalf("sub exited %d\nstdout:\n%s\nstderr:\n%s", code, sub.stdout.String(), sub.stderr.String())
	}
}
