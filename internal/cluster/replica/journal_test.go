package replica

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
)

// journalCluster is 3 hosts with a queue journal group.
type journalCluster struct {
	cfg    Config
	net    *MemNetwork
	fss    map[uint64]*store.MemFS
	hosts  map[uint64]*Host
	groups map[uint64]*Group
	states map[uint64]*JournalState
}

func newJournalCluster(t *testing.T) *journalCluster {
	t.Helper()
	return newJournalClusterConfig(t, testConfig())
}

func newJournalClusterConfig(t *testing.T, cfg Config) *journalCluster {
	t.Helper()
	c := &journalCluster{cfg: cfg, net: NewMemNetwork(), fss: map[uint64]*store.MemFS{}, hosts: map[uint64]*Host{}, groups: map[uint64]*Group{}, states: map[uint64]*JournalState{}}
	for _, id := range []uint64{1, 2, 3} {
		c.fss[id] = store.NewMemFS()
		c.start(t, id)
	}
	return c
}

// start opens host id from its MemFS and its replica of the journal.
func (c *journalCluster) start(t *testing.T, id uint64) {
	t.Helper()
	cfg := c.cfg
	cfg.ID, cfg.Transport = id, c.net.Transport(id)
	h, err := NewHost(c.fss[id], "/data", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	c.states[id] = NewJournalState()
	g, err := h.Group(testGroup, []uint64{1, 2, 3}, c.states[id])
	if err != nil {
		t.Fatal(err)
	}
	c.hosts[id], c.groups[id] = h, g
}

// powerCut crashes every host: each disk keeps what was synced.
func (c *journalCluster) powerCut() {
	for id, h := range c.hosts {
		c.net.Remove(id)
		disk := c.fss[id].Crash(nil)
		_ = h.Close()
		c.fss[id] = disk
	}
}

// leaderQueue waits for a leader ready to serve and recovers the queue
// on it from its replicated journal.
func (c *journalCluster) leaderQueue(t *testing.T, sched *queue.Scheduler) (uint64, *queue.Queue) {
	t.Helper()
	var lead uint64
	testutil.WaitForf(t, wait, func() bool {
		for id, g := range c.groups {
			ctx, cancel := context.WithTimeout(context.Background(), 100*1e6)
			err := g.WaitLeaderReady(ctx)
			cancel()
			if err == nil {
				lead = id
				return true
			}
		}
		return false
	}, "a leader ready to serve")
	cfg := queue.DefaultConfig()
	cfg.Scheduler = sched
	cfg.Journal = NewJournal(c.groups[lead], c.states[lead])
	q, err := queue.Recover("tasks", cfg, c.states[lead].Replay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	return lead, q
}

// TestJournalFailover submits tasks with confirms on the leader's queue,
// acks some and leaves some in flight, kills the leader, and checks that
// the new leader's queue, rebuilt from its replica with queue.Recover,
// delivers every confirmed task that was not acked, the in-flight ones
// without a failed attempt.
func TestJournalFailover(t *testing.T) {
	sched := queue.NewScheduler(queue.SchedulerOptions{})
	defer sched.Close()
	c := newJournalCluster(t)
	lead, q := c.leaderQueue(t, sched)

	const n = 50
	var confirmed sync.Map // body -> true
	var nconf atomic.Int32
	for i := range n {
		body := fmt.Sprintf("task-%d", i)
		if _, err := q.Enqueue(queue.Message{Body: []byte(body)}, func(err error) {
			if err == nil {
				confirmed.Store(body, true)
				nconf.Add(1)
			}
		}, nil); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitForf(t, wait, func() bool { return nconf.Load() == n }, "%d confirms", n)

	// A worker takes 10, acks 5; 5 stay in flight.
	inbox := make(chan queue.Delivery, n)
	w, err := q.AddConsumer("w1", queue.ConsumerConfig{Prefetch: 10, Deliver: func(d queue.Delivery) { inbox <- d }})
	if err != nil {
		t.Fatal(err)
	}
	acked := map[uint64]bool{} // ids: the same on every replica
	for i := range 10 {
		d := <-inbox
		if i < 5 {
			if err := q.Ack(w, d.ID); err != nil {
				t.Fatal(err)
			}
			acked[d.ID] = true
		}
	}
	// The acks' releases are committed: every replica has n-5 live records.
	for id, st := range c.states {
		testutil.WaitForf(t, wait, func() bool { return st.Live() == n-5 }, "replica %d releases the acked", id)
	}

	// Kill the leader's node.
	c.net.Remove(lead)
	_ = c.hosts[lead].Close()
	delete(c.groups, lead)
	delete(c.states, lead)

	newLead, q2 := c.leaderQueue(t, sched)
	if newLead == lead {
		t.Fatal("the dead node leads")
	}
	inbox2 := make(chan queue.Delivery, n)
	if _, err := q2.AddConsumer("w2", queue.ConsumerConfig{Prefetch: n, Deliver: func(d queue.Delivery) { inbox2 <- d }}); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]bool{}
	for range n - 5 {
		d := <-inbox2
		if _, ok := confirmed.Load(string(d.Body)); !ok {
			t.Fatalf("delivered %d %q, not a confirmed task", d.ID, d.Body)
		}
		if acked[d.ID] {
			t.Fatalf("acked task %d delivered again", d.ID)
		}
		if d.Attempts != 0 {
			t.Fatalf("task %d comes back with %d failed attempts", d.ID, d.Attempts)
		}
		got[d.ID] = true
	}
	if len(got) != n-5 {
		t.Fatalf("%d distinct tasks delivered, want %d", len(got), n-5)
	}
	// The new leader's queue appends on: a new task is confirmed.
	done := make(chan error, 1)
	if _, err := q2.Enqueue(queue.Message{Body: []byte("after")}, func(err error) { done <- err }, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("confirm on the new leader: %v", err)
	}
}

// TestJournalKillDuringSubmits kills the leader while tasks are being
// submitted: every task confirmed before the kill is delivered by the
// new leader (unconfirmed ones may or may not be).
func TestJournalKillDuringSubmits(t *testing.T) {
	sched := queue.NewScheduler(queue.SchedulerOptions{})
	defer sched.Close()
	c := newJournalCluster(t)
	lead, q := c.leaderQueue(t, sched)

	var mu sync.Mutex
	confirmed := map[string]bool{}
	const n = 300
	for i := range n {
		body := fmt.Sprintf("task-%d", i)
		if _, err := q.Enqueue(queue.Message{Body: []byte(body)}, func(err error) {
			if err == nil {
				mu.Lock()
				confirmed[body] = true
				mu.Unlock()
			}
		}, nil); err != nil {
			t.Fatal(err)
		}
		switch i {
		case n / 4:
			testutil.WaitForf(t, wait, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(confirmed) > 0
			}, "some confirms")
		case n / 2:
			c.net.Remove(lead) // the leader's node dies with submits in flight
		}
	}
	_ = c.hosts[lead].Close()
	mu.Lock()
	before := make(map[string]bool, len(confirmed))
	for b := range confirmed {
		before[b] = true
	}
	mu.Unlock()
	delete(c.groups, lead)
	delete(c.states, lead)

	_, q2 := c.leaderQueue(t, sched)
	inbox := make(chan queue.Delivery, n)
	if _, err := q2.AddConsumer("w", queue.ConsumerConfig{Prefetch: n, Deliver: func(d queue.Delivery) { inbox <- d }}); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	testutil.WaitForf(t, wait, func() bool {
		for {
			select {
			case d := <-inbox:
				got[string(d.Body)] = true
			default:
				for b := range before {
					if !got[b] {
						return false
					}
				}
				return true
			}
		}
	}, "every task confirmed before the kill is delivered (%d confirmed)", len(before))
	t.Logf("%d submitted, %d confirmed before the kill, %d delivered after", n, len(before), len(got))
}

// TestJournalPowerCut: every node loses power at once after tasks were
// confirmed; on restart, the leader's queue holds every confirmed task
// not acked.
func TestJournalPowerCut(t *testing.T) {
	sched := queue.NewScheduler(queue.SchedulerOptions{})
	defer sched.Close()
	c := newJournalCluster(t)
	_, q := c.leaderQueue(t, sched)
	const n = 40
	var nconf atomic.Int32
	for i := range n {
		if _, err := q.Enqueue(queue.Message{Body: []byte(fmt.Sprintf("task-%d", i))}, func(err error) {
			if err == nil {
				nconf.Add(1)
			}
		}, nil); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitForf(t, wait, func() bool { return nconf.Load() == n }, "%d confirms", n)
	_ = q.Close()
	c.powerCut()
	for _, id := range []uint64{1, 2, 3} {
		c.start(t, id)
	}
	_, q2 := c.leaderQueue(t, sched)
	if got := q2.Stats().Messages(); got != n {
		t.Fatalf("%d tasks after the power cut, want %d", got, n)
	}
}

// TestJournalDedupAfterFailover: the (producer, seq) of a task travels in
// its replicated enqueue record, so the new leader's queue, rebuilt from
// its replica, answers a resend of a task the old leader confirmed with
// the same task id and stores nothing.
func TestJournalDedupAfterFailover(t *testing.T) {
	sched := queue.NewScheduler(queue.SchedulerOptions{})
	defer sched.Close()
	c := newJournalCluster(t)
	lead, q := c.leaderQueue(t, sched)

	const n = 20
	ids := map[uint64]uint64{} // seq -> task id
	var nconf atomic.Int32
	for seq := uint64(1); seq <= n; seq++ {
		id, err := q.Enqueue(queue.Message{Body: fmt.Appendf(nil, "task-%d", seq), Producer: "p1", Seq: seq}, func(err error) {
			if err == nil {
				nconf.Add(1)
			}
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[seq] = id
	}
	testutil.WaitForf(t, wait, func() bool { return nconf.Load() == n }, "%d confirms", n)
	for id, st := range c.states {
		testutil.WaitForf(t, wait, func() bool { return st.Live() == n }, "replica %d has the tasks", id)
	}

	c.net.Remove(lead)
	_ = c.hosts[lead].Close()
	delete(c.groups, lead)
	delete(c.states, lead)
	_, q2 := c.leaderQueue(t, sched)

	// The producer lost its confirms with the old leader and resends.
	var resent atomic.Int32
	for seq := uint64(1); seq <= n; seq++ {
		id, err := q2.Enqueue(queue.Message{Body: fmt.Appendf(nil, "task-%d", seq), Producer: "p1", Seq: seq}, func(err error) {
			if err == nil {
				resent.Add(1)
			}
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if id != ids[seq] {
			t.Fatalf("resend of seq %d on the new leader: task %d, want %d", seq, id, ids[seq])
		}
	}
	testutil.WaitForf(t, wait, func() bool { return resent.Load() == n }, "the resends' confirms")
	if s := q2.Stats(); s.Messages() != n || s.Deduplicated != n {
		t.Fatalf("new leader: %d tasks, %d deduplicated; want %d and %d", s.Messages(), s.Deduplicated, n, n)
	}
	// A new seq is a new task.
	done := make(chan error, 1)
	id, err := q2.Enqueue(queue.Message{Body: []byte("new"), Producer: "p1", Seq: n + 1}, func(err error) { done <- err }, nil)
	if err != nil || id <= ids[n] {
		t.Fatalf("new seq: task %d, %v", id, err)
	}
	if err := testutil.Recv(t, done, wait); err != nil {
		t.Fatal(err)
	}
}
