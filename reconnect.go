package courier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/courier-mq/courier/wire"
)

// ErrConnectionLost is the error of the calls in flight when a network
// connection was lost under them: requests, declarations, attachments
// and task watches fail with it at once, not at their deadline. The Conn
// itself lives on while its transport reconnects (see [ConnEvent]); new
// calls wait for that. Confirms that were outstanding (Submit,
// PublishSync and their async forms) do not fail: they are sent again.
var ErrConnectionLost = errors.New("courier: connection lost")

// ConnEventKind says what happened to a Conn's connection.
type ConnEventKind int

// Connection event kinds.
const (
	// ConnDisconnected: the connection was lost (Err says why) and the
	// transport reconnects. Calls in flight failed with
	// [ErrConnectionLost]; attachments are out of their groups and lead
	// nothing until ConnReconnected.
	ConnDisconnected ConnEventKind = iota + 1
	// ConnReconnected: a new connection is up, to URL, as connection
	// ID. The Conn declared its exchanges again and re-attached every
	// attachment as the youngest member of its group, under a new
	// member id (ID.n instead of Was.n); Err joins what could not be
	// restored. Publishes held meanwhile were sent after that.
	ConnReconnected
	// ConnClosed: the Conn closed for good: the application closed it,
	// reconnecting is off, or it gave up (Err says why).
	ConnClosed
)

func (k ConnEventKind) String() string {
	switch k {
	case ConnDisconnected:
		return "disconnected"
	case ConnReconnected:
		return "reconnected"
	case ConnClosed:
		return "closed"
	}
	return fmt.Sprintf("conn-event(%d)", int(k))
}

// ConnEvent tells what happened to a Conn's network connection. An
// embedded Conn has none.
type ConnEvent struct {
	Kind ConnEventKind
	// Err: why the connection was lost or closed; on ConnReconnected
	// what could not be restored (a declaration or an attachment the
	// new server refused), or nil.
	Err error
	// URL is the server's address (host:port) on ConnReconnected.
	URL string
	// ID is the connection's id now; Was its id before the loss.
	ID, Was string
	// Attempts counts the connection attempts the reconnect took.
	Attempts int
	// Down is how long the Conn was without a connection.
	Down time.Duration
}

// OnConnEvent sets a function called with every [ConnEvent] of the Conn,
// in order, from the transport's goroutine; it must not block for long.
// It replaces the function given at Dial (client.Options.OnConnEvent).
func (c *Conn) OnConnEvent(fn func(ConnEvent)) { c.onConnEvent.Store(&fn) }

// ReportConnEvent hands ev to the function set with [Conn.OnConnEvent]. It is
// for transports.
func (c *Conn) ReportConnEvent(ev ConnEvent) {
	if fn := c.onConnEvent.Load(); fn != nil && *fn != nil {
		(*fn)(ev)
	}
}

// Interrupted is called by a transport that lost its connection and
// reconnects. Calls in flight fail with err, which matches
// [ErrConnectionLost], except confirmed publishes and submits when
// resends is true: the transport sends every such frame it was given, or
// will be given, again on its next connection (or fails it to its
// sender), so their calls go on. New calls wait for [Conn.Reconnected].
// Each attachment leaves its group: it is no longer leader, the requests,
// tasks and subscription requests it holds are dropped (their answers
// could not reach the broker; the broker failed the requests and returns
// the tasks), and its OnEvent gets [EventDisconnected].
func (c *Conn) Interrupted(err error, resends bool) {
	ch := make(chan struct{})
	c.down.CompareAndSwap(nil, &ch) // or lost again during a resume
	c.sess.Add(1)
	c.calls.lose(err, resends)
	for _, a := range c.attachments() {
		a.interrupt(err)
	}
}

// attachments returns the Conn's attachments, oldest first.
func (c *Conn) attachments() []*Attachment {
	var atts []*Attachment
	c.atts.Range(func(_, a any) bool {
		atts = append(atts, a.(*Attachment))
		return true
	})
	slices.SortFunc(atts, func(a, b *Attachment) int { return int(a.id) - int(b.id) })
	return atts
}

// waitUp waits while the transport reconnects, for at most ctx.
func (c *Conn) waitUp(ctx context.Context) error {
	p := c.down.Load()
	if p == nil {
		return nil
	}
	select {
	case <-*p:
		return nil
	case <-c.closed:
		return c.Err()
	case <-ctx.Done():
		return fmt.Errorf("courier: waiting for the connection to come back: %w (%w)", ctx.Err(), ErrConnectionLost)
	}
}

