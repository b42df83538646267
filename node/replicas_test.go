package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/wire"
)

// startCluster3Live is startCluster3, waiting also until every node
// has a live record in the liveness table, which placement counts.
func startCluster3Live(t *testing.T) []*Node {
	t.Helper()
	nodes := startCluster3(t)
	waitUntil(t, 30*time.Second, "three live nodes in the liveness table", func() bool {
		live := 0
		for _, l := range nodes[0].Meta().Nodes() {
			if !l.Expired {
				live++
			}
		}
		return live == 3
	})
	return nodes
}

// servingNode waits until exactly one node of nodes serves the
// replicated queue name, and that the metadata names it as its home on
// every node, and returns it.
func servingNode(t *testing.T, nodes []*Node, name string) *Node {
	t.Helper()
	var leader *Node
	waitUntil(t, 60*time.Second, "one node serves "+name+" and every node knows it", func() bool {
		leader = nil
		for _, n := range nodes {
			if n.Broker().Exchange(name) != nil {
				if leader != nil {
					return false
				}
				leader = n
			}
		}
		if leader == nil {
			return false
		}
		for _, n := range nodes {
			if ex, ok := n.Meta().Exchange(name); !ok || ex.Home != leader.cfg.Name || ex.LeaderTerm == 0 {
				return false
			}
		}
		return true
	})
	return leader
}

// declareTasks declares a task exchange through c, again while the
// cluster answers code 29 for want of a metadata quorum or a queue
// leader (a loaded machine loses leaders; a user retries code 29 too).
func declareTasks(ctx context.Context, t *testing.T, c *courier.Conn, name string, opts ...courier.ExchangeOption) (*courier.Tasks, error) {
	t.Helper()
	for {
		tk, err := c.Tasks(ctx, name, opts...)
		if wireCode(err) != wire.CodeUnavailable || strings.Contains(err.Error(), "live nodes") || ctx.Err() != nil {
			return tk, err
		}
		t.Logf("declare %s: %v; again", name, err)
		time.Sleep(100 * time.Millisecond)
	}
}

// liveOn returns the live records of the replicated queue name in n's
// replica, -1 while n has not opened its group.
func liveOn(n *Node, name string) int {
	n.replicas.mu.Lock()
	q := n.replicas.queues[name]
	n.replicas.mu.Unlock()
	if q == nil {
		return -1
	}
	q.gmu.Lock()
	defer q.gmu.Unlock()
	if q.st == nil {
		return -1
	}
	return q.st.Live()
}

func wireCode(err error) wire.Code {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code
	}
	return 0
}

