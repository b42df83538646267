package broker

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/wire"
)

// Task queues. A task exchange owns one queue, of its own name; a durable
// subscription on a pub-sub exchange owns a queue named
// "<exchange>/<subscription>", fed by a binding: a subscriber of the
// exchange that lives in the broker and enqueues what it receives. Workers
// and durable subscribers are the queue's consumers; they receive TASK
// frames and settle them with ACK or NACK.

// Task exchange strategies.
const (
	Competing    = wire.StrategyCompeting
	SingleActive = wire.StrategySingleActive
)

// defaultPrefetch is a consumer's credit when it asks for none.
const defaultPrefetch = 100

// queueDef is what the broker persists of a durable queue, or of a
// durable request-response or pub-sub exchange (ExchangeOnly), which has
// no queue.
type queueDef struct {
	ID   uint32 `json:"id"`
	Name string `json:"name"`
	// Exchange and Config are the task exchange's, or the pub-sub exchange
	// of a durable subscription, which is declared again at restart.
	Exchange string              `json:"exchange"`
	Config   wire.ExchangeConfig `json:"config"`
	// Sub and Patterns describe a durable subscription.
	Sub      string   `json:"sub,omitempty"`
	Patterns []string `json:"patterns,omitempty"`
	// Headers are a durable subscription's header filters (headers.go).
	Headers []HeaderFilter `json:"headers,omitempty"`
	// DeclaredBy is the user who declared a task exchange, whose write
	// permission on its dead_letter exchange is checked at each dead
	// letter; Trusted marks a declarer that nothing checks (an embedded
	// connection, the node's own code). A definition stored before
	// declarers were kept has neither, and is checked as the anonymous
	// user: everything is allowed while the node has no users, nothing
	// once it has (see owner.mayWrite).
	DeclaredBy string `json:"declared_by,omitempty"`
	Trusted    bool   `json:"trusted,omitempty"`
	// ExchangeOnly marks the definition of a request-response or pub-sub
	// exchange: Name and Exchange are its name, Config its configuration,
	// and there is no queue. A store written before exchanges were
	// durable has none.
	ExchangeOnly bool `json:"exchange_only,omitempty"`
}

// taskQueue is a queue the broker holds.
type taskQueue struct {
	b       *Broker
	q       *queue.Queue
	ex      *Exchange // the task exchange, or the subscription's pub-sub exchange
	durable bool
	// replicated: the queue's journal is its Raft group's, not the
	// broker's store (replicated.go); it is in no checkpoint of the store.
	replicated bool

	// attachMu orders consumers joining and leaving with the exchange's
	// group, so that the oldest member, the leader, is the oldest consumer,
	// the one that receives in single-active mode.
	attachMu sync.Mutex

	consumers map[*Attachment]struct{} // guarded by attachMu

	defMu   sync.Mutex // guards def, defVer, binding
	def     queueDef
	defVer  uint64      // bumped whenever def changes
	binding *Attachment // durable subscription: its subscriber in ex
	// filters are def.Headers, read by the publications (nil: none).
	filters atomic.Pointer[[]HeaderFilter]

	// cp is the queue's part of the last checkpoint; owned by the
	// checkpoint (durability.cpMu).
	cp cpEntry

	// owner is the task exchange's declarer, as its dead letters are
	// checked (see deadletter.go).
	owner atomic.Pointer[owner]
	// dlDropped counts the dead letters dropped because the dead_letter
	// exchange was missing or the declarer may not write to it;
	// dlWarned is when that was last logged, in Unix ns.
	dlDropped atomic.Uint64
	dlWarned  atomic.Int64
}

// Name returns the queue's name.
func (tq *taskQueue) Name() string { return tq.q.Name() }

func queueConfig(cfg wire.ExchangeConfig) (queue.Config, error) {
	qc := queue.DefaultConfig()
	switch {
	case cfg.MaxAttempts < 0:
		qc.MaxAttempts = 0
	case cfg.MaxAttempts > 0:
		qc.MaxAttempts = cfg.MaxAttempts
	}
	if cfg.TTLMS < 0 || cfg.BackoffMS < 0 || cfg.BackoffMaxMS < 0 {
		return qc, errors.New("ttl_ms, backoff_ms and backoff_max_ms must not be negative")
	}
	qc.TTL = msDuration(cfg.TTLMS)
	if cfg.BackoffMS > 0 {
		qc.BackoffBase = msDuration(cfg.BackoffMS)
		if qc.BackoffMax < qc.BackoffBase {
			qc.BackoffMax = qc.BackoffBase
		}
	}
	if cfg.BackoffMaxMS > 0 {
		qc.BackoffMax = msDuration(cfg.BackoffMaxMS)
	}
	qc.SingleActive = cfg.Strategy == SingleActive
	switch {
	case cfg.DedupWindowMS < 0:
		qc.DedupWindow = -1
	case cfg.DedupWindowMS > 0:
		qc.DedupWindow = msDuration(cfg.DedupWindowMS)
	}
	return qc, qc.Validate()
}

// msDuration converts a duration in ms from the wire, capped at
// wire.MaxDurationMS: a declaration is refused past it (see
// wire.ExchangeConfig.Check), and a definition stored before that check
// existed is capped rather than overflowing.
func msDuration(ms int64) time.Duration {
	return time.Duration(min(ms, wire.MaxDurationMS)) * time.Millisecond
}

