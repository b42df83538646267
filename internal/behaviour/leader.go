package behaviour

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
)

// member is one member of a leader group, on a connection of its own.
type member struct {
	c  *courier.Conn
	a  *courier.Attachment
	ev *events
}

// join attaches a handler with an event log to exchange name.
func (e *env) join(name string) *member {
	e.t.Helper()
	c := e.conn()
	ex, err := c.ReqResp(e.ctx, name)
	if err != nil {
		e.t.Fatal(err)
	}
	ev := &events{}
	a, err := ex.Handle(e.ctx, whoami, courier.OnEvent(ev.fn))
	if err != nil {
		e.t.Fatal(err)
	}
	return &member{c: c, a: a, ev: ev}
}

func isKind(k courier.EventKind, id string) func(courier.Event) bool {
	return func(ev courier.Event) bool { return ev.Kind == k && ev.Member != nil && ev.Member.ID == id }
}

func leaderIs(id string) func(courier.Event) bool {
	return func(ev courier.Event) bool { return ev.Kind == courier.EventLeader && ev.Leader == id }
}

func (s *suite) testLeader(t *testing.T) {
	t.Run("Events", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.Leader)
		m1 := e.join(ex.Name())
		first := m1.ev.waitFor(t, "leader event on attach", func(courier.Event) bool { return true })
		if first.Kind != courier.EventLeader || first.Leader != m1.a.ID() || !slices.Equal(memberIDs(first.Members), []string{m1.a.ID()}) {
			t.Fatalf("first event %+v, want leader %s with members [%s]", first, m1.a.ID(), m1.a.ID())
		}
		if !first.IsLeader {
			t.Errorf("the first member's leader event says IsLeader=false")
		}
		// Member ids name their node and connection (docs/protocol.md
		// §5.3), so that they are unique across a cluster and restarts.
		if node, _, ok := strings.Cut(first.Leader, "/c"); !ok || node == "" || !strings.HasPrefix(first.Leader, m1.c.ID()+".") {
			t.Errorf("leader's member id %q, want <node>/c<number>.<attach> under its connection %q", first.Leader, m1.c.ID())
		}
		if first.Exchange != ex.Name() {
			t.Errorf("event for exchange %q, want %q", first.Exchange, ex.Name())
		}

		m2 := e.join(ex.Name())
		ev := m2.ev.waitFor(t, "leader event at m2", func(courier.Event) bool { return true })
		if ev.Kind != courier.EventLeader || ev.Leader != m1.a.ID() || ev.IsLeader {
			t.Fatalf("m2's first event %+v, want leader %s", ev, m1.a.ID())
		}
		if got, want := memberIDs(ev.Members), ids(m1.a, m2.a); !slices.Equal(got, want) {
			t.Fatalf("members %v, want %v oldest first", got, want)
		}
		up := m1.ev.waitFor(t, "member-up m2 at m1", isKind(courier.EventMemberUp, m2.a.ID()))
		if up.Leader != m1.a.ID() || !slices.Equal(memberIDs(up.Members), ids(m1.a, m2.a)) {
			t.Fatalf("member-up %+v", up)
		}

		m3 := e.join(ex.Name())
		m3.ev.waitFor(t, "leader event at m3", leaderIs(m1.a.ID()))
		for _, m := range []*member{m1, m2} {
			m.ev.waitFor(t, "member-up m3", isKind(courier.EventMemberUp, m3.a.ID()))
		}
		for _, m := range []*member{m1, m2, m3} {
			if m.a.Leader() != m1.a.ID() || !slices.Equal(memberIDs(m.a.Members()), ids(m1.a, m2.a, m3.a)) {
				t.Fatalf("%s sees leader %s and members %v", m.a.ID(), m.a.Leader(), memberIDs(m.a.Members()))
			}
		}

		// A follower leaves: member-down, the leader stays.
		if err := m2.a.Detach(e.ctx); err != nil {
			t.Fatal(err)
		}
		for _, m := range []*member{m1, m3} {
			down := m.ev.waitFor(t, "member-down m2", isKind(courier.EventMemberDown, m2.a.ID()))
			if down.Leader != m1.a.ID() || !slices.Equal(memberIDs(down.Members), ids(m1.a, m3.a)) {
				t.Fatalf("member-down at %s: %+v", m.a.ID(), down)
			}
		}
		if !m1.a.IsLeader() || m3.a.IsLeader() {
			t.Fatal("leadership changed when a follower left")
		}

		// The leader leaves: the next oldest is announced.
		if err := m1.a.Detach(e.ctx); err != nil {
			t.Fatal(err)
		}
		m3.ev.waitFor(t, "member-down m1 at m3", isKind(courier.EventMemberDown, m1.a.ID()))
		ld := m3.ev.waitFor(t, "m3 appointed", leaderIs(m3.a.ID()))
		if !ld.IsLeader || !m3.a.IsLeader() {
			t.Fatal("m3 was announced leader but does not know it")
		}
		if m1.a.IsLeader() {
			t.Error("a detached leader still says it leads")
		}
		if got := memberIDs(m3.a.Members()); !slices.Equal(got, ids(m3.a)) {
			t.Fatalf("members %v after two left", got)
		}
	})
	t.Run("ConnClose", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.Leader)
		ms := []*member{e.join(ex.Name()), e.join(ex.Name()), e.join(ex.Name())}
		testutil.WaitForf(t, wait, ms[0].a.IsLeader, "the first member leads")
		if err := ms[0].c.Close(); err != nil {
			t.Fatal(err)
		}
		testutil.Closed(t, ms[0].a.Done(), wait, "attachment of the closed connection")
		for _, m := range ms[1:] {
			m.ev.waitFor(t, "member-down of the closed leader", isKind(courier.EventMemberDown, ms[0].a.ID()))
			m.ev.waitFor(t, "new leader after conn close", leaderIs(ms[1].a.ID()))
		}
		testutil.WaitForf(t, wait, ms[1].a.IsLeader, "the second member leads")
		if ms[0].a.IsLeader() {
			t.Error("an attachment of a closed connection still says it leads")
		}
		if ms[2].a.IsLeader() {
			t.Fatal("the third member thinks it leads")
		}
		// Requests follow the new leader.
		if got := e.counts(ex, 5, courier.Message{}); got[ms[1].a.ID()] != 5 {
			t.Fatalf("requests went to %v, want the new leader %s", got, ms[1].a.ID())
		}
	})
	t.Run("AtMostOne", func(t *testing.T) {
		e := s.env(t)
		ex := e.reqresp(courier.Leader)
		const n = 6
		ms := make([]*member, n)
		for i := range ms {
			ms[i] = e.join(ex.Name())
		}
		// The sampler reads IsLeader from the newest member to the oldest.
		// Leadership only passes from older to newer members, so a correct
		// broker never shows two leaders in such a sweep, even though the
		// sweep is not atomic.
		var stop atomic.Bool
		var sweeps, violations atomic.Int64
		var bad atomic.Value
		var wg sync.WaitGroup
		wg.Go(func() {
			for !stop.Load() {
				var leaders []string
				for i := n - 1; i >= 0; i-- {
					if ms[i].a.IsLeader() {
						leaders = append(leaders, ms[i].a.ID())
					}
				}
				if len(leaders) > 1 {
					violations.Add(1)
					bad.CompareAndSwap(nil, leaders)
				}
				sweeps.Add(1)
			}
		})
		for i := 0; i < n-1; i++ {
			testutil.WaitForf(t, wait, ms[i].a.IsLeader, "member %d leads", i)
			if i%2 == 0 {
				if err := ms[i].a.Detach(e.ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				ms[i].c.Close()
			}
			for _, m := range ms[i+1:] {
				m.ev.waitFor(t, "leader announced", leaderIs(ms[i+1].a.ID()))
			}
		}
		testutil.WaitForf(t, wait, ms[n-1].a.IsLeader, "the last member leads")
		testutil.WaitFor(t, wait, func() bool { return sweeps.Load() > 100 })
		stop.Store(true)
		wg.Wait()
		if v := violations.Load(); v > 0 {
			t.Fatalf("%d of %d sweeps saw several leaders, e.g. %v", v, sweeps.Load(), bad.Load())
		}
	})
}
