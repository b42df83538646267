package behaviour

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
)

// testReqResp covers request-response with every strategy.
func (s *suite) testReqResp(t *testing.T) {
	t.Run("Broadcast", s.testBroadcast)
	t.Run("RoundRobin", s.testRoundRobin)
	t.Run("Leader", s.testLeaderStrategy)
	t.Run("LeaderRoundRobin", s.testLeaderRoundRobin)
	t.Run("Sticky", s.testSticky)
	t.Run("StickyFunExpr", s.testStickyFunExpr)
	t.Run("StickyFunGo", s.testStickyFunGo)
	t.Run("Fun", s.testFun)
	t.Run("LeastBusy", s.testLeastBusy)
}

func (s *suite) testBroadcast(t *testing.T) {
	e := s.env(t)
	ex := e.reqresp() // broadcast is the default
	if ex.Strategy() != courier.Broadcast {
		t.Fatalf("default strategy %q, want %q", ex.Strategy(), courier.Broadcast)
	}
	hs := e.handlers(ex.Name(), 3)

	resps, err := ex.RequestAll(e.ctx, courier.Message{Body: []byte("ping")})
	if err != nil {
		t.Fatalf("RequestAll: %v", err)
	}
	if len(resps) != len(hs) {
		t.Fatalf("RequestAll got %d responses, want one per handler (%d)", len(resps), len(hs))
	}
	var from []string
	for i, r := range resps {
		if r.Err != nil {
			t.Errorf("response %d: %v", i, r.Err)
		}
		if string(r.Body) != r.From {
			t.Errorf("response %d: body %q from %q", i, r.Body, r.From)
		}
		if r.Last != (i == len(resps)-1) {
			t.Errorf("response %d of %d: Last=%v", i, len(resps), r.Last)
		}
		from = append(from, r.From)
	}
	slices.Sort(from)
	want := ids(hs...)
	slices.Sort(want)
	if !slices.Equal(from, want) {
		t.Fatalf("responses from %v, want each handler once: %v", from, want)
	}

	// Request keeps the first answer and drops the others; RequestAll
	// between them still gets every response, the one marked Last
	// arriving last (handlers answer concurrently, so this runs often).
	for i := range 300 {
		if i%3 == 2 {
			resps, err = ex.RequestAll(e.ctx, courier.Message{})
			if err != nil || len(resps) != len(hs) {
				t.Fatalf("RequestAll %d among Requests: %d responses, err %v", i, len(resps), err)
			}
			continue
		}
		r, err := ex.Request(e.ctx, courier.Message{Body: []byte("ping")})
		if err != nil {
			t.Fatalf("Request: %v", err)
		}
		if !slices.Contains(want, r.From) {
			t.Fatalf("Request answered by %q, not a handler", r.From)
		}
	}
}

func (s *suite) testRoundRobin(t *testing.T) {
	e := s.env(t)
	ex := e.reqresp(courier.RoundRobin)
	hs := e.handlers(ex.Name(), 4)
	// Handlers take turns: every window of len(hs) requests hits each
	// handler once.
	var seq []string
	for range 40 {
		seq = append(seq, e.ask(ex, courier.Message{}))
	}
	for i := 0; i+len(hs) <= len(seq); i += len(hs) {
		w := slices.Clone(seq[i : i+len(hs)])
		slices.Sort(w)
		if len(slices.Compact(w)) != len(hs) {
			t.Fatalf("requests %d..%d went to %v: not in turn", i, i+len(hs)-1, seq[i:i+len(hs)])
		}
	}
	got := map[string]int{}
	for _, id := range seq {
		got[id]++
	}
	for _, h := range hs {
		if got[h.ID()] != 10 {
			t.Fatalf("counts %v: want exactly 10 for each of %v", got, ids(hs...))
		}
	}
}

func (s *suite) testLeaderStrategy(t *testing.T) {
	e := s.env(t)
	ex := e.reqresp(courier.Leader)
	hs := e.handlers(ex.Name(), 3)
	for i, h := range hs {
		got := e.counts(ex, 10, courier.Message{})
		if got[h.ID()] != 10 {
			t.Fatalf("round %d: counts %v, want all 10 for the leader %s", i, got, h.ID())
		}
		testutil.WaitForf(t, wait, h.IsLeader, "%s knows it leads", h.ID())
		if err := h.Detach(e.ctx); err != nil {
			t.Fatalf("detach %s: %v", h.ID(), err)
		}
	}
	_, err := ex.Request(e.ctx, courier.Message{})
	mustErr(t, err, courier.ErrNoHandler, "request after every handler left")
}

