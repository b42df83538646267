package node

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
)

// startCluster3 starts three embedded nodes of one cluster: a, then b and
// c joining it, and waits until the metadata group has all three.
func startCluster3(t *testing.T) []*Node {
	t.Helper()
	a := startClusterNode(t, "a")
	b := startClusterNode(t, "b", a.ClusterAddr())
	c := startClusterNode(t, "c", a.ClusterAddr())
	nodes := []*Node{a, b, c}
	waitUntil(t, 30*time.Second, "the metadata group has three servers", func() bool {
		s, err := a.Meta().Servers()
		return err == nil && len(s) == 3
	})
	waitUntil(t, 30*time.Second, "every broker links to the two others", func() bool {
		for _, n := range nodes {
			if len(n.Broker().PeerNodes()) != 2 {
				return false
			}
		}
		return true
	})
	return nodes
}

// An exchange declared on one node is known on every node; a client of
// the node it was declared on reads its own write at once.
func TestClusterDeclareAnywhere(t *testing.T) {
	nodes := startCluster3(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := nodes[1].Connect()
	defer conn.Close()
	if _, err := conn.PubSub(ctx, "prices"); err != nil {
		t.Fatal(err)
	}
	if nodes[1].Broker().Exchange("prices") == nil {
		t.Fatal("the declaring node does not have its exchange when Declare returns")
	}
	waitUntil(t, 10*time.Second, "prices on every node", func() bool {
		for _, n := range nodes {
			if n.Broker().Exchange("prices") == nil {
				return false
			}
		}
		return true
	})
	// Another pattern under the same name clashes, from any node.
	other := nodes[2].Connect()
	defer other.Close()
	if _, err := other.ReqResp(ctx, "prices"); err == nil {
		t.Error("declaring prices as reqresp on c: no error")
	}
	// Task queues in a cluster are replicated: a transient one is refused.
	if _, err := other.Tasks(ctx, "jobs", courier.Transient()); !errors.Is(err, broker.ErrTasksInCluster) {
		t.Errorf("a transient task exchange in a cluster: %v, want ErrTasksInCluster", err)
	}
	if err := nodes[0].Connect().DeleteExchange(ctx, "prices"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "prices gone from every node", func() bool {
		for _, n := range nodes {
			if n.Broker().Exchange("prices") != nil {
				return false
			}
		}
		return true
	})
}

// A publication on one node reaches subscribers on the others.
func TestClusterPubSubAcrossNodes(t *testing.T) {
	nodes := startCluster3(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan string, 16)
	for _, n := range nodes[1:] {
		ps, err := n.Connect().PubSub(ctx, "news")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ps.Subscribe(ctx, "sport.*", func(d *courier.Delivery) { got <- n.Name() + ":" + d.Key }); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := nodes[0].Connect().PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	if err := ps.Publish(ctx, "sport.tennis", []byte("x")); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < 2 {
		select {
		case s := <-got:
			seen[s] = true
		case <-ctx.Done():
			t.Fatalf("delivered %v, want b and c", seen)
		}
	}
}

// A user made on one node logs in on another; the last administrator
// cannot be deleted from any node.
func TestClusterUsers(t *testing.T) {
	nodes := startCluster3(t)
	p := auth.FullAccess()
	if _, err := nodes[0].users.PutUser("root", auth.UserChange{Password: "a good password", Tags: []string{auth.TagAdministrator}, Permissions: &p}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "root on node c", func() bool {
		_, ok := nodes[2].users.User("root")
		return ok
	})
	if _, err := nodes[2].users.Authenticate("root", "a good password"); err != nil {
		t.Errorf("root logs in on c: %v", err)
	}
	if err := nodes[1].users.DeleteUser("root"); !errors.Is(err, auth.ErrLastAdmin) {
		t.Errorf("deleting the last administrator on b: %v, want ErrLastAdmin", err)
	}
}

// A client of one node learns every node's client address from WELCOME.
func TestClusterConnectURLs(t *testing.T) {
	nodes := startCluster3(t)
	waitUntil(t, 10*time.Second, "a names the three client addresses", func() bool {
		return len(nodes[0].connectURLs()) == 3
	})
	got := nodes[0].connectURLs()
	for _, n := range nodes {
		if !slices.Contains(got, n.Addr().String()) {
			t.Errorf("connect_urls %v lack %s's %s", got, n.Name(), n.Addr())
		}
	}
}

// /api/nodes names the metadata leader; DELETE /api/nodes/{name} forgets
// a node for good (404 for one the cluster does not know).
func TestClusterForgetNode(t *testing.T) {
	nodes := startCluster3(t)
	waitUntil(t, 10*time.Second, "one meta leader in /api/nodes", func() bool {
		leaders := 0
		for _, r := range getNodes(t, nodes[0]) {
			if r.MetaLeader {
				leaders++
			}
		}
		return leaders == 1
	})
	del := func(name string) int {
		req, _ := http.NewRequest(http.MethodDelete, nodes[0].HTTPURL()+"/api/nodes/"+name, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := del("nosuchnode"); code != http.StatusNotFound {
		t.Errorf("forget an unknown node: %d, want 404", code)
	}
	nodes[2].Close()
	if code := del("c"); code != http.StatusNoContent {
		t.Fatalf("forget c: %d, want 204", code)
	}
	s, err := nodes[0].Meta().Servers()
	if err != nil || len(s) != 2 {
		t.Errorf("metadata group after forgetting c: %v, %v", s, err)
	}
}

// /api/nodes names the metadata leader, the same on every node, as the
// group itself does (courier cluster status and the fault tests'
// KillMetaLeader read it there).
func TestClusterNodesNameMetaLeader(t *testing.T) {
	nodes := startCluster3(t)
	waitUntil(t, 30*time.Second, "every node's /api/nodes names the leader the group knows", func() bool {
		want := nodes[0].Meta().Leader()
		if want == "" {
			return false
		}
		for _, n := range nodes {
			var leaders []string
			for _, r := range getNodes(t, n) {
				if r.MetaLeader {
					leaders = append(leaders, r.Name)
				}
			}
			if len(leaders) != 1 || leaders[0] != want {
				return false
			}
		}
		return true
	})
}
