package behaviour

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
)

// tasks declares a new task exchange on e.c.
func (e *env) tasks(opts ...courier.ExchangeOption) *courier.Tasks {
	e.t.Helper()
	name := e.name()
	ex, err := e.c.Tasks(e.ctx, name, opts...)
	if err != nil {
		e.t.Fatalf("declare tasks %s: %v", name, err)
	}
	e.deleteLater(name)
	return ex
}

// openTasks opens the existing task exchange name on a new connection.
func (e *env) openTasks(name string) *courier.Tasks {
	e.t.Helper()
	ex, err := e.conn().Tasks(e.ctx, name)
	if err != nil {
		e.t.Fatalf("open tasks %s: %v", name, err)
	}
	return ex
}

// submit submits tasks with bodies "0", "1", ... and returns their ids.
func (e *env) submit(ex *courier.Tasks, n int, key string) []courier.TaskID {
	e.t.Helper()
	ids := make([]courier.TaskID, n)
	for i := range ids {
		id, err := ex.Submit(e.ctx, courier.Task{Key: key, Body: []byte(strconv.Itoa(i)), Header: map[string]string{"i": strconv.Itoa(i)}})
		if err != nil {
			e.t.Fatalf("submit %d: %v", i, err)
		}
		ids[i] = id
	}
	return ids
}

// jobs gathers the jobs a worker received.
type jobs struct {
	mu   sync.Mutex // guards list
	list []*courier.Job
}

func (js *jobs) add(j *courier.Job) {
	js.mu.Lock()
	defer js.mu.Unlock()
	js.list = append(js.list, j)
}

func (js *jobs) all() []*courier.Job {
	js.mu.Lock()
	defer js.mu.Unlock()
	return slices.Clone(js.list)
}

func (js *jobs) len() int {
	js.mu.Lock()
	defer js.mu.Unlock()
	return len(js.list)
}

func (js *jobs) waitLen(t *testing.T, n int) []*courier.Job {
	t.Helper()
	testutil.WaitForf(t, wait, func() bool { return js.len() >= n }, "%d jobs received (have %d)", n, js.len())
	return js.all()
}

// hold is a JobFunc that keeps every job unsettled.
func (js *jobs) hold(j *courier.Job) error {
	js.add(j)
	j.Defer()
	return nil
}

// ack is a JobFunc that acks every job.
func (js *jobs) ack(j *courier.Job) error {
	js.add(j)
	return nil
}

func (e *env) work(name string, fn courier.JobFunc, opts ...courier.AttachOption) *courier.Attachment {
	e.t.Helper()
	a, err := e.openTasks(name).Work(e.ctx, fn, opts...)
	if err != nil {
		e.t.Fatalf("attach worker to %s: %v", name, err)
	}
	return a
}

// taskEvents gathers the events of a watched task.
type taskEvents struct {
	mu  sync.Mutex
	evs []courier.TaskEvent
}

func (te *taskEvents) fn(ev courier.TaskEvent) {
	te.mu.Lock()
	defer te.mu.Unlock()
	te.evs = append(te.evs, ev)
}

func (te *taskEvents) all() []courier.TaskEvent {
	te.mu.Lock()
	defer te.mu.Unlock()
	return slices.Clone(te.evs)
}

