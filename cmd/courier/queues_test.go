package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

// TestCLIQueueReplicas: on three `courier server` processes, a queue
// of two replicas declared through the management API is listed and
// shown by every node with its leader and replicas; add-member puts a
// replica on the third node (caught up, voting), delete-member and
// shrink take replicas away, grow adds them back, the last replica
// cannot go, and rebalance reports what it moved.
func TestCLIQueueReplicas(t *testing.T) {
	// Each joins all three: the metadata group forms with three.
	nodes := startCluster(t, "--bootstrap-expect", "3")
	api := func(n *clusterNode) string { return "http://" + n.http }
	body, _ := json.Marshal(map[string]any{"durable": true, "arguments": map[string]any{"x-quorum-initial-group-size": 2}})
	var last string
	ok := testutil.Eventually(60*time.Second, func() bool {
		req, _ := http.NewRequest(http.MethodPut, api(nodes[0])+"/api/queues/cli.rq", bytes.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			last = err.Error()
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		last = resp.Status + " " + string(b)
		return resp.StatusCode/100 == 2
	})
	if !ok {
		t.Fatalf("cannot declare cli.rq: %s", last)
	}
	var q apiQueue
	shown := func(n *clusterNode, online int) bool {
		r := cliRun(t, "queues", "show", "cli.rq", "--json", "--api", api(n))
		q = apiQueue{}
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &q) == nil && q.Type == "quorum" && q.Leader != "" &&
			len(q.Online) == online && len(q.Members) == online && q.Change == ""
	}
	for _, n := range nodes {
		if !testutil.Eventually(60*time.Second, func() bool { return shown(n, 2) }) {
			t.Fatalf("%s never shows cli.rq on 2 online replicas: %+v", n.name, q)
		}
	}
	members := q.Members
	var third string
	for _, n := range []string{"a", "b", "c"} {
		if !slices.Contains(members, n) {
			third = n
		}
	}
	list := cliOK(t, "queues", "--api", api(nodes[2]))
	for _, want := range []string{"TYPE", "LEADER", "MEMBERS", "ONLINE", "cli.rq", "quorum", strings.Join(members, ",")} {
		if !strings.Contains(list, want) {
			t.Errorf("queues lacks %q:\n%s", want, list)
		}
	}
	show := cliOK(t, "queues", "show", "cli.rq", "--api", api(nodes[1]))
	for _, want := range []string{"type", "quorum", "leader", "online", "2 of 2", "REPLICA", "ROLE", "BEHIND", "leader", "voter"} {
		if !strings.Contains(show, want) {
			t.Errorf("queues show lacks %q:\n%s", want, show)
		}
	}

	out := cliOK(t, "queues", "add-member", "cli.rq", third, "--api", api(nodes[1]))
	if !strings.Contains(out, "added and caught up") || !strings.Contains(out, third) {
		t.Errorf("add-member printed:\n%s", out)
	}
	if !testutil.Eventually(60*time.Second, func() bool { return shown(nodes[0], 3) }) {
		t.Fatalf("cli.rq not on 3 online replicas: %+v", q)
	}
	cliFails(t, exitFailure, []string{"queues", "add-member", "cli.rq", third, "--api", api(nodes[0])}, "already has a voting replica")
	out = cliOK(t, "queues", "delete-member", "cli.rq", third, "--api", api(nodes[2]))
	if !strings.Contains(out, "removed") {
		t.Errorf("delete-member printed:\n%s", out)
	}
	if out := cliOK(t, "queues", "grow", third, "--api", api(nodes[0])); out != "cli.rq: replica added on "+third+"\n" {
		t.Errorf("grow printed %q", out)
	}
	if out := cliOK(t, "queues", "grow", third, "--api", api(nodes[0])); out != "no queue to change\n" {
		t.Errorf("grow again printed %q", out)
	}
	if out := cliOK(t, "queues", "shrink", third, "--api", api(nodes[1])); out != "cli.rq: replica removed from "+third+"\n" {
		t.Errorf("shrink printed %q", out)
	}
	out = cliOK(t, "queues", "rebalance", "--api", api(nodes[2]))
	if !strings.Contains(out, "leaders before:") || !strings.Contains(out, "leaders after:") {
		t.Errorf("rebalance printed:\n%s", out)
	}
	// Down to one replica; the last cannot go.
	cliOK(t, "queues", "delete-member", "cli.rq", members[0], "--api", api(nodes[0]))
	cliFails(t, exitFailure, []string{"queues", "delete-member", "cli.rq", members[1], "--api", api(nodes[0])}, "last replica")
	r := cliRun(t, "queues", "shrink", members[1], "--api", api(nodes[0]))
	if r.code != exitFailure || !strings.Contains(r.stdout, "cli.rq: not removed from "+members[1]) || !strings.Contains(r.stderr, "1 of 1 queues were not changed") {
		t.Errorf("shrink of the last replica: %+v", r)
	}
	cliFails(t, exitNotFound, []string{"queues", "show", "nope", "--api", api(nodes[0])}, "not found")
}