// checkTaskConfig validates a task exchange's configuration.
func checkTaskConfig(name string, cfg *wire.ExchangeConfig, spec Spec) error {
	switch cfg.Strategy {
	case "":
		cfg.Strategy = Competing
	case Competing, SingleActive:
	default:
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: unknown task strategy %q (%s or %s)", name, cfg.Strategy, Competing, SingleActive)
	}
	if cfg.KeyExpr != "" || cfg.RouteExpr != "" || spec.KeyFunc != nil || spec.RouteFunc != nil || cfg.Controlled {
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: task exchanges take no routing functions and no controller", name)
	}
	if cfg.DeadLetter == name {
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: dead_letter names the exchange itself", name)
	}
	if cfg.DeadLetter != "" && !ValidName(cfg.DeadLetter) {
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: invalid dead_letter %q", name, cfg.DeadLetter)
	}
	if _, err := queueConfig(*cfg); err != nil {
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: %v", name, err)
	}
	if cfg.MaxLength < 0 || cfg.MaxBytes < 0 {
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: max_length and max_bytes must not be negative", name)
	}
	switch cfg.Overflow {
	case "", wire.OverflowReject, wire.OverflowDropHead:
	default:
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: unknown overflow %q (%s or %s)", name, cfg.Overflow, wire.OverflowReject, wire.OverflowDropHead)
	}
	return nil
}

// bounded reports whether the queue has a max_length or max_bytes.
func (tq *taskQueue) bounded() bool {
	c := &tq.ex.cfg
	return c.MaxLength > 0 || c.MaxBytes > 0
}

// full reports whether a task queue bounded by max_length or max_bytes
// cannot take a task of size bytes; with overflow drop-head it first
// drops ready tasks from its head to make room. Concurrent submits may
// pass the bound by as many tasks as there are submitters.
func (tq *taskQueue) full(size int) bool {
	c := &tq.ex.cfg
	if c.MaxLength <= 0 && c.MaxBytes <= 0 {
		return false
	}
	for {
		st := tq.q.Stats()
		over := c.MaxLength > 0 && st.Messages() >= c.MaxLength || c.MaxBytes > 0 && st.Bytes+int64(size) > c.MaxBytes
		if !over {
			return false
		}
		if c.Overflow != wire.OverflowDropHead {
			return true
		}
		if dropped, _ := tq.q.DropHead(); !dropped {
			return true // nothing it may drop: refuse instead
		}
	}
}

// newTaskQueue makes the queue of a task exchange or a durable
// subscription, journaled when durable and the broker has a store. rb,
// if not nil, rebuilds it from the store's records.
func (b *Broker) newTaskQueue(ex *Exchange, def queueDef, by Declarer, rb *queue.Rebuilder) (*taskQueue, error) {
	return b.newQueueOn(ex, def, by, rb, nil)
}

// newQueueOn is newTaskQueue; j, if not nil, is the queue's journal (a
// replicated queue's, replicated.go) instead of the broker's store.
func (b *Broker) newQueueOn(ex *Exchange, def queueDef, by Declarer, rb *queue.Rebuilder, j queue.Journal) (*taskQueue, error) {
	qc, err := queueConfig(def.Config)
	if err != nil {
		return nil, wire.Errorf(wire.CodeBadOptions, "queue %q: %v", def.Name, err)
	}
	if def.Sub != "" {
		// A subscriber that went away with messages in flight gets them
		// back at once, ahead of the rest: a subscription keeps order.
		qc, _ = queueConfig(wire.ExchangeConfig{})
		qc.BackoffBase, qc.MaxAttempts = 0, 0
	}
	tq := &taskQueue{b: b, ex: ex, def: def}
	tq.setFilters(def.Headers)
	tq.owner.Store(b.ownerOf(def, by))
	qc.Scheduler = b.sched
	qc.Logger = b.log
	qc.DeadLetter = tq.deadLetter
	qc.Memory = b.cfg.Memory
	durable := !def.Config.Transient || def.Sub != ""
	switch {
	case j != nil:
		tq.durable, tq.replicated = true, true
		qc.Journal = j
		// Its bodies stay in memory: the replicated journal is no
		// Reader yet, so nothing is paged out (docs/replication.md).
		qc.Memory = nil
	case durable && b.dur != nil:
		tq.durable = true
		qc.Journal = queue.StoreJournal{Log: b.dur.log, QueueID: def.ID}
	}
	if rb != nil {
		tq.q, err = rb.Build(def.Name, qc)
	} else {
		tq.q, err = queue.New(def.Name, qc)
	}
	if err != nil {
		return nil, wire.Errorf(wire.CodeInternal, "queue %q: %v", def.Name, err)
	}
	return tq, nil
}

// recoveredQueue is a durable queue being brought back at restart.
type recoveredQueue struct {
	def queueDef
	rb  *queue.Rebuilder
	// journal, if not nil, is a replicated queue's: the queue is served
	// here as its group's leader, rebuilt from its replica (replicated.go).
	journal queue.Journal
}