func (s *suite) testTasks(t *testing.T) {
	t.Run("SubmitAndWork", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks()
		ids := e.submit(ex, 50, "")
		if !slices.IsSorted(ids) || ids[0] == 0 {
			t.Fatalf("task ids %v: want increasing, from 1", ids)
		}
		var js jobs
		e.work(ex.Name(), js.ack)
		got := js.waitLen(t, 50)
		for i, j := range got[:50] {
			if j.ID != ids[i] || string(j.Body) != strconv.Itoa(i) || j.Header["i"] != strconv.Itoa(i) || j.Exchange != ex.Name() || j.Redelivered() {
				t.Fatalf("job %d: id %d body %q header %q exchange %q attempts %d; want id %d, body and header %d, no attempts", i, j.ID, j.Body, j.Header["i"], j.Exchange, j.Attempts, ids[i], i)
			}
		}
		testutil.WaitForf(t, wait, func() bool {
			info := exInfo(e, ex.Name())
			return info.Queue != nil && info.Queue.Messages == 0 && info.Queue.Acked == 50
		}, "queue drained and every task acked")
	})
	t.Run("Competing", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks()
		var a, b jobs
		e.work(ex.Name(), a.hold, courier.Prefetch(1))
		e.work(ex.Name(), b.hold, courier.Prefetch(1))
		e.submit(ex, 2, "")
		a.waitLen(t, 1)
		b.waitLen(t, 1)
	})
	t.Run("Prefetch", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks()
		var a, b jobs
		e.work(ex.Name(), a.hold, courier.Prefetch(3))
		e.submit(ex, 5, "")
		a.waitLen(t, 3)
		// The other two wait for credit: a second worker takes them.
		e.work(ex.Name(), b.hold, courier.Prefetch(10))
		b.waitLen(t, 2)
		if n := a.len(); n != 3 {
			t.Fatalf("first worker, prefetch 3, received %d", n)
		}
		// Settling one gives the first worker credit again.
		a.all()[0].Ack()
		e.submit(ex, 1, "")
		testutil.WaitForf(t, wait, func() bool { return a.len()+b.len() == 6 }, "sixth task delivered")
	})
	t.Run("Redelivery", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks(courier.Backoff(time.Millisecond, 10*time.Millisecond))
		var js jobs
		e.work(ex.Name(), func(j *courier.Job) error {
			js.add(j)
			if j.Attempts < 2 {
				return fmt.Errorf("attempt %d fails", j.Attempts)
			}
			return nil
		})
		e.submit(ex, 1, "")
		got := js.waitLen(t, 3)
		for i, j := range got {
			if j.Attempts != i || j.Redelivered() != (i > 0) {
				t.Fatalf("delivery %d: attempts %d redelivered %v", i, j.Attempts, j.Redelivered())
			}
		}
	})
	t.Run("WorkerGone", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks(courier.Backoff(time.Millisecond, time.Millisecond))
		var a, b jobs
		wc := e.conn()
		w, err := wc.Tasks(e.ctx, ex.Name())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Work(e.ctx, a.hold); err != nil {
			t.Fatal(err)
		}
		e.submit(ex, 1, "")
		a.waitLen(t, 1)
		e.work(ex.Name(), b.ack)
		wc.Close()
		got := b.waitLen(t, 1)
		if got[0].ID != a.all()[0].ID || got[0].Attempts != 1 || !got[0].Redelivered() {
			t.Fatalf("redelivered task %d attempts %d; want task %d, 1 attempt", got[0].ID, got[0].Attempts, a.all()[0].ID)
		}
	})
	t.Run("DeadLetter", func(t *testing.T) {
		e := s.env(t)
		dlx := e.tasks()
		ex := e.tasks(courier.MaxAttempts(2), courier.Backoff(time.Millisecond, time.Millisecond), courier.DeadLetter(dlx.Name()))
		var dead jobs
		e.work(dlx.Name(), dead.ack)
		e.work(ex.Name(), func(j *courier.Job) error {
			if string(j.Body) == "reject" {
				return courier.Reject(fmt.Errorf("bad task"))
			}
			return fmt.Errorf("always fails")
		})
		if _, err := ex.Submit(e.ctx, courier.Task{Key: "k", Body: []byte("retry")}); err != nil {
			t.Fatal(err)
		}
		if _, err := ex.Submit(e.ctx, courier.Task{Body: []byte("reject")}); err != nil {
			t.Fatal(err)
		}
		got := dead.waitLen(t, 2)
		reasons := map[string]string{}
		for _, j := range got {
			reasons[string(j.Body)] = j.Header["x-death-reason"]
			if j.Header["x-death-queue"] != ex.Name() {
				t.Fatalf("dead letter from queue %q, want %q", j.Header["x-death-queue"], ex.Name())
			}
		}
		if reasons["retry"] != "max attempts" || reasons["reject"] != "rejected" {
			t.Fatalf("dead-letter reasons %v", reasons)
		}
	})
	t.Run("TTL", func(t *testing.T) {
		e := s.env(t)
		dlx := e.pubsub()
		var c collector
		if _, err := e.openPubSub(dlx.Name()).Subscribe(e.ctx, "#", c.fn); err != nil {
			t.Fatal(err)
		}
		ex := e.tasks(courier.DeadLetter(dlx.Name()))
		if _, err := ex.Submit(e.ctx, courier.Task{Key: "expiring", TTL: 20 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		c.waitKey(t, "expiring")
		if r := c.all()[0].Header["x-death-reason"]; r != "ttl expired" {
			t.Fatalf("dead letter reason %q", r)
		}
	})
	t.Run("Priority", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks()
		for _, p := range []int{0, 9, 5} {
			if _, err := ex.Submit(e.ctx, courier.Task{Priority: p, Body: []byte(strconv.Itoa(p))}); err != nil {
				t.Fatal(err)
			}
		}
		var js jobs
		e.work(ex.Name(), js.ack, courier.Prefetch(1))
		got := js.waitLen(t, 3)
		if b := []string{string(got[0].Body), string(got[1].Body), string(got[2].Body)}; !slices.Equal(b, []string{"9", "5", "0"}) {
			t.Fatalf("priority order %q", b)
		}
		_, err := ex.Submit(e.ctx, courier.Task{Priority: 10})
		mustErr(t, err, courier.ErrBadOptions, "priority 10")
	})
	t.Run("Delayed", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks()
		due := time.Now().Add(1500 * time.Millisecond)
		if _, err := ex.Submit(e.ctx, courier.Task{Body: []byte("later"), DueAt: due}); err != nil {
			t.Fatal(err)
		}
		var at atomic.Int64
		var js jobs
		e.work(ex.Name(), func(j *courier.Job) error {
			at.CompareAndSwap(0, time.Now().UnixNano())
			return js.ack(j)
		})
		js.waitLen(t, 1)
		// Due times are kept in milliseconds on the wire.
		if got := time.Unix(0, at.Load()); got.Before(due.Truncate(time.Millisecond)) {
			t.Fatalf("delayed task delivered at %v, %v before it was due", got, due.Sub(got))
		}
	})
	t.Run("Keyed", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks()
		const keys, each = 4, 25
		var mu sync.Mutex
		seen := map[string][]string{}
		busy := map[string]bool{}
		var overlap atomic.Bool
		work := func(j *courier.Job) error {
			mu.Lock()
			if busy[j.Key] {
				overlap.Store(true)
			}
			busy[j.Key] = true
			seen[j.Key] = append(seen[j.Key], string(j.Body))
			mu.Unlock()
			time.Sleep(100 * time.Microsecond) // widen the window for an overlap
			mu.Lock()
			busy[j.Key] = false
			mu.Unlock()
			return nil
		}
		e.work(ex.Name(), work, courier.Prefetch(10))
		e.work(ex.Name(), work, courier.Prefetch(10))
		for i := range each {
			for k := range keys {
				if err := ex.SubmitAsync(e.ctx, courier.Task{Key: "key" + strconv.Itoa(k), Body: []byte(strconv.Itoa(i))}, func(courier.TaskID, error) {}); err != nil {
					t.Fatal(err)
				}
			}
		}
		testutil.WaitForf(t, wait, func() bool {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, v := range seen {
				n += len(v)
			}
			return n == keys*each
		}, "every keyed task handled")
		if overlap.Load() {
			t.Fatal("two tasks of one key were handled at once")
		}
		for k, v := range seen {
			for i, b := range v {
				if b != strconv.Itoa(i) {
					t.Fatalf("key %s handled out of order: %q", k, v)
				}
			}
		}
	})
	t.Run("SingleActive", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks(courier.SingleActive)
		var a, b jobs
		var evb events
		ac := e.conn()
		aw, err := ac.Tasks(e.ctx, ex.Name())
		if err != nil {
			t.Fatal(err)
		}
		first, err := aw.Work(e.ctx, a.ack)
		if err != nil {
			t.Fatal(err)
		}
		second := e.work(ex.Name(), b.ack, courier.OnEvent(evb.fn))
		e.submit(ex, 5, "")
		a.waitLen(t, 5)
		if b.len() != 0 || !first.IsLeader() || second.IsLeader() {
			t.Fatalf("second worker got %d tasks; leaders %v %v", b.len(), first.IsLeader(), second.IsLeader())
		}
		ac.Close()
		evb.waitFor(t, "second worker leads", func(ev courier.Event) bool { return ev.Kind == courier.EventLeader && ev.IsLeader })
		e.submit(ex, 1, "")
		b.waitLen(t, 1)
	})
	t.Run("Watch", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks()
		var js jobs
		e.work(ex.Name(), js.hold)
		var te taskEvents
		w, err := ex.SubmitWatch(e.ctx, courier.Task{Body: []byte("x")}, te.fn)
		if err != nil {
			t.Fatal(err)
		}
		j := js.waitLen(t, 1)[0]
		if j.ID != w.ID() {
			t.Fatalf("worker got task %d, watch is on %d", j.ID, w.ID())
		}
		var other taskEvents
		ow, err := e.openTasks(ex.Name()).Watch(e.ctx, j.ID, other.fn)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Progress(50, "half"); err != nil {
			t.Fatal(err)
		}
		if err := j.Ack(); err != nil {
			t.Fatal(err)
		}
		last, err := w.Wait(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ow.Wait(e.ctx); err != nil {
			t.Fatal(err)
		}
		for _, evs := range [][]courier.TaskEvent{te.all(), other.all()} {
			if len(evs) != 2 || evs[0].Kind != courier.TaskProgress || evs[0].Percent != 50 || evs[0].Text != "half" || evs[1].Kind != courier.TaskCompleted {
				t.Fatalf("events %+v: want progress 50 %q, then completed", evs, "half")
			}
		}
		if last.Kind != courier.TaskCompleted || last.ID != j.ID {
			t.Fatalf("last event %+v", last)
		}
		_, err = ex.Watch(e.ctx, j.ID, nil)
		mustErr(t, err, courier.ErrNotFound, "watch of a completed task")
	})
	t.Run("WatchFailure", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks(courier.MaxAttempts(2), courier.Backoff(time.Millisecond, time.Millisecond))
		e.work(ex.Name(), func(*courier.Job) error { return fmt.Errorf("no") })
		var te taskEvents
		w, err := ex.SubmitWatch(e.ctx, courier.Task{}, te.fn)
		if err != nil {
			t.Fatal(err)
		}
		last, err := w.Wait(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		evs := te.all()
		if last.Kind != courier.TaskFailed || last.Reason != "max attempts" || len(evs) != 2 || evs[0].Kind != courier.TaskRetry || evs[0].Attempts != 1 {
			t.Fatalf("events %+v", evs)
		}
	})
	t.Run("Async", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks()
		const n = 2000
		var mu sync.Mutex
		var ids []courier.TaskID
		var errs []error
		for i := range n {
			err := ex.SubmitAsync(e.ctx, courier.Task{Body: []byte(strconv.Itoa(i))}, func(id courier.TaskID, err error) {
				mu.Lock()
				defer mu.Unlock()
				ids = append(ids, id)
				if err != nil {
					errs = append(errs, err)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		testutil.WaitForf(t, wait, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(ids) == n
		}, "%d confirms", n)
		if len(errs) > 0 {
			t.Fatalf("%d submits failed, first: %v", len(errs), errs[0])
		}
		slices.Sort(ids)
		if ids = slices.Compact(ids); len(ids) != n {
			t.Fatalf("confirms carry %d distinct ids, want %d", len(ids), n)
		}
	})
	t.Run("DurableSubscription", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub()
		var c1 collector
		sc := e.conn()
		sps, err := sc.PubSub(e.ctx, ps.Name())
		if err != nil {
			t.Fatal(err)
		}
		sub, err := sps.Subscribe(e.ctx, "a.#", c1.fn, courier.Durable("audit"))
		if err != nil {
			t.Fatal(err)
		}
		if got := sub.Patterns(); !slices.Equal(got, []string{"a.#"}) {
			t.Fatalf("patterns %q", got)
		}
		ps.Publish(e.ctx, "a.1", nil)
		c1.waitKey(t, "a.1")
		sc.Close()
		for _, k := range []string{"a.2", "b.x", "a.3"} {
			if err := ps.PublishSync(e.ctx, courier.Message{Key: k}); err != nil {
				t.Fatal(err)
			}
		}
		var c2 collector
		if _, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "a.#", c2.fn, courier.Durable("audit")); err != nil {
			t.Fatal(err)
		}
		c2.waitKey(t, "a.2")
		c2.waitKey(t, "a.3")
		// The first subscriber may have been sent a.2 before its
		// connection closed: then it is delivered again, still in order.
		if got := c2.keys(""); !slices.Equal(got, []string{"a.2", "a.3"}) {
			t.Fatalf("backlog %q, want a.2 a.3", got)
		}
		qname := ps.Name() + "/audit"
		if err := e.c.DeleteQueue(e.ctx, qname); err != nil {
			t.Fatal(err)
		}
		mustErr(t, e.c.DeleteQueue(e.ctx, qname), courier.ErrNotFound, "delete it again")
	})
	t.Run("MaxLength", func(t *testing.T) {
		e := s.env(t)
		ex := e.tasks(courier.MaxLength(3))
		e.submit(ex, 3, "")
		_, err := ex.Submit(e.ctx, courier.Task{Body: []byte("one too many")})
		mustErr(t, err, courier.ErrQueueFull, "submit to a full queue")
		mustErr(t, err, courier.ErrLimit, "submit to a full queue")
		// Room comes back as tasks are acked.
		var js jobs
		e.work(ex.Name(), js.ack)
		js.waitLen(t, 3)
		testutil.WaitForf(t, wait, func() bool {
			q := exInfo(e, ex.Name()).Queue
			return q != nil && q.Messages == 0
		}, "queue drained")
		e.submit(ex, 3, "")
	})
	t.Run("DropHead", func(t *testing.T) {
		e := s.env(t)
		dlx := e.tasks()
		ex := e.tasks(courier.MaxLength(2), courier.DropHead(), courier.DeadLetter(dlx.Name()))
		e.submit(ex, 5, "")
		var dead, live jobs
		e.work(dlx.Name(), dead.ack)
		got := dead.waitLen(t, 3)
		for i, j := range got[:3] {
			if string(j.Body) != strconv.Itoa(i) || j.Header["x-death-reason"] != "max length" {
				t.Fatalf("dropped %d: body %q reason %q; want the oldest first, reason max length", i, j.Body, j.Header["x-death-reason"])
			}
		}
		e.work(ex.Name(), live.ack)
		kept := live.waitLen(t, 2)
		if string(kept[0].Body) != "3" || string(kept[1].Body) != "4" {
			t.Fatalf("kept %q and %q, want the newest two", kept[0].Body, kept[1].Body)
		}
	})
	t.Run("Errors", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub()
		rr := e.reqresp()
		ex := e.tasks()
		_, err := e.c.Tasks(e.ctx, ps.Name())
		mustErr(t, err, courier.ErrClash, "tasks over a pub-sub exchange")
		_, err = e.c.Tasks(e.ctx, ex.Name(), courier.MaxAttempts(3))
		mustErr(t, err, courier.ErrClash, "other max attempts")
		_, err = e.c.Tasks(e.ctx, e.name(), courier.Strategy("sticky"))
		mustErr(t, err, courier.ErrBadOptions, "a request-response strategy")
		_, err = e.c.PubSub(e.ctx, e.name(), courier.MaxAttempts(3))
		mustErr(t, err, courier.ErrBadOptions, "task options on pub-sub")
		_, err = e.c.Tasks(e.ctx, rr.Name())
		mustErr(t, err, courier.ErrClash, "tasks over a request-response exchange")
		_, err = e.openTasks(ex.Name()).Watch(e.ctx, 12345, nil)
		mustErr(t, err, courier.ErrNotFound, "watch of an unknown task")
		_, err = e.openPubSub(ps.Name()).Subscribe(e.ctx, "#", func(*courier.Delivery) {}, courier.Durable("bad name!"))
		mustErr(t, err, courier.ErrBadOptions, "bad durable name")
		if _, err := e.openTasks(ex.Name()).Work(e.ctx, func(*courier.Job) error { return nil }, courier.Prefetch(-1)); err == nil {
			t.Fatal("negative prefetch accepted")
		}
	})
}

// exInfo returns the broker's description of exchange name.
func exInfo(e *env, name string) courier.ExchangeInfo {
	e.t.Helper()
	list, err := e.c.Exchanges(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, x := range list {
		if x.Name == name {
			return x
		}
	}
	e.t.Fatalf("exchange %s not listed", name)
	return courier.ExchangeInfo{}
}