// Resume is called by a transport that reconnected, as connection id,
// before it calls [Conn.Reconnected]: the Conn declares its exchanges
// again and re-attaches its attachments, oldest first, with what they
// have now (a subscriber's patterns, a durable name, a worker's
// prefetch), through send, which writes to the new connection. It
// returns an error only when that connection failed (ctx ends with it);
// what the server refused is in the returned list, and the attachments
// it refused have ended.
func (c *Conn) Resume(ctx context.Context, id string, send func(*wire.Frame) error) (refused []error, err error) {
	c.id.Store(&id)
	c.mu.Lock()
	decls := slices.Clone(c.decls)
	c.mu.Unlock()
	calls := make([]*call, 0, len(decls))
	for _, d := range decls {
		cl, err := c.callVia(send, declareFrame(d.name, d.spec))
		if err != nil {
			c.dropCalls(calls)
			return nil, err
		}
		calls = append(calls, cl)
	}
	for i, cl := range calls {
		if err := c.await(ctx, cl, nil); err != nil {
			if ctx.Err() != nil {
				c.dropCalls(calls[i:])
				return nil, err
			}
			refused = append(refused, fmt.Errorf("courier: declaring %q again: %w", decls[i].name, err))
		}
	}
	// No attach goes on meanwhile: one that had its answer is among
	// atts, one that had not failed and sends its ATTACH again later.
	c.attachMu.Lock()
	defer c.attachMu.Unlock()
	atts := c.attachments()
	calls = calls[:0]
	var again []*Attachment
	for _, a := range atts {
		f := a.reattachFrame(id)
		if f == nil {
			continue
		}
		// Told before the ATTACH goes out, so that it comes before the
		// server's events about the attachment.
		a.local(EventReattached, "")
		cl, err := c.callVia(send, f)
		if err != nil {
			c.dropCalls(calls)
			return nil, err
		}
		calls = append(calls, cl)
		again = append(again, a)
	}
	for i, cl := range calls {
		a := again[i]
		var res wire.AttachResult
		err := c.await(ctx, cl, &res)
		if err != nil && ctx.Err() != nil {
			c.dropCalls(calls[i:])
			return nil, err
		}
		if err != nil {
			err = fmt.Errorf("courier: re-attaching %s to %q: %w", a.ID(), a.exchange, err)
			refused = append(refused, err)
			a.local(EventDetached, err.Error())
			continue
		}
		a.reattached(res)
	}
	return refused, nil
}

// Reconnected is called by a transport once it reconnected and resumed
// (see [Conn.Resume]) and sent what it held: calls waiting for the
// connection go on, and ev goes to the OnConnEvent function.
func (c *Conn) Reconnected(ev ConnEvent) {
	if p := c.down.Swap(nil); p != nil {
		close(*p)
	}
	c.ReportConnEvent(ev)
}

// callVia sends f as a new call through send.
func (c *Conn) callVia(send func(*wire.Frame) error, f *wire.Frame) (*call, error) {
	cl := c.newCall()
	f.Ref = cl.ref
	if err := c.register(cl, f); err != nil {
		f.Release()
		cl.release()
		return nil, err
	}
	if err := send(f); err != nil {
		c.unregister(cl)
		cl.release()
		return nil, err
	}
	return cl, nil
}

// await waits for a call's OK or ERROR, as roundTrip does.
func (c *Conn) await(ctx context.Context, cl *call, out any) error {
	r, err := c.next(ctx, cl)
	if err != nil {
		if c.unregister(cl) {
			cl.release()
		}
		return err
	}
	defer cl.release()
	defer r.Release()
	if r.Type == wire.TypeError {
		return &wire.Error{Code: wire.Code(r.Aux), Msg: r.Tag}
	}
	if out != nil && len(r.Body) > 0 {
		if err := json.Unmarshal(r.Body, out); err != nil {
			return fmt.Errorf("courier: bad reply: %w", err)
		}
	}
	return nil
}

// dropCalls gives up on calls a failed resume left waiting.
func (c *Conn) dropCalls(calls []*call) {
	for _, cl := range calls {
		if c.unregister(cl) {
			cl.release()
		}
	}
}

// record remembers a declaration to repeat after a reconnect.
func (c *Conn) record(name string, spec ExchangeSpec) {
	if spec.KeyFunc != nil || spec.RouteFunc != nil {
		return // embedded only: never reconnects
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.decls {
		if c.decls[i].name == name {
			if !spec.Passive {
				c.decls[i].spec = spec // the last active declaration says it all
			}
			return
		}
	}
	c.decls = append(c.decls, decl{name: name, spec: spec})
}

// forget drops a deleted exchange's declaration.
func (c *Conn) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.decls = slices.DeleteFunc(c.decls, func(d decl) bool { return d.name == name })
}

