package courier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/courier-mq/courier/wire"
)

// AttachOption configures an attachment.
type AttachOption func(*attachCfg)

type attachCfg struct {
	serviceTag string
	spec       wire.AttachSpec
	onEvent    func(Event)
}

func attachConfig(opts []AttachOption) attachCfg {
	var c attachCfg
	for _, o := range opts {
		o(&c)
	}
	return c
}

// ServiceTag puts a handler in the group of that tag; requests that name
// the tag go only to that group.
func ServiceTag(tag string) AttachOption { return func(c *attachCfg) { c.serviceTag = tag } }

// ConnTag names the attachment, so that one client attached several
// times to an exchange can tell through which attachment an event came.
// Sticky exchanges also hash a handler by it, so a restarted handler with
// the same tag gets its keys back.
func ConnTag(tag string) AttachOption { return func(c *attachCfg) { c.spec.ConnTag = tag } }

// Options attaches free-form options that other members see in events.
func Options(kv map[string]string) AttachOption {
	return func(c *attachCfg) { c.spec.Options = kv }
}

// Patterns adds subscription patterns.
func Patterns(patterns ...string) AttachOption {
	return func(c *attachCfg) { c.spec.Patterns = append(c.spec.Patterns, patterns...) }
}

// OnEvent sets a function called with every membership event of the
// attachment, from the attachment's goroutine, in order.
func OnEvent(fn func(Event)) AttachOption { return func(c *attachCfg) { c.onEvent = fn } }

// EventKind says what changed in an exchange's group.
type EventKind int

// Event kinds.
const (
	// EventLeader: the leader is (now) Leader; Members is the group.
	EventLeader EventKind = wire.EventLeader
	// EventMemberUp: Member joined.
	EventMemberUp EventKind = wire.EventMemberUp
	// EventMemberDown: Member left.
	EventMemberDown EventKind = wire.EventMemberDown
	// EventSubscriptions: a controller changed this subscriber's patterns.
	EventSubscriptions EventKind = wire.EventSubscriptions
	// EventDetached: the attachment is gone; Reason says why.
	EventDetached EventKind = wire.EventDetached
	// EventDisconnected and EventReattached are in reconnect.go.
)

func (k EventKind) String() string {
	switch k {
	case EventLeader:
		return "leader"
	case EventMemberUp:
		return "member-up"
	case EventMemberDown:
		return "member-down"
	case EventSubscriptions:
		return "subscriptions"
	case EventDetached:
		return "detached"
	case EventDisconnected:
		return "disconnected"
	case EventReattached:
		return "reattached"
	}
	return fmt.Sprintf("event(%d)", int(k))
}

// Event is a membership event of an attachment's exchange.
type Event struct {
	Kind     EventKind
	Exchange string
	ConnTag  string   // the attachment it came through
	Leader   string   // member id of the leader
	Member   *Member  // who joined or left (on EventLeader: whose coming or going changed the leader)
	Members  []Member // the whole group, oldest first
	Patterns []string // EventSubscriptions: the patterns now
	Reason   string   // EventDetached, EventDisconnected
	// Was is the attachment's member id before its Conn reconnected
	// (EventDisconnected, EventReattached); Member is it now.
	Was string
	// IsLeader tells whether the attachment it came through is the leader.
	IsLeader bool
	// Epoch and Term are the leader's fencing token in a cluster, on a
	// request-response exchange (zero otherwise): compare tokens by Epoch,
	// then Term; each new leader's is larger. Hand it to what the leader
	// writes to, so that a write under an older token can be refused.
	Epoch, Term uint64
}