func (s *suite) testLeaderRoundRobin(t *testing.T) {
	e := s.env(t)
	ex := e.reqresp(courier.LeaderRoundRobin)
	hs := e.handlers(ex.Name(), 3)
	got := e.counts(ex, 30, courier.Message{})
	for _, h := range hs {
		if got[h.ID()] != 10 {
			t.Fatalf("counts %v: want 10 for each of %v", got, ids(hs...))
		}
	}
	testutil.WaitForf(t, wait, hs[0].IsLeader, "the first handler leads")
	for _, h := range hs[1:] {
		if h.IsLeader() {
			t.Fatalf("%s thinks it leads; the leader is %s", h.ID(), hs[0].ID())
		}
		if h.Leader() != hs[0].ID() {
			t.Fatalf("%s sees leader %q, want %s", h.ID(), h.Leader(), hs[0].ID())
		}
	}
	// The group loses its leader but still shares requests.
	if err := hs[0].Detach(e.ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForf(t, wait, hs[1].IsLeader, "the second handler leads after the first left")
	got = e.counts(ex, 20, courier.Message{})
	if got[hs[1].ID()] != 10 || got[hs[2].ID()] != 10 {
		t.Fatalf("counts after the leader left %v: want 10 each for %v", got, ids(hs[1:]...))
	}
}

// owners sends one request per key and returns who answered each.
func (e *env) owners(ex *courier.ReqResp, keys []string, msg func(key string) courier.Message) map[string]string {
	e.t.Helper()
	out := make([]string, len(keys))
	var wg sync.WaitGroup
	var failed atomic.Value
	var next atomic.Int64
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(keys) {
					return
				}
				r, err := ex.Request(e.ctx, msg(keys[i]))
				if err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				out[i] = r.From
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		e.t.Fatalf("request: %v", err)
	}
	m := make(map[string]string, len(keys))
	for i, k := range keys {
		m[k] = out[i]
	}
	return m
}

func (s *suite) testSticky(t *testing.T) {
	e := s.env(t)
	ex := e.reqresp(courier.Sticky)
	hs := e.handlers(ex.Name(), 5)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
	}
	byKey := func(k string) courier.Message { return courier.Message{Key: k} }

	before := e.owners(ex, keys, byKey)
	share := map[string]int{}
	for _, o := range before {
		share[o]++
	}
	for _, h := range hs {
		// 200 keys each on average; 128 virtual nodes keep it near that.
		if share[h.ID()] < 50 {
			t.Fatalf("handler %s owns %d of %d keys: the ring is lopsided (%v)", h.ID(), share[h.ID()], len(keys), share)
		}
	}
	if again := e.owners(ex, keys, byKey); !maps.Equal(before, again) {
		t.Fatal("the same keys went to other handlers the second time")
	}

	gone := hs[2]
	if err := gone.Detach(e.ctx); err != nil {
		t.Fatal(err)
	}
	after := e.owners(ex, keys, byKey)
	moved := 0
	for _, k := range keys {
		switch {
		case after[k] == gone.ID():
			t.Fatalf("key %s still went to the detached handler", k)
		case before[k] == gone.ID():
			moved++
		case after[k] != before[k]:
			t.Fatalf("key %s moved from %s to %s although its handler stayed", k, before[k], after[k])
		}
	}
	if moved != share[gone.ID()] {
		t.Fatalf("%d keys moved, want the %d of the detached handler", moved, share[gone.ID()])
	}
}

// checkStickyUsers sends requests for 50 users, five each under changing
// keys, and checks that one user always reaches one handler while the
// users spread over more than one handler.
func (e *env) checkStickyUsers(ex *courier.ReqResp) {
	e.t.Helper()
	var keys []string
	for u := range 50 {
		for k := range 5 {
			keys = append(keys, fmt.Sprintf("u%d/%d", u, k))
		}
	}
	owners := e.owners(ex, keys, func(k string) courier.Message {
		user, _, _ := strings.Cut(k, "/")
		// The Key changes every time; only the header names the user.
		return courier.Message{Key: k, Header: map[string]string{"user": user}}
	})
	byUser := map[string]string{}
	used := map[string]bool{}
	for _, k := range keys {
		user, _, _ := strings.Cut(k, "/")
		if o, ok := byUser[user]; ok && o != owners[k] {
			e.t.Fatalf("user %s went to %s and to %s", user, o, owners[k])
		}
		byUser[user] = owners[k]
		used[owners[k]] = true
	}
	if len(used) < 2 {
		e.t.Fatalf("50 users all went to %v: the key function is not spreading", used)
	}
}

