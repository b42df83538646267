package node

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
)

// otherNodes returns the nodes of nodes but not.
func otherNodes(nodes []*Node, not *Node) []*Node {
	var rest []*Node
	for _, n := range nodes {
		if n != not {
			rest = append(rest, n)
		}
	}
	return rest
}

// queueStats returns the unacked tasks and consumers of the queue name
// that n serves, -1s when it serves none.
func queueStats(n *Node, name string) (unacked, consumers int64) {
	q := n.Broker().Queue(name)
	if q == nil {
		return -1, -1
	}
	s := q.Stats()
	return s.Unacked, s.Consumers
}

// TestReplicatedQueueForwardedWorkers: with the queue led by B, tasks
// submitted on A (forwarded) are worked on C (a forwarded worker): its
// prefetch bounds what B has in flight, its acks reach B's group; then
// B stops with tasks in flight on C's worker, and the same worker, with
// nothing done by the client, receives from the new leader every
// confirmed task not acked, none with a failed attempt, each key in
// order, and a task submitted after the failover.
func TestReplicatedQueueForwardedWorkers(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	decl := nodes[0].Connect()
	if _, err := declareTasks(ctx, t, decl, "fwork"); err != nil {
		t.Fatal(err)
	}
	decl.Close()
	leader := servingNode(t, nodes, "fwork")
	rest := otherNodes(nodes, leader)
	a, c := rest[0], rest[1]
	t.Logf("leader %s, submits on %s, worker on %s", leader.cfg.Name, a.cfg.Name, c.cfg.Name)

	ac := a.Connect()
	defer ac.Close()
	aj, err := declareTasks(ctx, t, ac, "fwork")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	const keys, perKey = 3, 10
	for i := range perKey {
		for k := range keys {
			body := fmt.Sprintf("k%d-%02d", k, i)
			if _, err := aj.Submit(ctx, courier.Task{Key: fmt.Sprintf("k%d", k), Body: []byte(body)}); err != nil {
				t.Fatalf("submit %s on %s: %v", body, a.cfg.Name, err)
			}
			want[body] = true
		}
	}
	for i := range 10 {
		body := fmt.Sprintf("free-%02d", i)
		if _, err := aj.Submit(ctx, courier.Task{Body: []byte(body)}); err != nil {
			t.Fatalf("submit %s on %s: %v", body, a.cfg.Name, err)
		}
		want[body] = true
	}
	total := len(want)

	// C's worker: before the failover it acks five unkeyed tasks and
	// holds the rest it gets; after, it acks everything.
	const prefetch = 6
	var mu sync.Mutex
	acked := map[string]bool{}
	held := 0
	after := false
	got := map[string]int{}
	last := map[string]string{}
	var bad []string
	cc := c.Connect()
	defer cc.Close()
	cj, err := declareTasks(ctx, t, cc, "fwork")
	if err != nil {
		t.Fatal(err)
	}
	worker, err := cj.Work(ctx, func(j *courier.Job) error {
		mu.Lock()
		defer mu.Unlock()
		b := string(j.Body)
		if !after {
			if strings.HasPrefix(b, "free-") && len(acked) < 5 {
				acked[b] = true
				return nil
			}
			if err := j.Progress(50, "half way"); err != nil {
				bad = append(bad, fmt.Sprintf("progress of %s: %v", b, err))
			}
			held++
			j.Defer()
			return nil
		}
		got[b]++
		if j.Attempts != 0 {
			bad = append(bad, fmt.Sprintf("%s came back with %d failed attempts", b, j.Attempts))
		}
		if j.Key != "" {
			if p := last[j.Key]; p > b {
				bad = append(bad, fmt.Sprintf("key %s: %s after %s", j.Key, b, p))
			}
			last[j.Key] = b
		}
		return nil
	}, courier.Prefetch(prefetch))
	if err != nil {
		t.Fatalf("attach a worker on %s, forwarded to %s: %v", c.cfg.Name, leader.cfg.Name, err)
	}
	waitUntil(t, 60*time.Second, "five acked and the prefetch held", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) == 5 && held == prefetch
	})
	// The leader has in flight what the worker holds, no more: its
	// prefetch crossed the link.
	waitUntil(t, 30*time.Second, "the leader's queue has the prefetch in flight", func() bool {
		unacked, consumers := queueStats(leader, "fwork")
		return unacked == prefetch && consumers == 1
	})
	// The acks crossed the link and committed in the group.
	waitUntil(t, 30*time.Second, "every replica applied the acks", func() bool {
		for _, n := range nodes {
			if liveOn(n, "fwork") != total-5 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	for b := range acked {
		delete(want, b)
	}
	after = true
	mu.Unlock()

	if err := leader.Close(); err != nil {
		t.Logf("closing the leader's node: %v", err)
	}
	next := servingNode(t, rest, "fwork")
	t.Logf("new leader %s", next.cfg.Name)
	waitUntil(t, 90*time.Second, "the worker received every confirmed task not acked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for b := range want {
			if got[b] == 0 {
				return false
			}
		}
		return true
	})
	// One more, submitted on A after the failover, reaches C's worker.
	if _, err := aj.Submit(ctx, courier.Task{Body: []byte("after")}); err != nil {
		t.Fatalf("submit on %s after the failover: %v", a.cfg.Name, err)
	}
	waitUntil(t, 60*time.Second, "the task submitted after the failover worked", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["after"] == 1
	})
	select {
	case <-worker.Done():
		t.Fatalf("the worker was detached: %v", worker.Err())
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	for b := range got {
		if acked[b] {
			t.Errorf("task %s, acked before the failover, delivered again", b)
		}
	}
	for _, s := range bad {
		t.Error(s)
	}
}

