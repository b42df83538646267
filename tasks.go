package courier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/wire"
)

// Task exchange strategies: how workers share tasks.
const (
	// Competing workers take tasks in turn, each up to its prefetch. It
	// is the default.
	Competing Strategy = wire.StrategyCompeting
	// SingleActive gives tasks to one worker at a time, the oldest; when
	// it goes away the next takes over. Workers see it as their leader.
	SingleActive Strategy = wire.StrategySingleActive
)

// Transient makes an exchange live in memory only: its definition (and a
// task exchange's queue, with its tasks) is lost when the node stops, and
// a task exchange's submits are confirmed at once. By default every
// exchange is durable: a node with a data directory stores its definition
// and declares it again at start. An exchange routed by a Go function
// ([WithKeyFunc], [WithRouteFunc]) is always transient.
func Transient() ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.Transient = true })
}

// MaxAttempts sets how many times a task may fail (nacked with requeue,
// or its worker went away) before it is dead-lettered. 0 keeps the
// default (20); -1 means no limit.
func MaxAttempts(n int) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.MaxAttempts = n })
}

// QueueTTL bounds how long a task may wait in the queue once due; one
// still waiting then is dead-lettered as expired.
func QueueTTL(d time.Duration) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.TTLMS = d.Milliseconds() })
}

// Backoff sets the wait before a failed task is delivered again: base the
// first time, doubling with each attempt up to max.
func Backoff(base, max time.Duration) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) {
		e.BackoffMS, e.BackoffMaxMS = base.Milliseconds(), max.Milliseconds()
	})
}

// DeadLetter names the exchange that receives the tasks that fail for
// good, with the headers x-death-queue, x-death-reason and
// x-death-attempts: a task exchange (they are submitted to it) or a
// pub-sub exchange (they are published under their key).
func DeadLetter(exchange string) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.DeadLetter = exchange })
}

// DedupWindow sets how long a task queue remembers the (producer, seq)
// of a confirmed submit, so that a resend within it is stored once and
// confirmed with the first task's id (docs/queues.md, "Deduplication").
// 0 keeps the default (2 minutes); a negative d turns deduplication off.
// It is kept to the millisecond.
func DedupWindow(d time.Duration) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) {
		switch {
		case d < 0:
			e.DedupWindowMS = -1
		case d > 0:
			e.DedupWindowMS = max(d.Milliseconds(), 1)
		}
	})
}

// Replicas sets how many nodes of a cluster hold a task exchange's
// queue, as one Raft group: a submit is confirmed once a majority of
// them has the task on disk, and the queue goes on while a majority is
// up (docs/queues.md, "Replicated queues"). 0 keeps the default: 3 in a
// cluster of three or more live nodes, else every live node. 1 keeps
// the queue on one node. A node alone accepts only 0 and 1.
func Replicas(n int) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.Replicas = n })
}

// MaxLength bounds a task queue to n tasks (ready, delayed and unacked);
// a submit to a full queue fails with [ErrQueueFull] unless the queue
// drops its head ([DropHead]).
func MaxLength(n int64) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.MaxLength = n })
}

// MaxBytes bounds the body bytes of the tasks a queue holds, as
// [MaxLength] bounds their number.
func MaxBytes(n int64) ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.MaxBytes = n })
}

// DropHead makes a full queue ([MaxLength], [MaxBytes]) dead-letter its
// oldest ready task of the lowest priority to take a new one, instead of
// refusing the new one.
func DropHead() ExchangeOption {
	return exchangeOptionFunc(func(e *ExchangeSpec) { e.Overflow = wire.OverflowDropHead })
}

// ErrQueueFull is the error of a submit to a full task queue. It also
// matches [ErrLimit].
var ErrQueueFull = &wire.Error{Code: wire.CodeQueueFull}

// Tasks declares a task exchange, durable unless [Transient], or opens
// the existing one.
func (c *Conn) Tasks(ctx context.Context, name string, opts ...ExchangeOption) (*Tasks, error) {
	info, err := c.declare(ctx, name, specOf(wire.PatternTasks, opts))
	if err != nil {
		return nil, err
	}
	return &Tasks{c: c, name: name, info: info}, nil
}

// Tasks is a task exchange as seen through one Conn: producers submit
// tasks to its queue, and workers take them.
type Tasks struct {
	c    *Conn
	name string
	info ExchangeInfo
}

// Name returns the exchange's name.
func (t *Tasks) Name() string { return t.name }

