package broker

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/wire"
)

// funBroker returns a broker with a fun exchange "fun" routing by src,
// and a requester session whose last frame received is kept.
func funBroker(t *testing.T, cfg Config, src string) (*Broker, *Session, *holdSink) {
	t.Helper()
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	b := New(cfg)
	t.Cleanup(func() { b.Close() })
	body, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: Fun, RouteExpr: src})
	sink := &holdSink{}
	req := b.Open(sink, "requester")
	req.Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "fun", Body: body})
	if f := sink.last; f == nil || f.Type != wire.TypeOK {
		t.Fatalf("declare: %+v", f)
	}
	sink.last.Release()
	sink.last = nil
	return b, req, sink
}

// TestExprMembersNotBuiltPerRequest: the members variable an expression
// sees is built once per set of handlers, not on each request. Before,
// every request built it (about 480 bytes a member: the wire.Member slice
// and a CEL map each) outside any cost limit, so that one user's 16,384
// handlers made each request of any connection allocate 7.5 MiB.
func TestExprMembersNotBuiltPerRequest(t *testing.T) {
	b, req, sink := funBroker(t, Config{}, `size(members) > 0 ? null : null`)
	const handlers = 512
	h := b.Open(dropSink{}, "handlers")
	for i := range uint32(handlers) {
		h.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: uint64(i + 1), Attach: i + 1, Name: "fun", Aux: wire.RoleHandler})
	}
	if n := len(b.Exchange("fun").view.Load().all.members); n != handlers {
		t.Fatalf("%d handlers attached, want %d", n, handlers)
	}
	send := func(id uint64) {
		f := wire.NewFrame(wire.TypeRequest)
		f.Ref, f.Name = id, "fun"
		req.Handle(f)
		if sink.last != nil {
			t.Fatalf("request %d: %+v %s", id, sink.last, sink.last.Body)
		}
	}
	send(1) // builds what is built once per set of handlers
	const requests = 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range uint64(requests) {
		send(i + 2)
	}
	runtime.ReadMemStats(&after)
	// A request's own allocations (its frame, its entry in flight) are
	// under 2 KiB; the members were 480 bytes each.
	per := (after.TotalAlloc - before.TotalAlloc) / requests
	t.Logf("%d bytes a request with %d handlers", per, handlers)
	if per > 16<<10 {
		t.Fatalf("each request allocated %d bytes with %d handlers: the members are built per request", per, handlers)
	}
}

// TestExprSlotsFairBetweenUsers: a user's costly evaluations wait for an
// evaluation slot behind each other, not in front of another user's.
// With one slot, one of "evil"'s evaluations holds it while three more,
// from three other connections of the same user, wait; then "good"
// asks. Before, the slot went in arrival order, so good came after every
// evil evaluation in line (and, with enough connections looping, after
// 1 s, code 27); now it comes next.
func TestExprSlotsFairBetweenUsers(t *testing.T) {
	b, _, _ := funBroker(t, Config{ExprSlots: 1}, `members.exists(m, m.id == key) ? null : null`)
	b.slotWait = time.Minute // the test waits for the line to form
	b.Open(dropSink{}, "handler").Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "fun", Aux: wire.RoleHandler})

	var mu sync.Mutex
	var order []string
	holding, release := make(chan struct{}), make(chan struct{})
	testHookSlotTaken = func(o slotOwner) {
		mu.Lock()
		order = append(order, o.user)
		first := len(order) == 1
		mu.Unlock()
		if first {
			close(holding)
			<-release
		}
	}
	defer func() { testHookSlotTaken = nil }()

	var wg sync.WaitGroup
	request := func(user string, n int) {
		s := b.OpenAs(dropSink{}, fmt.Sprint(user, n), user, nil)
		wg.Go(func() {
			f := wire.NewFrame(wire.TypeRequest)
			f.Ref, f.Name, f.Key = 1, "fun", "k"
			s.Handle(f)
		})
	}
	waiters := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); b.slotWaiters.Load() != n; {
			if time.Now().After(deadline) {
				t.Fatalf("%d evaluations wait for a slot, want %d", b.slotWaiters.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	request("evil", 0)
	<-holding
	for i := range 3 {
		request("evil", i+1)
		waiters(int64(i + 1))
	}
	request("good", 0)
	waiters(4)
	close(release)
	wg.Wait()
	if want := []string{"evil", "good", "evil", "evil", "evil"}; !slices.Equal(order, want) {
		t.Fatalf("slots taken in the order %v, want %v", order, want)
	}
	if n := len(b.shares); n != 0 {
		t.Fatalf("%d shares left after every evaluation ended", n)
	}
}