// declareTasks creates a task exchange and its queue; the caller checked
// that no exchange had the name.
func (b *Broker) declareTasks(ex *Exchange, spec Spec, by Declarer, rq *recoveredQueue) (*Exchange, error) {
	b.qmu.Lock()
	if old := b.Exchange(ex.name); old != nil {
		b.qmu.Unlock()
		return old, old.matches(spec)
	}
	def := queueDef{Name: ex.name, Exchange: ex.name, Config: ex.cfg, DeclaredBy: by.User, Trusted: by.Policy == nil}
	var rb *queue.Rebuilder
	if rq != nil {
		def, rb = rq.def, rq.rb
	} else if b.dur != nil && !ex.cfg.Transient {
		def.ID = b.dur.newID()
	}
	var j queue.Journal
	if rq != nil {
		j = rq.journal
	}
	tq, err := b.newQueueOn(ex, def, by, rb, j)
	if err != nil {
		b.qmu.Unlock()
		return nil, err
	}
	ex.tq = tq
	stored := false
	store := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if _, loaded := b.exchanges.LoadOrStore(ex.name, ex); loaded {
			return
		}
		b.exVersion.Add(1)
		b.putQueue(def.Name, tq)
		stored = true
	}
	wait := func() error { return nil }
	if rq != nil {
		store()
	} else {
		wait = b.defineQueue(def, store)
	}
	b.qmu.Unlock()
	err = wait()
	if !stored {
		tq.q.Close()
		if old := b.Exchange(ex.name); old != nil && err == nil {
			return old, old.matches(spec)
		}
		return nil, err
	}
	if err != nil {
		return ex, err
	}
	if rq == nil {
		b.log.Info("exchange declared", "exchange", ex.name, "pattern", ex.cfg.Pattern, "strategy", ex.cfg.Strategy, "durable", tq.durable)
	}
	return ex, nil
}

// Queue returns the queue name, a task exchange's or a durable
// subscription's ("<exchange>/<subscription>"), or nil.
func (b *Broker) Queue(name string) *queue.Queue {
	if v, ok := b.queues.Load(name); ok {
		return v.(*taskQueue).q
	}
	return nil
}

// putQueue adds a queue to the set; removeQueue takes one out. The
// version moves on after the change, so that a reader that reads it
// before a walk and finds it unchanged later knows its walk saw the
// whole set.
func (b *Broker) putQueue(name string, tq *taskQueue) {
	if tq.def.Sub != "" {
		b.durableSubs.Add(1)
	}
	b.queues.Store(name, tq)
	b.qVersion.Add(1)
}

func (b *Broker) removeQueue(name string) {
	if v, ok := b.queues.LoadAndDelete(name); ok && v.(*taskQueue).def.Sub != "" {
		b.durableSubs.Add(-1)
	}
	b.qVersion.Add(1)
}

// QueueVersion returns a number that changes whenever a queue is created
// or deleted: a walk of [Broker.RangeQueues] that starts after reading
// version v saw every queue while QueueVersion still returns v.
func (b *Broker) QueueVersion() uint64 { return b.qVersion.Load() }

// RangeQueues calls fn with every queue until it returns false.
func (b *Broker) RangeQueues(fn func(q *queue.Queue, durable bool) bool) {
	b.queues.Range(func(_, v any) bool {
		tq := v.(*taskQueue)
		return fn(tq.q, tq.durable)
	})
}

// QueueInfo describes a queue from its live counters.
func (tq *taskQueue) info() *wire.QueueInfo {
	st := tq.q.Stats()
	return &wire.QueueInfo{
		Name: tq.q.Name(), Durable: tq.durable,
		Messages: st.Messages(), Ready: st.Ready, Unacked: st.Unacked, Delayed: st.Delayed,
		Consumers: st.Consumers, Bytes: st.Bytes,
		Published: st.Published, Delivered: st.Delivered, Acked: st.Acked, DeadLettered: st.DeadLettered,
		DeadLetterDropped: tq.dlDropped.Load(), Deduplicated: st.Deduplicated,
	}
}

// deadLetter takes the tasks that leave tq for good to its dead-letter
// exchange: submitted to a task exchange, published to a pub-sub one.
func (tq *taskQueue) deadLetter(dl queue.DeadLetter) {
	target := tq.def.Config.DeadLetter
	if tq.def.Sub != "" || target == "" {
		return
	}
	if o := tq.owner.Load(); !o.mayWrite(target) {
		tq.dropDeadLetter(dl, target, o.refusal(target))
		return
	}
	ex := tq.b.Exchange(target)
	if ex == nil {
		tq.dropDeadLetter(dl, target, "no such exchange")
		return
	}
	h := make(map[string]string, len(dl.Message.Headers)+3)
	for k, v := range dl.Message.Headers {
		h[k] = v
	}
	h["x-death-queue"] = dl.Queue
	h["x-death-reason"] = string(dl.Reason)
	h["x-death-attempts"] = fmt.Sprint(dl.Message.Attempts)
	switch {
	case ex.tq != nil:
		m := queue.Message{Body: dl.Message.Body, Headers: h, Key: dl.Message.Key, Priority: dl.Message.Priority}
		if _, err := ex.tq.q.Enqueue(m, nil, nil); err != nil {
			tq.b.log.Error("dead letter lost", "queue", dl.Queue, "dead_letter", target, "task", dl.Message.ID, "err", err)
		}
	case ex.subs != nil:
		f := wire.NewFrame(wire.TypePublish)
		f.Name, f.Key, f.Header, f.Body = target, dl.Message.Key, h, dl.Message.Body
		ex.publishes.Add(1)
		ex.fanout(f, nil)
	}
}