// Attachment is one attachment of this Conn to an exchange: a handler,
// subscriber or controller.
type Attachment struct {
	c        *Conn
	id       uint32
	exchange string
	role     uint64
	cfg      attachCfg
	member   string

	handler HandlerFunc
	onMsg   MessageFunc
	control ControlFunc
	job     JobFunc

	// in is written by every goroutine that delivers to the attachment:
	// it has cache lines of its own.
	_  [64]byte
	in inbox
	_  [64]byte
	// serving is the request whose handler function runs now on the
	// attachment's goroutine (see reqServing).
	serving atomic.Pointer[Request]
	// batch defers the writes of responses made while the goroutine works
	// through a batch of requests; it is flushed at the end of each batch.
	batch wire.Batch

	mu       sync.Mutex // guards member, was, attached, leader, members, patterns, active, err, leaving
	leader   string
	leaving  bool // Detach was called: no longer a leader, whatever events say
	attached bool // the broker took the attachment: a reconnect puts it back
	was      string
	members  []Member
	patterns []string
	active   map[uint64]*Request // requests parked unanswered (see reqParked)
	err      error
	done     chan struct{}
}

// ID returns the attachment's member id, such as "n1/c7.3": its
// connection's id and its attach id. It changes
// when the Conn reconnects (see [EventReattached]).
func (a *Attachment) ID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.member
}

// Exchange returns the exchange's name.
func (a *Attachment) Exchange() string { return a.exchange }

// ConnTag returns the attachment's connection tag.
func (a *Attachment) ConnTag() string { return a.cfg.spec.ConnTag }

// IsLeader reports whether this attachment is its group's leader, as of
// the last event it received.
func (a *Attachment) IsLeader() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.leads()
}

// leads reports whether the attachment leads; a.mu is held. An attachment
// that is detaching or has ended leads no more, so that it never overlaps
// with the leader appointed after it.
func (a *Attachment) leads() bool {
	return a.err == nil && !a.leaving && a.leader != "" && a.leader == a.member
}

// Leader returns the member id of the group's leader ("" if none known).
func (a *Attachment) Leader() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.leader
}

// Members returns the group, oldest first, as of the last event.
func (a *Attachment) Members() []Member {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.members)
}

// Patterns returns a subscriber's patterns.
func (a *Attachment) Patterns() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.patterns)
}

// Done is closed when the attachment ends; see [Attachment.Err].
func (a *Attachment) Done() <-chan struct{} { return a.done }

// Err tells why the attachment ended, or nil while it lives.
func (a *Attachment) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

func (c *Conn) attach(ctx context.Context, exchange string, role uint64, cfg attachCfg, h HandlerFunc, m MessageFunc, ctl ControlFunc, job JobFunc) (*Attachment, error) {
	a := &Attachment{
		c: c, id: c.nextAttach.Add(1), exchange: exchange, role: role, cfg: cfg,
		handler: h, onMsg: m, control: ctl, job: job,
		active: make(map[uint64]*Request),
		done:   make(chan struct{}),
	}
	// The member id is the connection's id and the attachment's (see
	// docs/protocol.md), known before the broker answers (join sets it):
	// frames for the attachment may arrive before its OK and are served
	// at once, so a busy exchange cannot fill the inbox while the OK
	// waits behind it.
	a.in.init()
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.atts.Store(a.id, a)
	c.mu.Unlock()
	go a.run()

	res, err := a.join(ctx)
	if err != nil {
		c.atts.Delete(a.id)
		a.stop(err)
		return nil, err
	}
	a.mu.Lock()
	a.patterns = res.Patterns
	a.attached = true
	a.mu.Unlock()
	c.attachMu.RUnlock()
	return a, nil
}