// Info returns the exchange's description as it was declared.
func (t *Tasks) Info() ExchangeInfo { return t.info }

// TaskID identifies a task in its exchange's queue; ids grow with each
// submit and are never reused.
type TaskID = uint64

// Task is what a producer submits.
type Task struct {
	// Key, if set, makes this a keyed task: tasks with the same key are
	// handled one at a time, in order, by the worker the key hashes to.
	Key    string
	Header map[string]string
	// Body is the payload. The broker does not copy it in-process: do
	// not modify it after submitting.
	Body []byte
	// Priority, from 0 (the default) to 9: higher goes first.
	Priority int
	// DueAt, if set and in the future, delays the task until then.
	DueAt time.Time
	// TTL, if set, bounds how long the task may wait once due.
	TTL time.Duration
	// Seq, if not 0, is the task's sequence number for deduplication,
	// from 1 to 2^63-1, instead of the one the Conn gives it: a process
	// that restarts with a fixed producer id (client.Options.ProducerID)
	// and resends what its previous run may have submitted gives each
	// task the same Seq as before, so that a queue stores it once. Use
	// it for all of a producer's submits or for none. It applies to
	// confirmed submits (Submit, SubmitAsync, SubmitWatch) over a Conn
	// with a producer id; otherwise it is ignored.
	Seq uint64
}

func (t *Tasks) submitFrame(task *Task, flags wire.Flags) (*wire.Frame, error) {
	if task.Priority < 0 || task.Priority > 9 {
		return nil, fmt.Errorf("%w: priority %d not in 0..9", ErrBadOptions, task.Priority)
	}
	if task.Seq > math.MaxInt64 {
		return nil, fmt.Errorf("%w: seq %d above 2^63-1", ErrBadOptions, task.Seq)
	}
	dedup := flags&wire.FlagReply != 0 && t.c.producer != ""
	f := wire.NewFrame(wire.TypeSubmit)
	f.Name, f.Key, f.Header, f.Body, f.Aux, f.Flags = t.name, task.Key, task.Header, task.Body, uint64(task.Priority), flags
	if !task.DueAt.IsZero() || task.TTL > 0 || dedup {
		o := wire.TaskOptions{TTLMS: task.TTL.Milliseconds()}
		if !task.DueAt.IsZero() {
			o.DueMS = max(task.DueAt.UnixMilli(), 1)
		}
		if dedup {
			// The frame keeps the pair: a resend after a reconnect is
			// this very frame again.
			o.Producer, o.Seq = t.c.producer, task.Seq
			if o.Seq == 0 {
				o.Seq = t.c.pseq.Add(1)
			}
		}
		f.Tag = o.Tag()
	}
	return f, nil
}

// Submit submits a task and waits for the broker's confirm: once it
// returns without error, the task is durable (it survives a crash of the
// broker) unless the exchange is transient.
func (t *Tasks) Submit(ctx context.Context, task Task) (TaskID, error) {
	f, err := t.submitFrame(&task, wire.FlagReply)
	if err != nil {
		return 0, err
	}
	cl, err := t.c.call(ctx, f)
	if err != nil {
		return 0, err
	}
	r, err := t.c.next(ctx, cl)
	if err != nil {
		if t.c.unregister(cl) {
			cl.release()
		}
		return 0, err
	}
	defer cl.release()
	defer r.Release()
	if r.Type == wire.TypeError {
		return 0, &wire.Error{Code: wire.Code(r.Aux), Msg: r.Tag}
	}
	return r.Aux, nil
}

// SubmitAsync submits a task without waiting: done is called with its id
// once the broker confirms it, or with the error that failed it, from a
// goroutine of the Conn's, and must not block. SubmitAsync itself waits
// only for flow control. Pipelining submits this way is much faster than
// calling Submit in turn.
func (t *Tasks) SubmitAsync(ctx context.Context, task Task, done func(TaskID, error)) error {
	f, err := t.submitFrame(&task, wire.FlagReply)
	if err != nil {
		return err
	}
	cl := &call{ref: newRef()}
	cl.fn = func(r *wire.Frame) {
		switch {
		case r == nil:
			done(0, t.c.failure(cl))
		case r.Type == wire.TypeError:
			done(0, &wire.Error{Code: wire.Code(r.Aux), Msg: r.Tag})
			r.Release()
		default:
			done(r.Aux, nil)
			r.Release()
		}
	}
	f.Ref = cl.ref
	if err := t.c.register(cl, f); err != nil {
		f.Release()
		return err
	}
	if err := t.c.sendCtx(ctx, f); err != nil {
		t.c.unregister(cl)
		return err
	}
	return nil
}