// taskMessage turns a SUBMIT into a queue message; the message shares
// f's body and headers.
func taskMessage(f *wire.Frame) (queue.Message, error) {
	m := queue.Message{Body: f.Body, Headers: f.Header, Key: f.Key}
	if f.Aux > queue.MaxPriority {
		return m, wire.Errorf(wire.CodeBadOptions, "submit: priority %d above %d", f.Aux, queue.MaxPriority)
	}
	m.Priority = uint8(f.Aux)
	if f.Tag != "" {
		o, err := wire.ParseTaskOptions(f.Tag)
		if err != nil {
			return m, wire.Errorf(wire.CodeBadOptions, "submit: %v", err)
		}
		if o.DueMS != 0 {
			if ahead := o.DueMS - time.Now().UnixMilli(); ahead > wire.MaxDurationMS {
				return m, wire.Errorf(wire.CodeBadOptions, "submit: due time %d is %d ms ahead, more than %d (10 years)", o.DueMS, ahead, int64(wire.MaxDurationMS))
			}
			m.DueAt = time.UnixMilli(o.DueMS)
		}
		m.TTL = msDuration(o.TTLMS)
		m.Producer, m.Seq = o.Producer, o.Seq
	}
	return m, nil
}

// queueError maps a queue error onto the wire.
func queueError(op string, err error) error {
	switch {
	case errors.Is(err, queue.ErrBadMessage):
		return wire.Errorf(wire.CodeBadOptions, "%s: %v", op, err)
	case errors.Is(err, queue.ErrClosed):
		return wire.Errorf(wire.CodeExchangeDeleted, "%s: the queue was deleted", op)
	case errors.Is(err, queue.ErrNotInFlight), errors.Is(err, queue.ErrUnknownConsumer), errors.Is(err, queue.ErrNotFound):
		return wire.Errorf(wire.CodeNotFound, "%s: %v", op, err)
	}
	return wire.Errorf(wire.CodeStorage, "%s: %v", op, err)
}

// submit enqueues a SUBMIT. With FlagReply the submitter gets an OK
// carrying the task id once the task is durable; with FlagWatch, the
// task's events follow it.
func (s *Session) submit(f *wire.Frame) {
	ref, flags := f.Ref, f.Flags
	if !s.allowed(auth.Write, f.Name) {
		s.sendError(ref, s.deny("submit", auth.Write, f.Name))
		f.Release()
		return
	}
	ex, err := s.b.lookup(f.Name)
	if err != nil && s.peer == nil {
		// A replicated queue led by another node: forwarded there. A
		// submit from another node is never forwarded again.
		if node := s.b.forwardTarget(f.Name); node != "" {
			if ref != 0 && flags&wire.FlagWatch != 0 {
				s.forwardWatch(node, f)
				return
			}
			s.forwardSubmit(node, f)
			return
		}
	}
	if err == nil && ex.tq == nil {
		err = wire.Errorf(wire.CodeNotAllowed, "exchange %q is %s: submit needs a task exchange", ex.name, ex.cfg.Pattern)
	}
	var m queue.Message
	if err == nil {
		m, err = taskMessage(f)
	}
	f.Release() // m keeps the body and headers
	if err != nil {
		s.sendError(ref, err)
		return
	}
	var tw *taskWatch
	var confirm func(error)
	var watch queue.WatchFunc
	if ref != 0 && flags&(wire.FlagReply|wire.FlagWatch) != 0 {
		tw = &taskWatch{s: s, ref: ref, watch: flags&wire.FlagWatch != 0}
		confirm = tw.confirmed
		if tw.watch {
			watch = tw.event
		}
	}
	ex.publishes.Add(1)
	s.stats.Publishes.Add(1)
	if s.lastQueue.Load() != ex.tq {
		s.lastQueue.Store(ex.tq)
	}
	// A resend the queue holds already is answered, not refused nor
	// made room for.
	if ex.tq.bounded() && !ex.tq.q.Duplicate(m.Producer, m.Seq) && ex.tq.full(len(m.Body)) {
		s.sendError(ref, wire.Errorf(wire.CodeQueueFull, "submit to %s: the queue is full (max_length %d, max_bytes %d)", ex.name, ex.cfg.MaxLength, ex.cfg.MaxBytes))
		return
	}
	id, err := ex.tq.q.Enqueue(m, confirm, watch)
	if err != nil {
		s.sendError(ref, queueError("submit to "+ex.name, err))
		return
	}
	if tw != nil {
		tw.enqueued(id)
	}
}

// taskWatch answers a SUBMIT (or a WATCH) once both the queue has given
// the task its id and the task is durable, whichever comes last, and then
// forwards the task's events, none before the OK.
type taskWatch struct {
	s     *Session
	ref   uint64
	watch bool

	id   uint64
	err  error
	half atomic.Int32 // 2 once both the id and the confirm are in

	mu      sync.Mutex // guards sent, pending (watching only)
	sent    bool
	pending []*wire.Frame
}

func (tw *taskWatch) confirmed(err error) {
	tw.err = err
	if tw.half.Add(1) == 2 {
		tw.answer()
	}
}

func (tw *taskWatch) enqueued(id uint64) {
	tw.id = id
	if tw.half.Add(1) == 2 {
		tw.answer()
	}
}