// TestReplicatedQueuePlaced: in a cluster of three, a durable task
// exchange declared on any node is placed by the metadata group on three
// replicas by default (Replicas(2) on two, Replicas(5) refused), each
// replica node opens its group, the group's leader's node serves it and
// records itself as its home; a submit there is confirmed, a submit on a
// node that does not serve it is refused with CodeUnavailable naming the
// leader; deleting the exchange closes the groups and stops serving.
func TestReplicatedQueuePlaced(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	conn := nodes[1].Connect()
	defer conn.Close()
	jobs, err := declareTasks(ctx, t, conn, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	if got := jobs.Info().Replicas; got != 3 {
		t.Fatalf("default replicas in a cluster of 3: %d", got)
	}
	ex, _ := nodes[0].Meta().Exchange("jobs")
	if len(ex.ReplicaNodes()) != 3 || ex.Group == 0 {
		t.Fatalf("jobs placed as %+v", ex)
	}
	waitUntil(t, 30*time.Second, "every node opened the group of jobs", func() bool {
		for _, n := range nodes {
			if n.replicas.group("jobs") == nil {
				return false
			}
		}
		return true
	})
	leader := servingNode(t, nodes, "jobs")
	lc := leader.Connect()
	defer lc.Close()
	lj, err := declareTasks(ctx, t, lc, "jobs", courier.Replicas(3))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := lj.Submit(ctx, courier.Task{Body: fmt.Appendf(nil, "t%d", i)}); err != nil {
			t.Fatalf("submit %d on the leader: %v", i, err)
		}
	}
	if q := leader.Broker().Queue("jobs"); q == nil || q.Stats().Messages() != 10 {
		t.Fatalf("the leader's queue holds %v", q)
	}
	// Every replica has the ten tasks in its journal state.
	waitUntil(t, 30*time.Second, "every replica applied the ten tasks", func() bool {
		for _, n := range nodes {
			if liveOn(n, "jobs") != 10 {
				return false
			}
		}
		return true
	})
	for _, n := range nodes {
		if n == leader {
			continue
		}
		oc := n.Connect()
		oj, err := declareTasks(ctx, t, oc, "jobs")
		if err != nil {
			t.Fatalf("declare jobs again on %s: %v", n.cfg.Name, err)
		}
		// A submit is forwarded to the leader, and confirmed from there.
		id, err := oj.Submit(ctx, courier.Task{Body: []byte("from " + n.cfg.Name)})
		if err != nil {
			t.Fatalf("submit on %s, forwarded to %s: %v", n.cfg.Name, leader.cfg.Name, err)
		}
		// So are a worker (replicas_workers_test.go) and a watch
		// (replicas_watch_test.go).
		if _, err := oj.Work(ctx, func(j *courier.Job) error { j.Defer(); return nil }); err != nil {
			t.Fatalf("worker on %s, forwarded to %s: %v", n.cfg.Name, leader.cfg.Name, err)
		}
		w, err := oj.Watch(ctx, id, func(courier.TaskEvent) {})
		if err != nil {
			t.Fatalf("watch on %s, forwarded to %s: %v", n.cfg.Name, leader.cfg.Name, err)
		}
		w.Stop()
		oc.Close()
	}

	if _, err := declareTasks(ctx, t, conn, "big", courier.Replicas(5)); wireCode(err) != wire.CodeUnavailable {
		t.Fatalf("Replicas(5) on 3 nodes: %v, want unavailable", err)
	}
	two, err := declareTasks(ctx, t, conn, "two", courier.Replicas(2))
	if err != nil {
		t.Fatal(err)
	}
	if ex, _ := nodes[1].Meta().Exchange("two"); two.Info().Replicas != 2 || len(ex.ReplicaNodes()) != 2 {
		t.Fatalf("Replicas(2) placed as %+v", ex)
	}

	// The management API's RabbitMQ-shaped argument, on every node.
	for _, n := range nodes {
		name := "http-" + n.cfg.Name
		req, err := http.NewRequestWithContext(ctx, "PUT", n.HTTPURL()+"/api/queues/"+name, strings.NewReader(`{"durable":true,"arguments":{"x-quorum-initial-group-size":2}}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if ex, _ := n.Meta().Exchange(name); resp.StatusCode/100 != 2 || len(ex.ReplicaNodes()) != 2 {
			t.Fatalf("PUT /api/queues/%s with x-quorum-initial-group-size 2 on %s: %d, placed as %+v", name, n.cfg.Name, resp.StatusCode, ex)
		}
	}

	if q := leader.Broker().Queue("jobs"); q == nil || q.Stats().Messages() != 12 {
		t.Fatalf("the leader's queue after 2 forwarded submits: %v", q.Stats())
	}
	// Deleted as a queue on a node that does not serve it.
	var notLeader *Node
	for _, n := range nodes {
		if n != leader {
			notLeader = n
			break
		}
	}
	dc := notLeader.Connect()
	defer dc.Close()
	if err := dc.DeleteQueue(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "jobs served nowhere and its groups closed", func() bool {
		for _, n := range nodes {
			if n.Broker().Exchange("jobs") != nil || n.replicas.group("jobs") != nil {
				return false
			}
		}
		return true
	})
}

// TestReplicatedQueueFailover: tasks confirmed on the leader's node, a
// few acked and a few held by a worker there, survive the stop of that
// node: a new leader on the other two serves the queue, delivering every
// confirmed task that was not acked, none counted as a failed attempt,
// keyed tasks in their order, and confirms new submits. With one node
// left of three, nothing is confirmed.
func TestReplicatedQueueFailover(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	decl := nodes[0].Connect()
	if _, err := declareTasks(ctx, t, decl, "work"); err != nil {
		t.Fatal(err)
	}
	decl.Close()
	leader := servingNode(t, nodes, "work")
	lc := leader.Connect()
	lj, err := declareTasks(ctx, t, lc, "work")
	if err != nil {
		t.Fatal(err)
	}
	const keys, perKey = 3, 10
	want := map[string]bool{}
	for i := range perKey {
		for k := range keys {
			body := fmt.Sprintf("k%d-%02d", k, i)
			if _, err := lj.Submit(ctx, courier.Task{Key: fmt.Sprintf("k%d", k), Body: []byte(body)}); err != nil {
				t.Fatalf("submit %s: %v", body, err)
			}
			want[body] = true
		}
	}
	for i := range 10 {
		body := fmt.Sprintf("free-%02d", i)
		if _, err := lj.Submit(ctx, courier.Task{Body: []byte(body)}); err != nil {
			t.Fatalf("submit %s: %v", body, err)
		}
		want[body] = true
	}
	// Submits on another node are forwarded to the leader and confirmed.
	var other *Node
	for _, n := range nodes {
		if n != leader {
			other = n
			break
		}
	}
	oc := other.Connect()
	oj, err := declareTasks(ctx, t, oc, "work")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		body := fmt.Sprintf("fwd-%02d", i)
		if _, err := oj.Submit(ctx, courier.Task{Body: []byte(body)}); err != nil {
			t.Fatalf("submit %s on %s, forwarded: %v", body, other.cfg.Name, err)
		}
		want[body] = true
	}
	oc.Close()
	// A worker on the leader's node acks 5 unkeyed tasks and holds the
	// others it gets unsettled until its node stops.
	var mu sync.Mutex
	acked := map[string]bool{}
	held := 0
	if _, err := lj.Work(ctx, func(j *courier.Job) error {
		mu.Lock()
		defer mu.Unlock()
		if strings.HasPrefix(string(j.Body), "free-") && len(acked) < 5 {
			acked[string(j.Body)] = true
			return nil
		}
		held++
		j.Defer()
		return nil
	}, courier.Prefetch(8)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "five acked and a task held", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) == 5 && held > 0
	})
	// The acks commit before the stop (each release is a group entry):
	// wait until every replica applied them.
	waitUntil(t, 30*time.Second, "every replica applied the acks", func() bool {
		for _, n := range nodes {
			if liveOn(n, "work") != len(want)-5 {
				return false
			}
		}
		return true
	})
	for b := range acked {
		delete(want, b)
	}
	// The node stops with the worker's tasks in flight (a worker that
	// disconnects fails its tasks, as on a node alone; a node that stops
	// does not).
	if err := leader.Close(); err != nil {
		t.Logf("closing the leader's node: %v", err)
	}
	var rest []*Node
	for _, n := range nodes {
		if n != leader {
			rest = append(rest, n)
		}
	}
	next := servingNode(t, rest, "work")
	nc := next.Connect()
	defer nc.Close()
	nj, err := declareTasks(ctx, t, nc, "work")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	last := map[string]string{}
	var order []string
	done := make(chan struct{})
	if _, err := nj.Work(ctx, func(j *courier.Job) error {
		mu.Lock()
		defer mu.Unlock()
		b := string(j.Body)
		got[b]++
		if j.Attempts != 0 {
			order = append(order, fmt.Sprintf("%s came back with %d attempts", b, j.Attempts))
		}
		if j.Key != "" {
			if p := last[j.Key]; p != "" && p > b {
				order = append(order, fmt.Sprintf("key %s: %s after %s", j.Key, b, p))
			}
			last[j.Key] = b
		}
		if len(got) == len(want) {
			select {
			case <-done:
			default:
				close(done)
			}
		}
		return nil
	}, courier.Prefetch(8)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		mu.Lock()
		t.Fatalf("the new leader delivered %d of %d confirmed tasks", len(got), len(want))
	}
	mu.Lock()
	for b := range want {
		if got[b] == 0 {
			t.Errorf("confirmed task %s lost", b)
		}
	}
	for b := range got {
		if !want[b] {
			t.Errorf("task %s delivered, not expected (acked before the failover?)", b)
		}
	}
	for _, o := range order {
		t.Error(o)
	}
	mu.Unlock()
	if _, err := nj.Submit(ctx, courier.Task{Body: []byte("after")}); err != nil {
		t.Fatalf("submit on the new leader: %v", err)
	}
	for _, n := range rest {
		if n == next {
			continue
		}
		c := n.Connect()
		j, err := declareTasks(ctx, t, c, "work")
		if err == nil {
			_, err = j.Submit(ctx, courier.Task{Body: []byte("after, forwarded")})
		}
		if err != nil {
			t.Fatalf("submit on %s, forwarded to the new leader %s: %v", n.cfg.Name, next.cfg.Name, err)
		}
		c.Close()
	}

	// One node of three left: it confirms nothing.
	for _, n := range rest {
		if n != next {
			n.Close()
		}
	}
	sctx, scancel := context.WithTimeout(ctx, 8*time.Second)
	defer scancel()
	if _, err := nj.Submit(sctx, courier.Task{Body: []byte("alone")}); err == nil {
		t.Fatal("a submit on the one node left of three was confirmed")
	}
}