// join sends the attachment's ATTACH and waits for its answer; on
// success it returns with c.attachMu read-locked, so that a reconnect
// re-attaches it only once it knows it is attached. An ATTACH lost with
// its connection is sent again on the next one.
func (a *Attachment) join(ctx context.Context) (wire.AttachResult, error) {
	c := a.c
	for {
		if err := c.waitUp(ctx); err != nil {
			return wire.AttachResult{}, err
		}
		c.attachMu.RLock()
		if c.down.Load() != nil {
			c.attachMu.RUnlock()
			continue // lost again meanwhile
		}
		a.mu.Lock()
		a.member = fmt.Sprintf("%s.%d", c.ID(), a.id)
		a.mu.Unlock()
		f := wire.NewFrame(wire.TypeAttach)
		f.Attach, f.Name, f.Aux, f.Tag = a.id, a.exchange, a.role, a.cfg.serviceTag
		f.Body, _ = json.Marshal(a.cfg.spec)
		var res wire.AttachResult
		err := c.roundTripNow(ctx, f, &res)
		if err == nil {
			if res.Member != "" {
				a.mu.Lock()
				a.member = res.Member
				a.mu.Unlock()
			}
			return res, nil
		}
		c.attachMu.RUnlock()
		if !errors.Is(err, ErrConnectionLost) || ctx.Err() != nil {
			return wire.AttachResult{}, err
		}
		for _, f := range a.in.purge() { // what the lost connection sent it
			f.Release()
		}
	}
}

// Detach ends the attachment: it leaves the exchange's group (a new
// leader is appointed if it led) and receives nothing more.
func (a *Attachment) Detach(ctx context.Context) error {
	a.mu.Lock()
	a.leaving = true // resign before the broker appoints another
	a.mu.Unlock()
	f := wire.NewFrame(wire.TypeDetach)
	f.Attach = a.id
	err := a.c.roundTrip(ctx, f, nil)
	if errors.Is(err, ErrConnectionLost) || errors.Is(err, ErrNotFound) {
		// It went with a lost connection and, leaving, was not put
		// back on the next (or the server detached it already).
		err = nil
	}
	a.c.atts.Delete(a.id)
	a.stop(fmt.Errorf("courier: attachment %s detached", a.ID()))
	return err
}

// Subscribe adds patterns to a subscriber. On a controlled exchange the
// controller decides, and may narrow them.
func (a *Attachment) Subscribe(ctx context.Context, patterns ...string) error {
	return a.changePatterns(ctx, wire.TypeSubscribe, "", patterns)
}

// Unsubscribe removes patterns from a subscriber.
func (a *Attachment) Unsubscribe(ctx context.Context, patterns ...string) error {
	return a.changePatterns(ctx, wire.TypeUnsubscribe, "", patterns)
}

// SubscribeMember, from a controller, subscribes another attachment of
// the exchange (by member id) to patterns.
func (a *Attachment) SubscribeMember(ctx context.Context, member string, patterns ...string) error {
	return a.changePatterns(ctx, wire.TypeSubscribe, member, patterns)
}

// UnsubscribeMember, from a controller, unsubscribes another attachment.
func (a *Attachment) UnsubscribeMember(ctx context.Context, member string, patterns ...string) error {
	return a.changePatterns(ctx, wire.TypeUnsubscribe, member, patterns)
}

func (a *Attachment) changePatterns(ctx context.Context, t wire.Type, member string, patterns []string) error {
	f := wire.NewFrame(t)
	f.Attach, f.Name = a.id, member
	f.Body, _ = json.Marshal(wire.PatternsBody{Patterns: patterns})
	var pb wire.PatternsBody
	if err := a.c.roundTrip(ctx, f, &pb); err != nil {
		return err
	}
	if member == "" {
		a.mu.Lock()
		a.patterns = pb.Patterns
		a.mu.Unlock()
	}
	return nil
}

// stop ends the attachment's goroutine.
func (a *Attachment) stop(err error) {
	a.mu.Lock()
	if a.err == nil {
		a.err = err
	}
	active := a.active
	a.active = map[uint64]*Request{}
	a.mu.Unlock()
	for _, r := range active {
		r.cancelCtx()
	}
	if r := a.serving.Load(); r != nil {
		r.cancelCtx()
	}
	// Requests still queued get an answer, so no requester waits for a
	// handler that is gone.
	for _, f := range a.in.close() {
		a.c.orphan(f)
	}
}