func (tw *taskWatch) answer() {
	var f *wire.Frame
	if tw.err != nil {
		f = wire.NewFrame(wire.TypeError)
		f.Ref, f.Aux, f.Tag = tw.ref, uint64(wire.CodeStorage), fmt.Sprintf("task %d may not be durable: %v", tw.id, tw.err)
	} else {
		f = wire.NewFrame(wire.TypeOK)
		f.Ref, f.Aux = tw.ref, tw.id
		if tw.watch {
			f.Flags = wire.FlagWatch
		}
	}
	if !tw.watch {
		tw.s.sink.Deliver(f)
		return
	}
	tw.mu.Lock()
	defer tw.mu.Unlock()
	tw.s.sink.Deliver(f)
	for _, e := range tw.pending {
		if tw.err != nil {
			e.Release()
			continue
		}
		tw.s.sink.Deliver(e)
	}
	tw.sent, tw.pending = true, nil
}

// event forwards one of the task's events as a TASKEVENT.
func (tw *taskWatch) event(ev queue.Event) {
	f := taskEventFrame(tw.ref, ev)
	tw.mu.Lock()
	defer tw.mu.Unlock()
	if !tw.sent {
		tw.pending = append(tw.pending, f)
		return
	}
	if tw.err != nil {
		f.Release()
		return
	}
	if f.Flags&wire.FlagLast != 0 {
		tw.s.unwatch(tw.ref)
	}
	tw.s.sink.Deliver(f)
}

// reasonLost is the Reason of a TASKEVENT lost.
const reasonLost = "the queue closed here: deleted, or served by another node now; watch the task again"

func taskEventFrame(ref uint64, ev queue.Event) *wire.Frame {
	f := wire.NewFrame(wire.TypeTaskEvent)
	f.Ref = ref
	body := wire.TaskEventBody{ID: ev.ID, Attempts: ev.Attempts, Worker: ev.Consumer}
	switch ev.Kind {
	case queue.EventProgress:
		f.Aux = wire.TaskProgress
		body.Percent, body.Text = ev.Percent, ev.Text
	case queue.EventRetry:
		f.Aux = wire.TaskRetry
		body.DueMS = ev.Due.UnixMilli()
	case queue.EventCompleted:
		f.Aux, f.Flags = wire.TaskCompleted, wire.FlagLast
	case queue.EventFailed:
		f.Aux, f.Flags = wire.TaskFailed, wire.FlagLast
		body.Reason = string(ev.Reason)
	case queue.EventLost:
		f.Aux, f.Flags = wire.TaskLost, wire.FlagLast
		body.Reason = reasonLost
	}
	f.Body = jsonBody(body)
	return f
}

// watchTask handles WATCH: the task's events, from now to its last one.
func (s *Session) watchTask(f *wire.Frame) {
	// Its submitter (write) or its workers (read) may follow a task.
	if !s.allowed(auth.Write|auth.Read, f.Name) {
		s.sendError(f.Ref, s.deny("watch", auth.Write|auth.Read, f.Name))
		f.Release()
		return
	}
	ex, err := s.b.lookup(f.Name)
	if err != nil && s.peer == nil && f.Ref != 0 {
		// A replicated queue led by another node: forwarded there
		// (forward_watch.go), never again from there.
		if node := s.b.forwardTarget(f.Name); node != "" {
			s.forwardWatch(node, f)
			return
		}
	}
	defer f.Release()
	if err == nil && ex.tq == nil {
		err = wire.Errorf(wire.CodeNotAllowed, "exchange %q is %s: only tasks can be watched", ex.name, ex.cfg.Pattern)
	}
	if err != nil {
		s.sendError(f.Ref, err)
		return
	}
	tw := &taskWatch{s: s, ref: f.Ref, watch: true}
	cancel, err := ex.tq.q.Watch(f.Aux, tw.event)
	if err != nil {
		s.sendError(f.Ref, queueError(fmt.Sprintf("watch task %d of %s", f.Aux, ex.name), err))
		return
	}
	s.mu.Lock()
	if s.watches == nil {
		s.watches = make(map[uint64]func())
	}
	s.watches[f.Ref] = cancel
	s.mu.Unlock()
	tw.half.Store(1)
	tw.enqueued(f.Aux)
}

// unwatch forgets a WATCH that ended; it reports whether there was one,
// after cancelling it.
func (s *Session) unwatch(ref uint64) bool {
	s.mu.Lock()
	cancel, ok := s.watches[ref]
	delete(s.watches, ref)
	s.mu.Unlock()
	if ok {
		cancel()
	}
	return ok
}

// attachConsumer makes a a consumer of tq: a worker of a task exchange
// (which joins its group), or a durable subscriber.
func (tq *taskQueue) attachConsumer(a *Attachment, prefetch int) error {
	if prefetch <= 0 {
		prefetch = defaultPrefetch
	}
	tag := a.connTag
	if tag == "" {
		tag = a.member
	}
	tq.attachMu.Lock()
	defer tq.attachMu.Unlock()
	if a.gone.Load() {
		uncharge(a)
		return wire.Errorf(wire.CodeCancelled, "attach: the connection closed")
	}
	member := a.role == wire.RoleWorker
	if member {
		if err := tq.ex.join(a); err != nil {
			return err
		}
	}
	a.tmu.Lock()
	c, err := tq.q.AddConsumer(a.member, queue.ConsumerConfig{Prefetch: prefetch, Tag: tag, Deliver: a.deliverTask})
	if err == nil {
		a.consumer.Store(c)
		if tq.consumers == nil {
			tq.consumers = make(map[*Attachment]struct{})
		}
		tq.consumers[a] = struct{}{}
	}
	a.tmu.Unlock()
	if err != nil {
		if member {
			tq.ex.leave(a)
		}
		uncharge(a)
		return queueError("attach to "+tq.Name(), err)
	}
	if a.role == wire.RoleSubscriber {
		// The binding may have changed since durableSub counted it.
		syncBound(a, tq.boundPatterns())
	}
	return nil
}