func (s *suite) testStickyFunExpr(t *testing.T) {
	e := s.env(t)
	ex := e.reqresp(courier.KeyExpr(`headers["user"]`))
	if ex.Strategy() != courier.StickyFun {
		t.Fatalf("strategy %q, want %q", ex.Strategy(), courier.StickyFun)
	}
	e.handlers(ex.Name(), 3)
	e.checkStickyUsers(ex)
}

func (s *suite) testStickyFunGo(t *testing.T) {
	e := s.env(t)
	var calls atomic.Int64
	keyFn := func(in *courier.RouteInput) string {
		calls.Add(1)
		return in.Header["user"]
	}
	name := e.name()
	ex, err := e.c.ReqResp(e.ctx, name, courier.WithKeyFunc(keyFn))
	if errors.Is(err, courier.ErrBadOptions) {
		t.Skipf("Go key functions need an embedded node: %v", err)
	}
	if err != nil {
		t.Fatalf("declare with a key func: %v", err)
	}
	e.deleteLater(name)
	e.handlers(name, 3)
	e.checkStickyUsers(ex)
	if calls.Load() < 250 {
		t.Fatalf("the key function ran %d times for 250 requests", calls.Load())
	}
}

func (s *suite) testFun(t *testing.T) {
	t.Run("PickByTag", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RouteExpr(`{"tag": headers["region"]}`))
		eu := e.handlers(ex.Name(), 2, courier.ServiceTag("eu"))
		us := e.handlers(ex.Name(), 1, courier.ServiceTag("us"))
		region := func(r string) courier.Message { return courier.Message{Header: map[string]string{"region": r}} }
		got := e.counts(ex, 10, region("eu"))
		if got[eu[0].ID()] != 5 || got[eu[1].ID()] != 5 {
			t.Fatalf("eu requests went to %v, want 5 each for %v", got, ids(eu...))
		}
		got = e.counts(ex, 3, region("us"))
		if got[us[0].ID()] != 3 {
			t.Fatalf("us requests went to %v, want all to %s", got, us[0].ID())
		}
		_, err := ex.Request(e.ctx, region("asia"))
		mustErr(t, err, courier.ErrNoHandler, "route to a tag with no handler")
	})
	t.Run("PickMember", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RouteExpr(`members[size(members)-1].id`))
		hs := e.handlers(ex.Name(), 3)
		got := e.counts(ex, 5, courier.Message{})
		if got[hs[2].ID()] != 5 {
			t.Fatalf("counts %v, want all to the newest member %s", got, hs[2].ID())
		}
	})
	t.Run("Redirect", func(t *testing.T) {
		e := s.env(t)
		target := e.reqresp(courier.RoundRobin)
		th := e.handlers(target.Name(), 1)
		ex := e.reqresp(courier.RouteExpr(fmt.Sprintf(`"to" in headers && headers["to"] == "other" ? {"redirect": %q} : null`, target.Name())))
		own := e.handlers(ex.Name(), 1)
		if got := e.ask(ex, courier.Message{Header: map[string]string{"to": "other"}}); got != th[0].ID() {
			t.Fatalf("redirected request answered by %s, want %s of %s", got, th[0].ID(), target.Name())
		}
		if got := e.ask(ex, courier.Message{}); got != own[0].ID() {
			t.Fatalf("plain request answered by %s, want %s", got, own[0].ID())
		}
	})
	t.Run("RedirectLoop", func(t *testing.T) {
		e := s.env(t)
		name := e.name()
		ex, err := e.c.ReqResp(e.ctx, name, courier.RouteExpr(fmt.Sprintf(`{"redirect": %q}`, name)))
		if err != nil {
			t.Fatal(err)
		}
		e.deleteLater(name)
		e.handlers(name, 1)
		_, err = ex.Request(e.ctx, courier.Message{})
		mustErr(t, err, courier.ErrRejected, "request that redirects to itself")
	})
	t.Run("Reject", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RouteExpr(`"deny" in headers ? {"reject": "denied: " + headers["deny"]} : null`))
		e.handlers(ex.Name(), 1)
		_, err := ex.Request(e.ctx, courier.Message{Header: map[string]string{"deny": "over quota"}})
		mustErr(t, err, courier.ErrRejected, "rejected request")
		if !strings.Contains(err.Error(), "denied: over quota") {
			t.Fatalf("rejection %q does not carry the reason %q", err, "denied: over quota")
		}
		if _, err := ex.Request(e.ctx, courier.Message{}); err != nil {
			t.Fatalf("request the route lets through: %v", err)
		}
	})
	t.Run("Rewrite", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.RouteExpr(`{"key": "rw-" + key, "headers": {"user": headers["user"].upperAscii(), "via": "route"}}`))
		type seen struct {
			key    string
			header map[string]string
		}
		got := make(chan seen, 1)
		e.handle(ex.Name(), func(r *courier.Request) {
			got <- seen{r.Key(), maps.Clone(r.Header())}
			r.Reply(nil)
		})
		_, err := ex.Request(e.ctx, courier.Message{Key: "k1", Header: map[string]string{"user": "alice"}})
		if err != nil {
			t.Fatal(err)
		}
		sn := testutil.Recv(t, got, wait)
		if sn.key != "rw-k1" {
			t.Errorf("handler saw key %q, want the rewritten %q", sn.key, "rw-k1")
		}
		if want := map[string]string{"user": "ALICE", "via": "route"}; !maps.Equal(sn.header, want) {
			t.Errorf("handler saw headers %v, want the rewritten %v", sn.header, want)
		}
	})
	t.Run("GoFunc", func(t *testing.T) {
		e := s.env(t)
		route := func(in *courier.RouteInput) (courier.Route, error) {
			switch in.Key {
			case "reject":
				return courier.Route{Reject: "go says no"}, nil
			case "fail":
				return courier.Route{}, errors.New("route broke")
			case "last":
				return courier.Route{Member: in.Members[len(in.Members)-1].ID}, nil
			}
			return courier.Route{}, nil
		}
		name := e.name()
		ex, err := e.c.ReqResp(e.ctx, name, courier.WithRouteFunc(route))
		if errors.Is(err, courier.ErrBadOptions) {
			t.Skipf("Go routing functions need an embedded node: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		e.deleteLater(name)
		hs := e.handlers(name, 2)
		_, err = ex.Request(e.ctx, courier.Message{Key: "reject"})
		mustErr(t, err, courier.ErrRejected, "rejected by a Go route")
		if !strings.Contains(err.Error(), "go says no") {
			t.Fatalf("rejection %q lacks the reason", err)
		}
		_, err = ex.Request(e.ctx, courier.Message{Key: "fail"})
		mustErr(t, err, courier.ErrRejected, "route function that failed")
		if got := e.ask(ex, courier.Message{Key: "last"}); got != hs[1].ID() {
			t.Fatalf("picked %s, want %s", got, hs[1].ID())
		}
	})
}

func (s *suite) testLeastBusy(t *testing.T) {
	e := s.env(t)
	ex := e.reqresp(courier.LeastBusy)
	held := make(chan *courier.Request, 2)
	fn := func(r *courier.Request) {
		if string(r.Body()) == "hold" {
			held <- r // answered later, by the test
			return
		}
		whoami(r)
	}
	hs := []*courier.Attachment{e.handle(ex.Name(), fn), e.handle(ex.Name(), fn)}

	out := make(chan *courier.Response, 1)
	if err := ex.Go(e.ctx, courier.Message{Body: []byte("hold")}, "held", out); err != nil {
		t.Fatal(err)
	}
	r := testutil.Recv(t, held, wait)
	busy := r.Attachment().ID()
	idle := hs[0].ID()
	if busy == idle {
		idle = hs[1].ID()
	}
	// While one handler holds a request, every request goes to the other.
	if got := e.counts(ex, 10, courier.Message{}); got[idle] != 10 {
		t.Fatalf("with %s busy, requests went to %v; want all 10 to %s", busy, got, idle)
	}
	r.Reply([]byte(busy))
	if resp := testutil.Recv(t, out, wait); resp.Err != nil || resp.Tag != "held" || resp.From != busy {
		t.Fatalf("held request's response: %+v", resp)
	}
	// Both idle again: they share the load.
	got := e.counts(ex, 10, courier.Message{})
	if got[hs[0].ID()] == 0 || got[hs[1].ID()] == 0 {
		t.Fatalf("with both idle, requests went to %v; want both used", got)
	}
}