// Local event kinds, which a Conn makes itself: never from the wire.
const (
	// EventDisconnected: the Conn lost its connection; the attachment
	// is out of its group, and leads nothing, until EventReattached or
	// EventDetached. Reason says why.
	EventDisconnected EventKind = localEvents + iota
	// EventReattached: the Conn reconnected and the attachment goes
	// back into its group as its youngest member, under a new member
	// id: Member is it now, Was its id before. The server's leader and
	// member events follow, or EventDetached if it refused it.
	EventReattached
)

// localEvents is the first local event kind; the wire's kinds stay
// below it.
const localEvents = 64

// localEvent is the Waiter of an EVENT frame a Conn makes itself.
type localEvent struct {
	kind   EventKind
	was    string
	reason string
}

// local queues an event the Conn makes itself behind what the attachment
// has received. An EventDetached also ends the attachment, once it is
// delivered.
func (a *Attachment) local(kind EventKind, reason string) {
	f := wire.NewFrame(wire.TypeEvent)
	f.Name = a.exchange
	a.mu.Lock()
	f.Waiter = &localEvent{kind: kind, was: a.was, reason: reason}
	a.mu.Unlock()
	if !a.in.push(f, false) {
		f.Release()
	}
	if kind == EventDetached {
		a.c.atts.Delete(a.id) // its event stops it, after what it holds
	}
}

// interrupt takes the attachment out of its group when the connection
// is lost; see [Conn.Interrupted].
func (a *Attachment) interrupt(err error) {
	a.mu.Lock()
	if a.err != nil || !a.attached {
		a.mu.Unlock()
		return
	}
	a.was = a.member
	a.leader, a.members = "", nil
	active := a.active
	a.active = map[uint64]*Request{}
	a.mu.Unlock()
	for _, r := range active {
		r.cancelCtx()
	}
	if r := a.serving.Load(); r != nil {
		r.cancelCtx()
	}
	for _, f := range a.in.purge() {
		f.Release()
	}
	a.local(EventDisconnected, err.Error())
}

// reattachFrame is the ATTACH that puts the attachment back as member
// id.n, or nil if it is not to come back.
func (a *Attachment) reattachFrame(id string) *wire.Frame {
	a.mu.Lock()
	if a.err != nil || a.leaving || !a.attached {
		a.mu.Unlock()
		return nil
	}
	a.member = fmt.Sprintf("%s.%d", id, a.id)
	a.leader, a.members = "", nil
	spec := a.cfg.spec
	if a.role == wire.RoleSubscriber || a.role == wire.RoleController {
		spec.Patterns = a.patterns
	}
	a.mu.Unlock()
	// Nothing the lost connection sent may be served from now on, even
	// to an attachment that joined as it was lost.
	for _, f := range a.in.purge() {
		f.Release()
	}
	f := wire.NewFrame(wire.TypeAttach)
	f.Attach, f.Name, f.Aux, f.Tag = a.id, a.exchange, a.role, a.cfg.serviceTag
	f.Body, _ = json.Marshal(spec)
	return f
}

// reattached records the broker's answer to a re-attach.
func (a *Attachment) reattached(res wire.AttachResult) {
	a.mu.Lock()
	if res.Member != "" {
		a.member = res.Member
	}
	a.patterns = res.Patterns
	a.mu.Unlock()
}

// lose fails the calls in flight with err, except confirmed publishes
// and submits when resends.
func (t *callTable) lose(err error, resends bool) {
	for i := range t.shard {
		sh := &t.shard[i]
		sh.mu.Lock()
		var fns []*call
		for ref, cl := range sh.m {
			if resends && cl.resend {
				continue
			}
			delete(sh.m, ref)
			if cl.fn != nil {
				cl.err = err
				fns = append(fns, cl)
				continue
			}
			cl.fail(err)
		}
		sh.mu.Unlock()
		for _, cl := range fns {
			cl.fn(nil)
		}
	}
}

// fail ends the call with err.
func (cl *call) fail(err error) {
	cl.mu.Lock()
	cl.err = err
	cl.queue(nil)
}

// failure is the error of a call that ended without its answer.
func (c *Conn) failure(cl *call) error {
	if cl.err != nil {
		return cl.err
	}
	return c.Err()
}