// run is the attachment's goroutine: it takes frames in batches and calls
// the user's functions, one at a time, in order.
func (a *Attachment) run() {
	defer close(a.done)
	var batch []*wire.Frame
	var d Delivery
	for {
		var epoch uint32
		batch, epoch = a.in.take(batch[:0])
		if batch == nil {
			return
		}
		for i, f := range batch {
			batch[i] = nil
			if i == len(batch)-1 {
				a.batch.Flush() // the last one's answer goes out alone, at once
			}
			if stale(f) && a.in.epoch.Load() != epoch {
				f.Release() // from a connection lost since: see purge
				continue
			}
			switch f.Type {
			case wire.TypeRequest:
				a.serve(f)
			case wire.TypeMessage:
				d.Key, d.Header, d.Body = f.Key, f.Header, f.Body
				d.Exchange, d.ConnTag = a.exchange, a.cfg.spec.ConnTag
				f.Release()
				a.deliver(&d)
			case wire.TypeEvent:
				a.event(f)
			case wire.TypeSubRequest:
				a.decide(f)
			case wire.TypeTask:
				a.work(f, &d)
			default:
				f.Release()
			}
		}
		a.batch.Flush()
	}
}

// deliver calls the subscriber's function; it reports false if it
// panicked.
func (a *Attachment) deliver(d *Delivery) (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			a.c.log.Error("courier: subscriber panicked", "attachment", a.ID(), "panic", p)
			ok = false
		}
	}()
	if a.onMsg != nil {
		a.onMsg(d)
	}
	return true
}

func (a *Attachment) event(f *wire.Frame) {
	defer f.Release()
	if le, ok := f.Waiter.(*localEvent); ok {
		a.localEvent(le)
		return
	}
	ev := Event{Kind: EventKind(f.Aux), Exchange: f.Name, ConnTag: a.cfg.spec.ConnTag, Reason: f.Tag}
	if ev.Kind >= localEvents {
		return // not the server's to say
	}
	var body wire.EventBody
	if len(f.Body) > 0 {
		if err := json.Unmarshal(f.Body, &body); err != nil {
			a.c.report(fmt.Errorf("courier: bad event body: %w", err))
			return
		}
	}
	ev.Leader, ev.Member, ev.Members, ev.Patterns = body.Leader, body.Member, body.Members, body.Patterns
	ev.Epoch, ev.Term = body.Epoch, body.Term
	a.mu.Lock()
	switch ev.Kind {
	case EventLeader, EventMemberUp, EventMemberDown:
		a.leader, a.members = body.Leader, body.Members
	case EventSubscriptions:
		a.patterns = body.Patterns
	}
	ev.IsLeader = a.leads()
	a.mu.Unlock()
	if ev.Kind == EventDetached {
		a.c.atts.Delete(a.id)
		defer a.stop(fmt.Errorf("courier: attachment detached: %s", ev.Reason))
	}
	a.tell(ev)
}

// localEvent delivers an event the Conn made itself.
func (a *Attachment) localEvent(le *localEvent) {
	ev := Event{Kind: le.kind, Exchange: a.exchange, ConnTag: a.cfg.spec.ConnTag, Reason: le.reason, Was: le.was}
	a.mu.Lock()
	if le.kind == EventReattached {
		ev.Member = &Member{ID: a.member, Role: wire.RoleName(a.role), ServiceTag: a.cfg.serviceTag, ConnTag: a.cfg.spec.ConnTag, Options: a.cfg.spec.Options}
	}
	ev.IsLeader = a.leads()
	a.mu.Unlock()
	if le.kind == EventDetached {
		defer a.stop(fmt.Errorf("courier: attachment detached: %s", le.reason))
	}
	a.tell(ev)
}

// tell calls the attachment's OnEvent function.
func (a *Attachment) tell(ev Event) {
	if a.cfg.onEvent != nil {
		defer func() {
			if p := recover(); p != nil {
				a.c.log.Error("courier: OnEvent function panicked", "attachment", a.ID(), "panic", p)
			}
		}()
		a.cfg.onEvent(ev)
	}
}