// detachConsumer takes a's consumer off its queue: what it had in flight
// is redelivered, and a durable subscriber's binding no longer counts
// against its connection.
func (tq *taskQueue) detachConsumer(a *Attachment) { tq.detachConsumerAs(a, false) }

// detachConsumerAs is detachConsumer; with returned, what a had in
// flight comes back without a failed attempt (queue.ReturnConsumer).
func (tq *taskQueue) detachConsumerAs(a *Attachment, returned bool) {
	tq.attachMu.Lock()
	defer tq.attachMu.Unlock()
	if c := a.consumer.Swap(nil); c != nil {
		if returned {
			tq.q.ReturnConsumer(c)
		} else {
			tq.q.RemoveConsumer(c)
		}
	}
	delete(tq.consumers, a)
	uncharge(a)
	if a.role == wire.RoleWorker {
		tq.ex.leave(a)
	}
}

// deliverTask sends one task to the consumer's client.
func (a *Attachment) deliverTask(d queue.Delivery) {
	f := wire.NewFrame(wire.TypeTask)
	f.Attach, f.Ref, f.Aux = a.id, d.ID, uint64(d.Attempts)
	f.Key, f.Header, f.Body = d.Key, d.Headers, d.Body
	a.s.stats.Delivered.Add(d.ID, 1)
	a.s.sink.Deliver(f)
}

// settle handles ACK, NACK and PROGRESS from a consumer.
func (s *Session) settle(f *wire.Frame) {
	defer f.Release()
	s.mu.Lock()
	a := s.attachments[f.Attach]
	s.mu.Unlock()
	var c *queue.Consumer
	if a != nil {
		if c = a.consumer.Load(); c == nil {
			a.tmu.Lock() // its attach may still be running
			c = a.consumer.Load()
			a.tmu.Unlock()
		}
	}
	if c == nil {
		s.sendError(0, wire.Errorf(wire.CodeNotFound, "%s task %d: attachment %d is not a worker", f.Type, f.Ref, f.Attach))
		return
	}
	q := a.tq.q
	var err error
	switch f.Type {
	case wire.TypeAck:
		err = q.Ack(c, f.Ref)
	case wire.TypeNack:
		err = q.Nack(c, f.Ref, f.Aux == 1)
	case wire.TypeProgress:
		err = q.Progress(c, f.Ref, int(min(f.Aux, 100)), f.Tag)
	}
	if err != nil {
		s.sendError(0, queueError(fmt.Sprintf("%s task %d of %s", f.Type, f.Ref, q.Name()), err))
	}
}

// bindingSink is the sink of a durable subscription's binding: what the
// binding receives is enqueued.
type bindingSink struct{ tq *taskQueue }

func (bs bindingSink) Deliver(f *wire.Frame) {
	if f.Type == wire.TypeMessage {
		m := queue.Message{Body: f.Body, Headers: f.Header, Key: f.Key}
		if _, err := bs.tq.q.Enqueue(m, nil, nil); err != nil && !errors.Is(err, queue.ErrClosed) {
			bs.tq.b.log.Error("durable subscription lost a message", "queue", bs.tq.Name(), "err", err)
		}
	}
	f.Release()
}

// enqueue is Deliver for a confirmed publish: the MESSAGE f holds pc's
// answer until it is durable in the queue. A queue deleted meanwhile
// releases the hold at once, as if the message had not been routed to
// it; a queue that refuses it fails the confirm.
func (bs bindingSink) enqueue(f *wire.Frame, pc *publishConfirm) {
	m := queue.Message{Body: f.Body, Headers: f.Header, Key: f.Key}
	f.Release() // m keeps the body and headers
	name := bs.tq.Name()
	pc.hold()
	_, err := bs.tq.q.Enqueue(m, func(err error) { pc.stored(name, err) }, nil)
	switch {
	case err == nil:
	case errors.Is(err, queue.ErrClosed):
		pc.stored(name, nil)
	default:
		bs.tq.b.log.Error("durable subscription lost a message", "queue", name, "err", err)
		pc.stored(name, err)
	}
}

// bind subscribes the durable subscription's binding to patterns, in
// place of the ones it had.
func (tq *taskQueue) bind(patterns []string) {
	tq.defMu.Lock()
	defer tq.defMu.Unlock()
	if tq.binding == nil {
		s := &Session{b: tq.b, id: "q", name: tq.Name(), sink: bindingSink{tq}, attachments: map[uint32]*Attachment{}}
		tq.binding = &Attachment{s: s, id: 1, member: "queue:" + tq.Name(), ex: tq.ex, role: wire.RoleSubscriber}
	}
	a := tq.binding
	keep := make(map[string]bool, len(patterns))
	for _, p := range patterns {
		keep[p] = true
	}
	ex := tq.ex
	ex.subMu.Lock()
	ex.dropPatternsLocked(a, func(p string) bool { return !keep[p] })
	ex.subMu.Unlock()
	// Checked at ATTACH; a definition from the store is taken as it is,
	// even past a limit lowered since.
	ex.addPatterns(a, patterns, false, 0)
	tq.def.Patterns = slices.Clone(patterns)
	tq.defVer++
}

