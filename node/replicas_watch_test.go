package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestReplicatedQueueForwardedWatch: watches of a replicated queue made
// on a node that does not serve it (SubmitWatch, and Watch by id) are
// forwarded to the leader's node: the client on A gets the progress and
// completion of tasks led by B and worked on C. Stopping a watch ends
// it. When the leadership moves, a watch ends with TaskLost, the last
// event, and a new watch on A follows the task on its new leader to its
// completion. A watch made on the old leader itself ends with TaskLost
// too.
func TestReplicatedQueueForwardedWatch(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	decl := nodes[0].Connect()
	if _, err := declareTasks(ctx, t, decl, "watched"); err != nil {
		t.Fatal(err)
	}
	decl.Close()
	b := servingNode(t, nodes, "watched")
	rest := otherNodes(nodes, b)
	a, c := rest[0], rest[1]
	t.Logf("leader %s, watches on %s, worker on %s", b.cfg.Name, a.cfg.Name, c.cfg.Name)

	cc := c.Connect()
	defer cc.Close()
	cj, err := declareTasks(ctx, t, cc, "watched")
	if err != nil {
		t.Fatal(err)
	}
	jobs := make(chan *courier.Job, 16)
	if _, err := cj.Work(ctx, func(j *courier.Job) error {
		j.Defer()
		jobs <- j
		return nil
	}, courier.Prefetch(4)); err != nil {
		t.Fatal(err)
	}
	nextJob := func(body string) *courier.Job {
		t.Helper()
		for {
			j := testutil.Recv(t, jobs, 60*time.Second)
			if string(j.Body) == body {
				return j
			}
			t.Logf("worker got %s again (a redelivery); waiting for %s", j.Body, body)
		}
	}
	events := func() (chan courier.TaskEvent, func(courier.TaskEvent)) {
		ch := make(chan courier.TaskEvent, 16)
		return ch, func(ev courier.TaskEvent) { ch <- ev }
	}
	nextEvent := func(ch chan courier.TaskEvent, kind courier.TaskEventKind) courier.TaskEvent {
		t.Helper()
		ev := testutil.Recv(t, ch, 60*time.Second)
		if ev.Kind != kind {
			t.Fatalf("event %v (%+v), want %v", ev.Kind, ev, kind)
		}
		return ev
	}

	ac := a.Connect()
	defer ac.Close()
	aj, err := declareTasks(ctx, t, ac, "watched")
	if err != nil {
		t.Fatal(err)
	}

	// SubmitWatch on A: progress and completion from B.
	ch1, fn1 := events()
	w1, err := aj.SubmitWatch(ctx, courier.Task{Body: []byte("w1")}, fn1)
	if err != nil {
		t.Fatalf("SubmitWatch on %s: %v", a.cfg.Name, err)
	}
	j := nextJob("w1")
	if err := j.Progress(40, "under way"); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(ch1, courier.TaskProgress); ev.Percent != 40 || ev.Text != "under way" || ev.ID != w1.ID() {
		t.Fatalf("progress %+v", ev)
	}
	if err := j.Ack(); err != nil {
		t.Fatal(err)
	}
	nextEvent(ch1, courier.TaskCompleted)
	if ev, err := w1.Wait(ctx); err != nil || ev.Kind != courier.TaskCompleted {
		t.Fatalf("Wait: %v, %v", ev.Kind, err)
	}

	// Watch by id on A, then Stop: it ends.
	id, err := aj.Submit(ctx, courier.Task{Body: []byte("w2")})
	if err != nil {
		t.Fatal(err)
	}
	j = nextJob("w2")
	ch2, fn2 := events()
	w2, err := aj.Watch(ctx, id, fn2)
	if err != nil {
		t.Fatalf("Watch on %s: %v", a.cfg.Name, err)
	}
	if err := j.Progress(10, "one"); err != nil {
		t.Fatal(err)
	}
	nextEvent(ch2, courier.TaskProgress)
	w2.Stop()
	testutil.Closed(t, w2.Done(), 10*time.Second, "the stopped watch")

	// A watch across a leadership move ends with TaskLost; a new one
	// follows the task on its new leader.
	ch3, fn3 := events()
	w3, err := aj.Watch(ctx, id, fn3)
	if err != nil {
		t.Fatalf("Watch again on %s: %v", a.cfg.Name, err)
	}
	bc := b.Connect() // and one on the leader itself
	defer bc.Close()
	bj, err := declareTasks(ctx, t, bc, "watched")
	if err != nil {
		t.Fatal(err)
	}
	chb, fnb := events()
	if _, err := bj.Watch(ctx, id, fnb); err != nil {
		t.Fatalf("Watch on the leader %s: %v", b.cfg.Name, err)
	}
	moveLeader(ctx, t, nodes, b, c, "watched")
	if ev := nextEvent(chb, courier.TaskLost); ev.ID != id {
		t.Fatalf("the leader's own watch lost %+v", ev)
	}
	lost := nextEvent(ch3, courier.TaskLost)
	if lost.ID != id || lost.Reason == "" || !lost.Last() {
		t.Fatalf("lost event %+v", lost)
	}
	testutil.Closed(t, w3.Done(), 10*time.Second, "the watch that lost its leader")
	j = nextJob("w2") // back from the new leader, C
	ch4, fn4 := events()
	var w4 *courier.TaskWatch
	waitUntil(t, 60*time.Second, "a watch on the new leader", func() bool {
		w4, err = aj.Watch(ctx, id, fn4)
		if err != nil {
			t.Logf("watch on %s after the move: %v", a.cfg.Name, err)
		}
		return err == nil
	})
	if err := j.Ack(); err != nil {
		t.Fatal(err)
	}
	nextEvent(ch4, courier.TaskCompleted)
	if ev, err := w4.Wait(ctx); err != nil || ev.Kind != courier.TaskCompleted {
		t.Fatalf("Wait: %v, %v", ev.Kind, err)
	}
}

// TestReplicatedQueueHandOverOnShutdown: a node that shuts down
// gracefully hands the leadership of the replicated queues it leads
// over first: when Shutdown returns, another replica leads already (no
// election timeout to wait for), another node serves the queue, and
// every task confirmed before is there.
func TestReplicatedQueueHandOverOnShutdown(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	decl := nodes[0].Connect()
	if _, err := declareTasks(ctx, t, decl, "handed"); err != nil {
		t.Fatal(err)
	}
	decl.Close()
	b := servingNode(t, nodes, "handed")
	rest := otherNodes(nodes, b)
	ac := rest[0].Connect()
	defer ac.Close()
	aj, err := declareTasks(ctx, t, ac, "handed")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := aj.Submit(ctx, courier.Task{Body: fmt.Appendf(nil, "t%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	leaders := 0
	for _, n := range rest {
		n.replicas.mu.Lock()
		q := n.replicas.queues["handed"]
		n.replicas.mu.Unlock()
		q.gmu.Lock()
		g := q.g
		q.gmu.Unlock()
		if st, err := g.Status(); err == nil && st.Role == "leader" {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d replicas lead right after %s's Shutdown returned, want 1 (handed over)", leaders, b.cfg.Name)
	}
	servingNode(t, rest, "handed")
	got := make(chan string, 8)
	if _, err := aj.Work(ctx, func(j *courier.Job) error { got <- string(j.Body); return nil }); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < 5 {
		seen[testutil.Recv(t, got, 60*time.Second)] = true
	}
}
