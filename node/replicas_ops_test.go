package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/courier-mq/courier"
)

// apiQueue is a row of /api/queues as its JSON reads, the replicated
// queue's fields.
type apiQueue struct {
	Name     string   `json:"name"`
	Type     string   `json:"type"`
	Leader   string   `json:"leader"`
	Members  []string `json:"members"`
	Online   []string `json:"online"`
	Messages uint64   `json:"messages"`
	Replicas []struct {
		Node   string  `json:"node"`
		Role   string  `json:"role"`
		Live   bool    `json:"live"`
		Behind *uint64 `json:"behind"`
	} `json:"replicas"`
	Change string `json:"membership_change"`
	Error  string `json:"replica_error"`
}

// apiCall makes a request of n's management API and decodes a 2xx
// answer into out; it returns the status and the body.
func apiCall(t *testing.T, n *Node, method, path string, body any, out any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, n.HTTPURL()+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 == 2 && out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

// queueOn returns the replicated queue name as n's /api/queues/{name}
// shows it.
func queueOn(t *testing.T, n *Node, name string) apiQueue {
	t.Helper()
	var q apiQueue
	if code, body := apiCall(t, n, "GET", "/api/queues/"+name, nil, &q); code != 200 {
		t.Fatalf("GET /api/queues/%s on %s: %d %s", name, n.cfg.Name, code, body)
	}
	return q
}

// settled reports whether q shows leader, every member online and
// caught up.
func settled(q apiQueue, leader string, members []string) bool {
	if q.Type != "quorum" || q.Leader != leader || !slices.Equal(q.Members, members) || q.Error != "" || q.Change != "" {
		return false
	}
	on := slices.Sorted(slices.Values(q.Online))
	if !slices.Equal(on, slices.Sorted(slices.Values(members))) || len(q.Replicas) != len(members) {
		return false
	}
	for _, r := range q.Replicas {
		if r.Behind == nil || *r.Behind != 0 || !r.Live {
			return false
		}
		if want := map[bool]string{true: "leader", false: "voter"}[r.Node == leader]; r.Role != want {
			return false
		}
	}
	return true
}

// TestReplicatedQueueListing: every node's /api/queues and
// /api/queues/{name} show a replicated queue the same way, whichever
// node leads it (the others ask the leader's node): type quorum, its
// leader, members and online replicas, each replica's role and how far
// it is behind, and the leader's figures; a classic queue's type.
func TestReplicatedQueueListing(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := nodes[0].Connect()
	defer c.Close()
	tk, err := declareTasks(ctx, t, c, "see")
	if err != nil {
		t.Fatal(err)
	}
	leader := servingNode(t, nodes, "see")
	for i := range 5 {
		if _, err := tk.Submit(ctx, courier.Task{Body: fmt.Appendf(nil, "t%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	ex, _ := nodes[0].Meta().Exchange("see")
	members := ex.ReplicaNodes()
	for _, n := range nodes {
		waitUntil(t, 60*time.Second, n.cfg.Name+" shows see settled", func() bool {
			q := queueOn(t, n, "see")
			return settled(q, leader.cfg.Name, members) && q.Messages == 5
		})
		var list []apiQueue
		if code, body := apiCall(t, n, "GET", "/api/queues", nil, &list); code != 200 {
			t.Fatalf("list on %s: %d %s", n.cfg.Name, code, body)
		}
		i := slices.IndexFunc(list, func(q apiQueue) bool { return q.Name == "see" })
		if i < 0 || !settled(list[i], leader.cfg.Name, members) || list[i].Messages != 5 {
			t.Fatalf("list on %s: %+v", n.cfg.Name, list)
		}
	}
	// A node that is not a replica's listing is the same: shown above on
	// every node, and the figures come from the leader's node.
	if code, _ := apiCall(t, nodes[1], "GET", "/api/queues/nope", nil, nil); code != 404 {
		t.Fatalf("an unknown queue: %d", code)
	}
}

// startCluster4Live starts four nodes, all live in the liveness table
// and linked to each other.
func startCluster4Live(t *testing.T) []*Node {
	t.Helper()
	nodes := startCluster3Live(t)
	d := startClusterNode(t, "d", nodes[0].ClusterAddr())
	nodes = append(nodes, d)
	waitUntil(t, 60*time.Second, "four live nodes, linked", func() bool {
		live := 0
		for _, l := range nodes[0].Meta().Nodes() {
			if !l.Expired {
				live++
			}
		}
		for _, n := range nodes {
			if len(n.Broker().PeerNodes()) != 3 {
				return false
			}
		}
		return live == 4
	})
	return nodes
}

// TestReplicatedQueueGrowShrink: on four nodes, a queue on three grows
// onto the fourth while a producer submits: the new replica is added
// as a learner, catches up and becomes a voter, and every task
// confirmed before, during and after is delivered; then a replica is
// removed (its node closes its group) and the refusals: a replica
// already there, a node unknown, the last replica.
func TestReplicatedQueueGrowShrink(t *testing.T) {
	nodes := startCluster4Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	c := nodes[0].Connect()
	defer c.Close()
	tk, err := declareTasks(ctx, t, c, "grow", courier.Replicas(3))
	if err != nil {
		t.Fatal(err)
	}
	servingNode(t, nodes, "grow")
	ex, _ := nodes[0].Meta().Exchange("grow")
	var outside *Node
	for _, n := range nodes {
		if !slices.Contains(ex.ReplicaNodes(), n.cfg.Name) {
			outside = n
		}
	}
	// A producer submits all along, each confirmed task noted.
	confirmed := make(chan string, 100000)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			body := fmt.Sprintf("p%05d", i)
			if _, err := tk.Submit(ctx, courier.Task{Body: []byte(body)}); err != nil {
				done <- fmt.Errorf("submit %s: %w", body, err)
				return
			}
			confirmed <- body
		}
	}()
	waitUntil(t, 30*time.Second, "some tasks confirmed", func() bool { return len(confirmed) >= 50 })

	// Grow onto the fourth node through another node's API.
	var q apiQueue
	path := "/api/queues/grow/members"
	if code, body := apiCall(t, nodes[1], "POST", path, map[string]string{"node": outside.cfg.Name}, &q); code != 200 {
		t.Fatalf("add %s: %d %s", outside.cfg.Name, code, body)
	}
	if !slices.Contains(q.Members, outside.cfg.Name) || q.Change != "" {
		t.Fatalf("after the add: %+v", q)
	}
	n := len(confirmed)
	waitUntil(t, 30*time.Second, "more tasks confirmed after the add", func() bool { return len(confirmed) >= n+20 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	leader := servingNode(t, nodes, "grow")
	ex, _ = nodes[0].Meta().Exchange("grow")
	if len(ex.Voters()) != 4 || ex.Config.Replicas != 4 {
		t.Fatalf("record after the add: %+v", ex)
	}
	waitUntil(t, 60*time.Second, "the four replicas settled", func() bool {
		return settled(queueOn(t, outside, "grow"), leader.cfg.Name, ex.ReplicaNodes())
	})
	g := outside.replicas.group("grow")
	if g == nil {
		t.Fatal("the new replica's node has no group")
	}
	if st, err := g.Status(); err != nil || !slices.Contains(st.Voters, replicaID(outside.cfg.Name)) {
		t.Fatalf("the new replica's status: %+v %v", st, err)
	}
	want := len(confirmed)
	waitUntil(t, 30*time.Second, "the new replica holds every task", func() bool { return liveOn(outside, "grow") == want })

	// Refusals.
	for _, tc := range []struct {
		method, path string
		body         any
		code         int
	}{
		{"POST", path, map[string]string{"node": outside.cfg.Name}, 409},
		{"POST", path, map[string]string{"node": "nowhere"}, 400},
		{"POST", path, map[string]string{}, 400},
		{"POST", "/api/queues/nope/members", map[string]string{"node": "a"}, 404},
	} {
		if code, body := apiCall(t, nodes[2], tc.method, tc.path, tc.body, nil); code != tc.code {
			t.Errorf("%s %s %v: %d %s, want %d", tc.method, tc.path, tc.body, code, body, tc.code)
		}
	}

	// Shrink: remove the leader's own replica (it hands over first).
	if code, body := apiCall(t, nodes[3], "DELETE", path+"/"+leader.cfg.Name, nil, &q); code != 200 {
		t.Fatalf("delete %s: %d %s", leader.cfg.Name, code, body)
	}
	if slices.Contains(q.Members, leader.cfg.Name) || len(q.Members) != 3 {
		t.Fatalf("after the removal: %+v", q)
	}
	waitUntil(t, 30*time.Second, leader.cfg.Name+" closes its group", func() bool { return leader.replicas.group("grow") == nil })
	newLeader := servingNode(t, nodes, "grow")
	if newLeader == leader {
		t.Fatalf("%s still serves grow", leader.cfg.Name)
	}
	// Every confirmed task is delivered from the new leader.
	got := map[string]bool{}
	gotc := make(chan string, 100000)
	w, err := tk.Work(ctx, func(j *courier.Job) error { gotc <- string(j.Body); return nil }, courier.Prefetch(64))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 120*time.Second, "every confirmed task delivered", func() bool {
		for {
			select {
			case b := <-gotc:
				got[b] = true
			default:
				return len(got) >= want
			}
		}
	})
	_ = w.Detach(ctx)
	close(confirmed)
	for b := range confirmed {
		if !got[b] {
			t.Errorf("confirmed task %s not delivered", b)
		}
	}

	// Down to one replica, one at a time; the last cannot go.
	ex, _ = nodes[0].Meta().Exchange("grow")
	rest := ex.ReplicaNodes()
	for _, node := range rest[:len(rest)-1] {
		if code, body := apiCall(t, nodes[0], "DELETE", path+"/"+node, nil, nil); code != 200 {
			t.Fatalf("delete %s: %d %s", node, code, body)
		}
	}
	last := rest[len(rest)-1]
	if code, body := apiCall(t, nodes[0], "DELETE", path+"/"+last, nil, nil); code != 409 {
		t.Fatalf("delete the last replica: %d %s", code, body)
	}
	servingNode(t, nodes, "grow")
	if _, err := tk.Submit(ctx, courier.Task{Body: []byte("after")}); err != nil {
		t.Fatalf("submit with one replica left: %v", err)
	}
}

// rebalanceResult is the answer of POST /api/queues/rebalance.
type rebalanceResult struct {
	Before map[string]int `json:"before"`
	After  map[string]int `json:"after"`
	Moves  []struct {
		Queue, From, To, Error string
	} `json:"moves"`
}

// TestReplicatedQueueRebalance: six queues on three nodes, all led by
// one node; a rebalance moves four leaderships, at most two at a time,
// and leaves each node leading two; a second one moves nothing.
func TestReplicatedQueueRebalance(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	c := nodes[0].Connect()
	defer c.Close()
	a := nodes[0]
	var names []string
	for i := range 6 {
		name := fmt.Sprintf("rb%d", i)
		names = append(names, name)
		if _, err := declareTasks(ctx, t, c, name); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		if from := servingNode(t, nodes, name); from != a {
			moveLeader(ctx, t, nodes, from, a, name)
		}
	}
	var res rebalanceResult
	if code, body := apiCall(t, nodes[1], "POST", "/api/queues/rebalance", map[string]int{"parallel": 2}, &res); code != 200 {
		t.Fatalf("rebalance: %d %s", code, body)
	}
	t.Logf("rebalance: %+v", res)
	if res.Before["a"] != 6 || len(res.Moves) != 4 {
		t.Fatalf("rebalance: %+v", res)
	}
	for _, m := range res.Moves {
		if m.From != "a" || m.Error != "" {
			t.Errorf("move %+v", m)
		}
	}
	// Each move without an error was seen done: its target recorded
	// itself as the queue's leader in a later term. An election on a
	// loaded machine may move a leader again afterwards, so the counts
	// are those the rebalance saw.
	if res.After["a"] != 2 || res.After["b"] != 2 || res.After["c"] != 2 {
		t.Fatalf("leaders after the rebalance: %v", res.After)
	}
	for _, m := range res.Moves {
		if ex, _ := nodes[0].Meta().Exchange(m.Queue); ex.LeaderTerm == 0 {
			t.Errorf("%s has no leader recorded", m.Queue)
		}
		servingNode(t, nodes, m.Queue)
	}
	if code, body := apiCall(t, nodes[2], "POST", "/api/queues/rebalance", nil, &res); code != 200 || len(res.Moves) != 0 {
		t.Fatalf("second rebalance: %d %s", code, body)
	}
}

// TestReplicatedQueueChangeSurvivesLeaderStop: the record says a
// replica is being added, and the queue's leader's node stops at once,
// the change made in its group or not: the next leader finds the change
// in the record and finishes it from where the group's configuration
// stands; the new replica holds every confirmed task. The same for a
// removal.
func TestReplicatedQueueChangeSurvivesLeaderStop(t *testing.T) {
	nodes := startCluster4Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	ex0 := func() []string { ex, _ := nodes[0].Meta().Exchange("cr"); return ex.ReplicaNodes() }
	var entry *Node
	c := nodes[0].Connect()
	defer c.Close()
	tk, err := declareTasks(ctx, t, c, "cr", courier.Replicas(3))
	if err != nil {
		t.Fatal(err)
	}
	leader := servingNode(t, nodes, "cr")
	for i := range 20 {
		if _, err := tk.Submit(ctx, courier.Task{Body: fmt.Appendf(nil, "t%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var outside *Node
	for _, n := range nodes {
		if !slices.Contains(ex0(), n.cfg.Name) {
			outside = n
		}
	}
	// Ask through a node that is neither the leader nor the new one.
	for _, n := range nodes {
		if n != leader && n != outside {
			entry = n
			break
		}
	}
	if _, err := entry.Meta().ChangeQueueMember(ctx, "cr", 0, outside.cfg.Name, false); err != nil {
		t.Fatal(err)
	}
	leader.Close()
	rest := otherNodes(nodes, leader)
	waitUntil(t, 120*time.Second, "the add finished by the next leader", func() bool {
		ex, _ := entry.Meta().Exchange("cr")
		if ex.Change != "" || !slices.Contains(ex.ReplicaNodes(), outside.cfg.Name) {
			return false
		}
		g := outside.replicas.group("cr")
		if g == nil {
			return false
		}
		st, err := g.Status()
		return err == nil && slices.Contains(st.Voters, replicaID(outside.cfg.Name))
	})
	waitUntil(t, 60*time.Second, "the new replica holds the 20 tasks", func() bool { return liveOn(outside, "cr") == 20 })

	// The stopped node's replica is removed (a shrink of a node that is
	// down), through the API of a node that holds no replica... or any.
	if code, body := apiCall(t, entry, "DELETE", "/api/queues/cr/members/"+leader.cfg.Name, nil, nil); code != 200 {
		t.Fatalf("remove the stopped node's replica: %d %s", code, body)
	}
	// Read on entry, which is up (nodes[0] may be the stopped leader),
	// once its state has the removal the leader recorded.
	exEntry := func() []string { ex, _ := entry.Meta().Exchange("cr"); return ex.ReplicaNodes() }
	waitUntil(t, 30*time.Second, "the removal in entry's metadata", func() bool { return !slices.Contains(exEntry(), leader.cfg.Name) })

	// A removal the record asks for, and the leadership moves at once
	// to another replica: the new leader removes it.
	leader = servingNode(t, rest, "cr")
	var gone, next *Node
	for _, n := range rest {
		if n != leader && slices.Contains(exEntry(), n.cfg.Name) {
			if gone == nil {
				gone = n
			} else {
				next = n
			}
		}
	}
	if _, err := entry.Meta().ChangeQueueMember(ctx, "cr", 0, gone.cfg.Name, true); err != nil {
		t.Fatal(err)
	}
	if g := leader.replicas.group("cr"); g != nil {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := g.TransferLeadership(tctx, replicaID(next.cfg.Name))
		cancel()
		t.Logf("leadership handed from %s to %s during the removal: %v", leader.cfg.Name, next.cfg.Name, err)
	}
	waitUntil(t, 120*time.Second, "the removal finished", func() bool {
		ex, _ := entry.Meta().Exchange("cr")
		return ex.Change == "" && !slices.Contains(ex.ReplicaNodes(), gone.cfg.Name) && gone.replicas.group("cr") == nil
	})
	servingNode(t, rest, "cr")
	ec := entry.Connect()
	defer ec.Close()
	etk, err := declareTasks(ctx, t, ec, "cr")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := etk.Submit(ctx, courier.Task{Body: []byte("after")}); err != nil {
		t.Fatalf("submit after the changes: %v", err)
	}
}

// TestReplicatedQueueRemovalRefused: with one of a queue's three
// replicas' nodes stopped, removing a live replica would leave one live
// voter of two: refused, by the node asked as soon as it sees the node
// gone (before the metadata's lease expires), with the reason; the
// stopped node's own replica can go.
func TestReplicatedQueueRemovalRefused(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	c := nodes[0].Connect()
	defer c.Close()
	if _, err := declareTasks(ctx, t, c, "keep"); err != nil {
		t.Fatal(err)
	}
	leader := servingNode(t, nodes, "keep")
	var down, other *Node
	for _, n := range nodes {
		switch {
		case n == leader:
		case down == nil:
			down = n
		default:
			other = n
		}
	}
	down.Close()
	waitUntil(t, 30*time.Second, leader.cfg.Name+" sees "+down.cfg.Name+" gone", func() bool {
		return !(replicaSource{leader}).liveNodes()[down.cfg.Name]
	})
	code, body := apiCall(t, leader, "DELETE", "/api/queues/keep/members/"+other.cfg.Name, nil, nil)
	if code != 409 || !bytes.Contains([]byte(body), []byte("fewer than a majority")) {
		t.Fatalf("remove a live replica with another down: %d %s", code, body)
	}
	if code, body := apiCall(t, leader, "DELETE", "/api/queues/keep/members/"+down.cfg.Name, nil, nil); code != 200 {
		t.Fatalf("remove the stopped node's replica: %d %s", code, body)
	}
	if ex, _ := leader.Meta().Exchange("keep"); len(ex.ReplicaNodes()) != 2 || ex.Change != "" {
		t.Fatalf("record after: %+v", ex)
	}
}