// TestReplicatedQueueForwardedWorkerGone: a forwarded worker's tasks in
// flight on the leader fail as attempts when its connection ends (as a
// worker's on the leader's node), and come back without an attempt when
// its node goes away (the node's fault, not the worker's).
func TestReplicatedQueueForwardedWorkerGone(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	decl := nodes[0].Connect()
	if _, err := declareTasks(ctx, t, decl, "fgone"); err != nil {
		t.Fatal(err)
	}
	decl.Close()
	leader := servingNode(t, nodes, "fgone")
	rest := otherNodes(nodes, leader)
	a, c := rest[0], rest[1]
	lc := leader.Connect()
	defer lc.Close()
	lj, err := declareTasks(ctx, t, lc, "fgone")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := lj.Submit(ctx, courier.Task{Body: []byte(fmt.Sprintf("t%d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	// hold attaches a worker on n that holds two tasks unsettled.
	hold := func(n *Node) *courier.Conn {
		conn := n.Connect()
		j, err := declareTasks(ctx, t, conn, "fgone")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := j.Work(ctx, func(j *courier.Job) error { j.Defer(); return nil }, courier.Prefetch(2)); err != nil {
			t.Fatalf("attach on %s: %v", n.cfg.Name, err)
		}
		return conn
	}
	held := func(what string, unacked, consumers int64) {
		t.Helper()
		waitUntil(t, 60*time.Second, what, func() bool {
			u, c := queueStats(leader, "fgone")
			return u == unacked && c == consumers
		})
	}
	wa := hold(a)
	wc := hold(c)
	held("two workers from the other nodes hold two tasks each", 4, 2)

	// A's worker's connection ends: its two fail (an attempt each).
	wa.Close()
	held("A's worker gone from the leader", 2, 1)
	// C's node goes: its worker's two come back as they were.
	if err := c.Close(); err != nil {
		t.Logf("closing %s: %v", c.cfg.Name, err)
	}
	held("C's worker gone from the leader", 0, 0)
	_ = wc

	var mu sync.Mutex
	attempts := map[string]int{}
	local, err := lj.Work(ctx, func(j *courier.Job) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[string(j.Body)] = j.Attempts
		return nil
	}, courier.Prefetch(10))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "the four tasks worked on the leader", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) == 4
	})
	mu.Lock()
	defer mu.Unlock()
	failed := 0
	for b, n := range attempts {
		switch n {
		case 0:
		case 1:
			failed++
		default:
			t.Errorf("task %s: %d failed attempts", b, n)
		}
	}
	if failed != 2 {
		t.Errorf("failed attempts on %d tasks, want 2 (those of the worker whose connection ended): %v", failed, attempts)
	}
	mu.Unlock()
	if err := local.Detach(ctx); err != nil {
		t.Fatal(err)
	}

	// A forwarded worker's NACK crosses the link: with requeue the task
	// comes back with an attempt, without (a reject) it is
	// dead-lettered.
	ac := a.Connect()
	defer ac.Close()
	aj, err := declareTasks(ctx, t, ac, "fgone")
	if err != nil {
		t.Fatal(err)
	}
	before := leader.Broker().Queue("fgone").Stats()
	if _, err := aj.Submit(ctx, courier.Task{Body: []byte("nack-me")}); err != nil {
		t.Fatal(err)
	}
	if _, err := aj.Submit(ctx, courier.Task{Body: []byte("reject-me")}); err != nil {
		t.Fatal(err)
	}
	nacked := make(chan int, 4)
	w, err := aj.Work(ctx, func(j *courier.Job) error {
		switch {
		case string(j.Body) == "reject-me":
			return j.Nack(false)
		case j.Attempts == 0:
			return j.Nack(true)
		}
		nacked <- j.Attempts
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-nacked:
		if n != 1 {
			t.Errorf("the nacked task came back with %d attempts, want 1", n)
		}
	case <-ctx.Done():
		t.Fatal("the task nacked with requeue through a forwarded worker did not come back")
	}
	waitUntil(t, 30*time.Second, "the rejected task dead-lettered on the leader", func() bool {
		return leader.Broker().Queue("fgone").Stats().DeadLettered == before.DeadLettered+1
	})

	// The exchange is deleted: a forwarded worker is detached, not
	// attached again.
	if err != nil {
		t.Fatal(err)
	}
	held("A's worker on the leader", 0, 1)
	if err := lc.DeleteExchange(ctx, "fgone"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Done():
		t.Logf("detached: %v", w.Err())
	case <-ctx.Done():
		t.Fatal("the forwarded worker of a deleted exchange was not detached")
	}
	mu.Lock()
}

// moveLeader hands the leadership of the replicated queue name from
// from's replica to to's, and waits until to serves it. A transfer may
// time out on a loaded machine, and an election timeout may move the
// leadership elsewhere after a transfer (the election timeout is a
// second): then it hands it on again from where it went, until to
// serves it, for as long as ctx allows.
func moveLeader(ctx context.Context, t *testing.T, nodes []*Node, from, to *Node, name string) {
	t.Helper()
	for {
		from.replicas.mu.Lock()
		q := from.replicas.queues[name]
		from.replicas.mu.Unlock()
		if q == nil {
			t.Fatalf("%s has no replica of %s", from.cfg.Name, name)
		}
		q.gmu.Lock()
		g := q.g
		q.gmu.Unlock()
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := g.TransferLeadership(tctx, replicaID(to.cfg.Name))
		cancel()
		if err != nil && ctx.Err() == nil {
			t.Logf("transfer the leadership of %s from %s to %s: %v; again", name, from.cfg.Name, to.cfg.Name, err)
		}
		got := servingNode(t, nodes, name)
		if got == to {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s serves %s, want %s", got.cfg.Name, name, to.cfg.Name)
		}
		t.Logf("%s serves %s after a transfer to %s; again from there", got.cfg.Name, name, to.cfg.Name)
		from = got
	}
}

// TestReplicatedQueueForwardedWorkerFollowsLeader: the leadership of a
// queue moves while every node stays up (StopServing on the old leader,
// ServeReplicated on the new): a worker attached on A to the queue led
// by B follows it to C, forwarded there, then to A itself, where it
// becomes a worker of A's own queue; the client does nothing, is never
// detached, and gets every task, the unsettled ones again without a
// failed attempt.
func TestReplicatedQueueForwardedWorkerFollowsLeader(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	decl := nodes[0].Connect()
	if _, err := declareTasks(ctx, t, decl, "follow"); err != nil {
		t.Fatal(err)
	}
	decl.Close()
	b := servingNode(t, nodes, "follow")
	rest := otherNodes(nodes, b)
	a, c := rest[0], rest[1]

	ac := a.Connect()
	defer ac.Close()
	aj, err := declareTasks(ctx, t, ac, "follow")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	hold := true
	got := map[string]int{}
	var bad []string
	var jobs []*courier.Job
	worker, err := aj.Work(ctx, func(j *courier.Job) error {
		mu.Lock()
		defer mu.Unlock()
		b := string(j.Body)
		got[b]++
		if j.Attempts != 0 {
			bad = append(bad, fmt.Sprintf("%s came back with %d failed attempts", b, j.Attempts))
		}
		if hold && strings.HasPrefix(b, "held") {
			j.Defer()
			jobs = append(jobs, j)
		}
		return nil
	}, courier.Prefetch(4))
	if err != nil {
		t.Fatal(err)
	}
	submit := func(body string) {
		t.Helper()
		if _, err := aj.Submit(ctx, courier.Task{Body: []byte(body)}); err != nil {
			t.Fatalf("submit %s: %v", body, err)
		}
	}
	received := func(what string, bodies ...string) {
		t.Helper()
		waitUntil(t, 60*time.Second, what, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, b := range bodies {
				if got[b] == 0 {
					return false
				}
			}
			return true
		})
	}
	submit("held-1")
	submit("on-b")
	received("the tasks worked through B", "held-1", "on-b")
	waitUntil(t, 30*time.Second, "B has the held task in flight", func() bool {
		u, c := queueStats(b, "follow")
		return u == 1 && c == 1
	})

	// To C: the held task comes back from C, without an attempt.
	mu.Lock()
	got["held-1"] = 0
	mu.Unlock()
	moveLeader(ctx, t, nodes, b, c, "follow")
	received("the held task again, from C", "held-1")
	submit("on-c")
	received("a task through C", "on-c")
	waitUntil(t, 30*time.Second, "C has the forwarded worker", func() bool {
		_, consumers := queueStats(c, "follow")
		return consumers == 1
	})
	// To A, the worker's own node: the worker is one of A's queue's.
	mu.Lock()
	got["held-1"] = 0
	hold = false
	mu.Unlock()
	moveLeader(ctx, t, nodes, c, a, "follow")
	received("the held task again, on A", "held-1")
	submit("on-a")
	received("a task on A", "on-a")
	if _, consumers := queueStats(a, "follow"); consumers != 1 {
		t.Errorf("A's queue has %d consumers, want 1 (the worker)", consumers)
	}
	select {
	case <-worker.Done():
		t.Fatalf("the worker was detached: %v", worker.Err())
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range bad {
		t.Error(s)
	}
	// The old Job of a former leader settles harmlessly.
	for _, j := range jobs {
		_ = j.Ack()
	}
}