// Publish submits a task without any confirm, the fastest way and the
// least safe: a task lost on the way (the broker crashed) is not
// reported. Errors that come later go to the function set with
// [Conn.OnError].
func (t *Tasks) Publish(ctx context.Context, task Task) error {
	f, err := t.submitFrame(&task, 0)
	if err != nil {
		return err
	}
	return t.c.sendCtx(ctx, f)
}

// TaskEventKind says what happened to a watched task.
type TaskEventKind int

// Task event kinds.
const (
	// TaskProgress: the worker reported Percent and Text.
	TaskProgress TaskEventKind = wire.TaskProgress
	// TaskRetry: the task failed (Attempts so far) and will be delivered
	// again at Due.
	TaskRetry TaskEventKind = wire.TaskRetry
	// TaskCompleted: a worker acked it. The last event.
	TaskCompleted TaskEventKind = wire.TaskCompleted
	// TaskFailed: it was dead-lettered for Reason. The last event.
	TaskFailed TaskEventKind = wire.TaskFailed
	// TaskLost: the watch ended without the task's outcome, for Reason:
	// the queue was deleted, or the node serving a replicated queue
	// changed (its leader moved, or the link to it was lost). The task
	// itself is not affected; watch it again to follow it. The last
	// event.
	TaskLost TaskEventKind = wire.TaskLost
)

func (k TaskEventKind) String() string {
	switch k {
	case TaskProgress:
		return "progress"
	case TaskRetry:
		return "retry"
	case TaskCompleted:
		return "completed"
	case TaskFailed:
		return "failed"
	case TaskLost:
		return "lost"
	}
	return fmt.Sprintf("task-event(%d)", int(k))
}

// TaskEvent is an event of a watched task.
type TaskEvent struct {
	Kind     TaskEventKind
	ID       TaskID
	Percent  int
	Text     string
	Attempts int
	Due      time.Time
	Reason   string
	// Worker is the member id of the worker that reported progress or
	// completed the task.
	Worker string
}

// Last reports whether no event follows this one.
func (e TaskEvent) Last() bool {
	return e.Kind == TaskCompleted || e.Kind == TaskFailed || e.Kind == TaskLost
}

// TaskWatch is a watch on one task's events; see [Tasks.SubmitWatch] and
// [Tasks.Watch].
type TaskWatch struct {
	c      *Conn
	cl     *call
	stop   context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	last   TaskEvent
	endErr error
}

// ID returns the task's id.
func (w *TaskWatch) ID() TaskID { return w.last.ID }

// Done is closed after the last event was handled, or when the watch
// ended for another reason (Stop, the Conn closed).
func (w *TaskWatch) Done() <-chan struct{} { return w.done }