// inline handles frames that must not wait behind the attachment's
// queue: a CANCEL for, or an ANSWER to, a request being served.
func (a *Attachment) inline(f *wire.Frame) {
	r := a.serving.Load()
	if r == nil || r.id != f.Ref {
		a.mu.Lock()
		r = a.active[f.Ref]
		a.mu.Unlock()
	}
	if r == nil {
		f.Release()
		return
	}
	if f.Type == wire.TypeCancel {
		f.Release()
		r.cancelled.Store(true)
		r.cancelCtx()
		return
	}
	r.answer(f)
}

// inbox is an attachment's queue of inbound frames. Data frames wait for
// room (backpressure); control frames never wait.
type inbox struct {
	mu      sync.Mutex // guards q, closed, waiters, room; epoch changes under it
	q       []*wire.Frame
	epoch   atomic.Uint32 // counts purges
	closed  bool
	waiters int
	room    chan struct{} // closed and replaced when room is made
	wake    chan struct{}
}

// inboxLimit bounds the data frames queued for one attachment.
const inboxLimit = 8192

func (b *inbox) init() {
	b.wake = make(chan struct{}, 1)
	b.room = make(chan struct{})
}

// push queues f. Once the inbox is closed it reports false and leaves f
// to the caller, so that a request is still answered.
func (b *inbox) push(f *wire.Frame, data bool) bool {
	b.mu.Lock()
	for data && len(b.q) >= inboxLimit && !b.closed {
		room := b.room
		b.waiters++
		b.mu.Unlock()
		<-room
		b.mu.Lock()
		b.waiters--
	}
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.q = append(b.q, f)
	first := len(b.q) == 1
	b.mu.Unlock()
	if first {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// take waits for frames and returns them all, appended to buf, with the
// epoch they were taken in; nil once the inbox is closed and empty.
func (b *inbox) take(buf []*wire.Frame) ([]*wire.Frame, uint32) {
	yields := 0
	for {
		b.mu.Lock()
		if len(b.q) > 0 {
			buf = append(buf, b.q...)
			clear(b.q)
			b.q = b.q[:0]
			if b.waiters > 0 {
				close(b.room)
				b.room = make(chan struct{})
			}
			epoch := b.epoch.Load()
			b.mu.Unlock()
			return buf, epoch
		}
		if b.closed {
			b.mu.Unlock()
			return nil, 0
		}
		b.mu.Unlock()
		if yields < waitYields {
			yields++
			runtime.Gosched()
			continue
		}
		yields = 0
		<-b.wake
	}
}

// waitYields is how often an attachment's goroutine about to wait for
// its inbox first yields its thread. In-process, the goroutines that
// will send it requests are often runnable on the same thread: letting
// them run first turns a park and a wake-up into a yield, and lets the
// handler take requests in batches. Measured with the node package's
// request benchmarks: 2 did best of 0, 1, 2, 4, 8, 16 and 32; a caller
// waiting for its answer does better without (it only delays the
// handler it waits for).
const waitYields = 2

// stale reports whether f is void once its connection is lost: what
// the broker asked of this attachment, or told it about its group.
func stale(f *wire.Frame) bool {
	switch f.Type {
	case wire.TypeRequest, wire.TypeTask, wire.TypeSubRequest:
		return true
	case wire.TypeEvent:
		return f.Waiter == nil
	}
	return false
}

// purge removes the frames that a lost connection made stale and starts
// a new epoch, so that those already taken are dropped too; it returns
// the removed frames. Messages stay: they were delivered.
func (b *inbox) purge() []*wire.Frame {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.epoch.Add(1)
	var out []*wire.Frame
	keep := b.q[:0]
	for _, f := range b.q {
		if stale(f) {
			out = append(out, f)
		} else {
			keep = append(keep, f)
		}
	}
	clear(b.q[len(keep):])
	b.q = keep
	if b.waiters > 0 {
		close(b.room)
		b.room = make(chan struct{})
	}
	return out
}

// close ends the inbox and returns the frames still queued.
func (b *inbox) close() []*wire.Frame {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	q := b.q
	b.q = nil
	close(b.room)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return q
}