// durableSub returns the durable subscription sub of pub-sub exchange ex,
// created if new, bound to patterns. For a, the subscriber that attaches
// (nil for none), the binding's patterns are counted against its
// connection (see chargeBound); a refused ATTACH creates or changes
// nothing, and counts nothing.
func (b *Broker) durableSub(ex *Exchange, sub string, patterns []string, a *Attachment) (*taskQueue, error) {
	return b.durableSubFiltered(ex, sub, patterns, nil, a)
}

// durableSubFiltered is durableSub that also sets the subscription's
// header filters to filters, unless filters is nil.
func (b *Broker) durableSubFiltered(ex *Exchange, sub string, patterns []string, filters []HeaderFilter, a *Attachment) (*taskQueue, error) {
	if ex.cfg.Controlled {
		return nil, wire.Errorf(wire.CodeNotAllowed, "exchange %q is controlled: durable subscriptions need an exchange without a controller", ex.name)
	}
	if !ValidName(sub) {
		return nil, wire.Errorf(wire.CodeBadOptions, "invalid durable subscription name %q: use dot-separated words of letters, digits, '_', '-', ':'", sub)
	}
	patterns = distinct(patterns)
	name := ex.name + "/" + sub
	what := "attach " + name
	b.qmu.Lock()
	defer b.qmu.Unlock()
	if v, ok := b.queues.Load(name); ok {
		tq := v.(*taskQueue)
		if tq.ex != ex {
			return nil, wire.Errorf(wire.CodeClash, "durable subscription %q belongs to an exchange deleted since", name)
		}
		tq.defMu.Lock()
		same := slices.Equal(tq.def.Patterns, patterns) && (filters == nil || sameFilters(tq.def.Headers, filters))
		def := tq.def
		tq.defMu.Unlock()
		n := len(def.Patterns)
		if len(patterns) > 0 {
			n = len(patterns)
		}
		if err := b.chargeBound(a, n, what); err != nil {
			return nil, err
		}
		if len(patterns) == 0 || same {
			return tq, nil
		}
		def.Patterns = patterns
		if filters != nil {
			def.Headers = filters
		}
		rebind := func() {
			if filters != nil {
				tq.defMu.Lock()
				tq.def.Headers = filters
				tq.defVer++
				tq.defMu.Unlock()
				tq.setFilters(filters)
			}
			tq.bind(patterns)
		}
		if err := b.defineQueue(def, rebind)(); err != nil {
			uncharge(a)
			return nil, err
		}
		tq.syncBounds()
		return tq, nil
	}
	if max := b.cfg.MaxDurableSubscriptions; b.durableSubs.Load() >= int64(max) {
		return nil, wire.Errorf(wire.CodeLimit, "%s: the node has %d durable subscriptions, its limit: delete one first", what, max)
	}
	if err := b.chargeBound(a, len(patterns), what); err != nil {
		return nil, err
	}
	def := queueDef{Name: name, Exchange: ex.name, Config: ex.cfg, Sub: sub, Patterns: patterns, Headers: filters}
	if b.dur != nil {
		def.ID = b.dur.newID()
	}
	tq, err := b.newTaskQueue(ex, def, Trusted(), nil)
	if err != nil {
		uncharge(a)
		return nil, err
	}
	err = b.defineQueue(def, func() {
		tq.bind(patterns)
		b.putQueue(name, tq)
	})()
	if err != nil {
		uncharge(a)
		return nil, err
	}
	b.log.Info("durable subscription created", "queue", name, "patterns", patterns)
	return tq, nil
}