// Wait waits for the task's last event and returns it: TaskCompleted,
// TaskFailed, or TaskLost (the watch ended without the outcome: watch
// the task again). It returns an error if the watch ended first or ctx
// ended.
func (w *TaskWatch) Wait(ctx context.Context) (TaskEvent, error) {
	select {
	case <-w.done:
	case <-ctx.Done():
		return TaskEvent{}, ctx.Err()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.endErr != nil {
		return w.last, w.endErr
	}
	return w.last, nil
}

// Stop ends the watch; fn is not called afterwards.
func (w *TaskWatch) Stop() {
	w.stop()
	<-w.done
}

// SubmitWatch submits a task, waits for its confirm like [Tasks.Submit],
// and then calls fn, if not nil, with each of the task's events, in
// order, from a goroutine of its own, through to its completion or
// failure. The returned watch tells when that happened.
func (t *Tasks) SubmitWatch(ctx context.Context, task Task, fn func(TaskEvent)) (*TaskWatch, error) {
	f, err := t.submitFrame(&task, wire.FlagReply|wire.FlagWatch)
	if err != nil {
		return nil, err
	}
	return t.c.startWatch(ctx, f, fn)
}

// Watch calls fn with the events of task id, submitted by anyone, from now
// through to its completion or failure, as [Tasks.SubmitWatch] does. It
// fails with [ErrNotFound] when the queue no longer holds the task.
func (t *Tasks) Watch(ctx context.Context, id TaskID, fn func(TaskEvent)) (*TaskWatch, error) {
	f := wire.NewFrame(wire.TypeWatch)
	f.Name, f.Aux = t.name, id
	return t.c.startWatch(ctx, f, fn)
}

// startWatch sends a SUBMIT or WATCH that asks for events, waits for its
// OK, and hands the events to fn from a goroutine.
func (c *Conn) startWatch(ctx context.Context, f *wire.Frame, fn func(TaskEvent)) (*TaskWatch, error) {
	cl, err := c.call(ctx, f)
	if err != nil {
		return nil, err
	}
	r, err := c.next(ctx, cl)
	if err != nil {
		c.abandonWatch(cl)
		return nil, err
	}
	if r.Type == wire.TypeError {
		err := &wire.Error{Code: wire.Code(r.Aux), Msg: r.Tag}
		r.Release()
		c.unregister(cl)
		cl.release()
		return nil, err
	}
	wctx, stop := context.WithCancel(context.Background())
	w := &TaskWatch{c: c, cl: cl, stop: stop, done: make(chan struct{})}
	w.last.ID = r.Aux
	r.Release()
	go w.run(wctx, fn)
	return w, nil
}

// abandonWatch gives up on a watch: the broker is told to stop it.
func (c *Conn) abandonWatch(cl *call) {
	if c.unregister(cl) {
		f := wire.NewFrame(wire.TypeCancel)
		f.Ref = cl.ref
		c.send(f)
		cl.release()
	}
}

func (w *TaskWatch) run(ctx context.Context, fn func(TaskEvent)) {
	defer close(w.done)
	for {
		f, err := w.c.next(ctx, w.cl)
		if err != nil {
			w.c.abandonWatch(w.cl)
			w.mu.Lock()
			w.endErr = fmt.Errorf("courier: watch of task %d ended: %w", w.last.ID, err)
			w.mu.Unlock()
			return
		}
		ev := TaskEvent{Kind: TaskEventKind(f.Aux)}
		var body wire.TaskEventBody
		if err := json.Unmarshal(f.Body, &body); err != nil {
			w.c.report(fmt.Errorf("courier: bad task event: %w", err))
		}
		last := f.Flags&wire.FlagLast != 0 // a kind this client does not know may end it
		f.Release()
		ev.ID, ev.Percent, ev.Text, ev.Attempts = body.ID, body.Percent, body.Text, int(body.Attempts)
		ev.Reason, ev.Worker = body.Reason, body.Worker
		if body.DueMS != 0 {
			ev.Due = time.UnixMilli(body.DueMS)
		}
		w.mu.Lock()
		w.last = ev
		w.mu.Unlock()
		if fn != nil {
			fn(ev)
		}
		if last || ev.Last() {
			w.cl.release() // the call left the table with its last frame
			return
		}
	}
}

// Prefetch sets a worker's credit: how many tasks it may hold unsettled
// at a time (default 100). A durable subscriber has one too.
func Prefetch(n int) AttachOption { return func(c *attachCfg) { c.spec.Prefetch = n } }

// Durable makes a subscription durable under name: a queue bound to the
// subscription's patterns keeps receiving while no subscriber is
// attached, and delivers its backlog when one attaches with the same
// name. Each message is acknowledged once the MessageFunc returns; one
// whose function panics is delivered again. Delete the subscription with
// [Conn.DeleteQueue] and "<exchange>/<name>".
func Durable(name string) AttachOption { return func(c *attachCfg) { c.spec.Durable = name } }

// DeleteQueue deletes a queue and the messages in it: a durable
// subscription's ("<exchange>/<name>"), or a task exchange's, which
// deletes the exchange.
func (c *Conn) DeleteQueue(ctx context.Context, name string) error {
	f := wire.NewFrame(wire.TypeDelete)
	f.Name, f.Aux = name, 1
	err := c.roundTrip(ctx, f, nil)
	if err == nil {
		c.forget(name) // a task exchange goes with its queue
	}
	return err
}

// JobFunc handles one task. Returning nil acks the task; returning an
// error nacks it, to be delivered again after a backoff (or, wrapped
// with [Reject], dead-lettered at once). A job settled inside fn with
// [Job.Ack] or [Job.Nack], or deferred with [Job.Defer], is left as it
// is.
type JobFunc func(j *Job) error

// Work attaches fn as a worker: it is called with each task, one at a
// time, from a goroutine of the attachment's, and the worker holds at
// most its [Prefetch] tasks unsettled.
func (t *Tasks) Work(ctx context.Context, fn JobFunc, opts ...AttachOption) (*Attachment, error) {
	return t.c.attach(ctx, t.name, wire.RoleWorker, attachConfig(opts), nil, nil, nil, fn)
}

// errReject is matched by the errors made with [Reject].
var errReject = errors.New("courier: task rejected")

// Reject wraps err so that a [JobFunc] returning it dead-letters the task
// at once instead of retrying it.
func Reject(err error) error { return &rejectError{err} }

type rejectError struct{ err error }

func (e *rejectError) Error() string        { return "rejected: " + e.err.Error() }
func (e *rejectError) Unwrap() []error      { return []error{e.err, errReject} }
func (e *rejectError) Is(target error) bool { return target == errReject }

// Job is a task delivered to a worker.
type Job struct {
	ID       TaskID
	Exchange string
	Key      string
	Header   map[string]string
	// Body may be kept after the job is settled.
	Body []byte
	// Attempts counts the failed attempts before this delivery; a job
	// with Attempts > 0 is a redelivery.
	Attempts int

	a       *Attachment
	sess    uint32 // the connection it came on (see Conn.Interrupted)
	settled atomic.Bool
	later   bool
}

// Redelivered reports whether the task failed before.
func (j *Job) Redelivered() bool { return j.Attempts > 0 }

// Defer leaves the job unsettled when the JobFunc returns: settle it later
// with Ack or Nack, from any goroutine. Until then it counts against the
// worker's prefetch.
func (j *Job) Defer() { j.later = true }

// Ack settles the job as done: it leaves the queue, and its watchers get
// TaskCompleted.
func (j *Job) Ack() error { return j.settle(wire.TypeAck, 0, "") }

// Nack settles the job as failed: with requeue it is delivered again
// after a backoff (until its attempts run out), without it goes to the
// dead-letter exchange.
func (j *Job) Nack(requeue bool) error {
	var aux uint64
	if requeue {
		aux = 1
	}
	return j.settle(wire.TypeNack, aux, "")
}

// Progress tells the task's watchers how far the job got: percent from 0
// to 100, and a short text.
func (j *Job) Progress(percent int, text string) error {
	if j.settled.Load() {
		return fmt.Errorf("courier: progress of task %d: already settled", j.ID)
	}
	if j.sess != j.a.c.sess.Load() {
		return fmt.Errorf("courier: progress of task %d: %w", j.ID, ErrConnectionLost)
	}
	f := wire.NewFrame(wire.TypeProgress)
	f.Attach, f.Ref, f.Aux, f.Tag = j.a.id, j.ID, uint64(min(max(percent, 0), 100)), text
	return j.a.c.send(f)
}

func (j *Job) settle(t wire.Type, aux uint64, reason string) error {
	if j.settled.Swap(true) {
		return fmt.Errorf("courier: task %d already settled", j.ID)
	}
	if j.sess != j.a.c.sess.Load() {
		// The broker returned the task to its queue when the connection
		// was lost; it delivers it again.
		return fmt.Errorf("courier: settling task %d: %w", j.ID, ErrConnectionLost)
	}
	f := wire.NewFrame(t)
	f.Attach, f.Ref, f.Aux, f.Tag = j.a.id, j.ID, aux, reason
	return j.a.c.send(f)
}

// work handles a TASK: a job for a worker, or a message of a durable
// subscription, acked once its function returns.
func (a *Attachment) work(f *wire.Frame, d *Delivery) {
	if a.job == nil {
		d.Key, d.Header, d.Body = f.Key, f.Header, f.Body
		d.Exchange, d.ConnTag = a.exchange, a.cfg.spec.ConnTag
		j := &Job{ID: f.Ref, a: a, sess: a.c.sess.Load()}
		f.Release()
		if a.deliver(d) {
			j.Ack()
		} else {
			j.Nack(true)
		}
		return
	}
	j := &Job{ID: f.Ref, Exchange: a.exchange, Key: f.Key, Header: f.Header, Body: f.Body, Attempts: int(f.Aux), a: a, sess: a.c.sess.Load()}
	f.Release()
	err := a.runJob(j)
	if j.later || j.settled.Load() {
		return
	}
	switch {
	case err == nil:
		j.Ack()
	case errors.Is(err, errReject):
		j.Nack(false)
	default:
		j.Nack(true)
	}
}

// runJob calls the worker's function; a panic fails the job.
func (a *Attachment) runJob(j *Job) (err error) {
	defer func() {
		if p := recover(); p != nil {
			a.c.log.Error("courier: worker panicked", "attachment", a.ID(), "task", j.ID, "panic", p)
			err = fmt.Errorf("courier: worker panicked: %v", p)
		}
	}()
	return a.job(j)
}