// resubscribe handles a SUBSCRIBE (add) or an UNSUBSCRIBE of durable
// subscriber a: it changes the binding of a's subscription, durably, and
// returns the binding's patterns now. The binding is held to a's limits,
// the attachment's and its connection's, as its own patterns would be.
func (b *Broker) resubscribe(a *Attachment, add bool, patterns []string) ([]string, error) {
	tq := a.tq
	what := "unsubscribe " + a.member
	if add {
		what = "subscribe " + a.member
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	if v, ok := b.queues.Load(tq.Name()); !ok || v != tq {
		return nil, wire.Errorf(wire.CodeNotFound, "%s: durable subscription %q was deleted", what, tq.Name())
	}
	tq.defMu.Lock()
	def := tq.def
	tq.defMu.Unlock()
	want := changePatterns(def.Patterns, add, patterns)
	if slices.Equal(want, def.Patterns) {
		return want, nil
	}
	if max := b.cfg.MaxPatternsPerAttachment; add && len(want) > max {
		return nil, wire.Errorf(wire.CodeTooManyPatterns, "%s: %d more patterns would pass the attachment's limit of %d (durable subscription %q has %d)",
			what, len(want)-len(def.Patterns), max, tq.Name(), len(def.Patterns))
	}
	tq.attachMu.Lock()
	var err error = wire.Errorf(wire.CodeNotFound, "%s: the attachment detached", what)
	if _, attached := tq.consumers[a]; attached {
		err = b.chargeBound(a, len(want), what)
	}
	tq.attachMu.Unlock()
	if err != nil {
		return nil, err
	}
	def.Patterns = want
	err = b.defineQueue(def, func() { tq.bind(want) })()
	tq.syncBounds() // a's count is the binding's again, changed or not
	if err != nil {
		return nil, err
	}
	b.log.Info("durable subscription bound anew", "queue", tq.Name(), "patterns", len(want), "by", a.member)
	return slices.Clone(want), nil
}

// changePatterns returns the patterns of have with those of patterns
// added (add) or removed, without repeats.
func changePatterns(have []string, add bool, patterns []string) []string {
	if add {
		return distinct(append(slices.Clone(have), patterns...))
	}
	drop := make(map[string]bool, len(patterns))
	for _, p := range patterns {
		drop[p] = true
	}
	return distinct(slices.DeleteFunc(slices.Clone(have), func(p string) bool { return drop[p] }))
}

// distinct returns patterns without repeats, in the order they come
// first, in a new slice.
func distinct(patterns []string) []string {
	out := make([]string, 0, len(patterns))
	seen := make(map[string]bool, len(patterns))
	for _, p := range patterns {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// DeleteQueue deletes a queue and its messages: a durable subscription,
// or the task exchange that owns the queue.
func (b *Broker) DeleteQueue(name string) error {
	v, ok := b.queues.Load(name)
	if !ok {
		if r := b.replicated(); r != nil {
			if _, _, ok := r.Queue(name); ok {
				return b.Delete(name) // a replicated queue served elsewhere
			}
		}
		return wire.Errorf(wire.CodeNotFound, "queue %q not found", name)
	}
	tq := v.(*taskQueue)
	if tq.def.Sub == "" {
		return b.Delete(tq.ex.name)
	}
	b.dropQueue(tq, fmt.Sprintf("durable subscription %q was deleted", name))
	return nil
}

// dropQueue removes tq and its consumers for good.
func (b *Broker) dropQueue(tq *taskQueue, why string) {
	name := tq.Name()
	b.qmu.Lock()
	if v, ok := b.queues.Load(name); !ok || v != tq {
		b.qmu.Unlock()
		return
	}
	remove := func() { b.removeQueue(name) }
	if tq.durable {
		b.undefineQueue(tq.def.ID, remove)
	} else {
		remove()
	}
	b.qmu.Unlock()
	tq.defMu.Lock()
	binding := tq.binding
	tq.defMu.Unlock()
	if binding != nil {
		tq.ex.removeAll(binding)
	}
	// Its consumers go first, so that what they hold comes back to the
	// queue, then everything is purged: every record of the queue is
	// released, and its segments can go. Durable subscribers are told; a
	// task exchange's workers were, with the exchange.
	consumers := tq.attachedConsumers()
	for _, a := range consumers {
		tq.detachConsumer(a)
		if a.role == wire.RoleSubscriber {
			a.s.forget(a)
			a.detached(why)
		}
	}
	if _, err := tq.q.Purge(); err != nil && !errors.Is(err, queue.ErrClosed) {
		b.log.Warn("queue: purge at deletion failed; its records stay until the next restart", "queue", name, "err", err)
	}
	tq.q.Close()
	if tq.durable {
		b.dur.log.DropRuns(tq.def.ID)
	}
	b.log.Info("queue deleted", "queue", name, "why", why)
}

// Pressure is how hard the publishers of this session should be slowed,
// from 0 to 1: the flow-control pressure of the queue it submitted to
// last, or published to through a durable subscription (see
// queue.Queue.Pressure), so that the publishers of the queues that cause
// memory or disk pressure are slowed first.
func (s *Session) Pressure() float64 {
	if tq := s.lastQueue.Load(); tq != nil {
		return tq.q.Pressure()
	}
	return 0
}

// SubmitPressure is the flow-control pressure of the task exchange name's
// queue, 0 if there is none: an embedded client's submits wait while it
// is 1.
func (s *Session) SubmitPressure(name string) float64 {
	if ex := s.b.Exchange(name); ex != nil && ex.tq != nil {
		return ex.tq.q.Pressure()
	}
	return 0
}

// dropSubscriptions deletes the durable subscriptions of a pub-sub
// exchange that was deleted.
func (b *Broker) dropSubscriptions(ex *Exchange) {
	var list []*taskQueue
	b.queues.Range(func(_, v any) bool {
		if tq := v.(*taskQueue); tq.ex == ex && tq.def.Sub != "" {
			list = append(list, tq)
		}
		return true
	})
	for _, tq := range list {
		b.dropQueue(tq, fmt.Sprintf("exchange %q was deleted", ex.name))
	}
}

// PurgeQueue removes the messages of a queue that are not in flight and
// returns how many.
func (b *Broker) PurgeQueue(name string) (uint64, error) {
	q := b.Queue(name)
	if q == nil {
		return 0, wire.Errorf(wire.CodeNotFound, "queue %q not found", name)
	}
	n, err := q.Purge()
	if err != nil {
		return 0, queueError("purge "+name, err)
	}
	b.log.Info("queue purged", "queue", name, "messages", n)
	return uint64(n), nil
}

// attachedConsumers returns the queue's consumers at this instant, for
// detaching them outside attachMu.
func (tq *taskQueue) attachedConsumers() []*Attachment {
	tq.attachMu.Lock()
	defer tq.attachMu.Unlock()
	consumers := make([]*Attachment, 0, len(tq.consumers))
	for a := range tq.consumers {
		consumers = append(consumers, a)
	}
	return consumers
}
