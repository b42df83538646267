package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/wire"
)

// fakeReplicas is a ReplicaSource that records the calls made.
type fakeReplicas struct {
	mu    sync.Mutex
	infos []admin.ReplicaInfo
	calls []string
}

func (f *fakeReplicas) ReplicatedQueues(context.Context) []admin.ReplicaInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.infos)
}

func (f *fakeReplicas) ReplicatedQueue(_ context.Context, name string) (admin.ReplicaInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, i := range f.infos {
		if i.Name == name {
			return i, true
		}
	}
	return admin.ReplicaInfo{}, false
}

func (f *fakeReplicas) note(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, s)
}

func (f *fakeReplicas) Rebalance(_ context.Context, parallel int) (admin.Rebalance, error) {
	f.note("rebalance " + string(rune('0'+parallel)))
	return admin.Rebalance{Before: map[string]int{"a": 2, "b": 0}, After: map[string]int{"a": 1, "b": 1},
		Moves: []admin.Move{{Queue: "q1", From: "a", To: "b"}}}, nil
}

func (f *fakeReplicas) ChangeMember(_ context.Context, queue, node string, remove bool) error {
	if node == "refused" {
		return wire.Errorf(wire.CodeNotAllowed, "queue %q: no", queue)
	}
	if remove {
		f.note("delete " + queue + " " + node)
	} else {
		f.note("add " + queue + " " + node)
	}
	return nil
}

func (f *fakeReplicas) Grow(_ context.Context, node string, even bool) []admin.MemberResult {
	f.note("grow " + node + map[bool]string{true: " even", false: ""}[even])
	return []admin.MemberResult{{Queue: "q1", Node: node}, {Queue: "q2", Node: node, Error: "no"}}
}

func (f *fakeReplicas) Shrink(_ context.Context, node string) []admin.MemberResult {
	f.note("shrink " + node)
	return nil
}

// TestReplicatedQueues: /api/queues shows a replicated queue the node
// serves with its replicas, adds one it does not serve (the leader's
// figures), and a classic queue as such; /api/queues/{name} the same;
// the rebalance, grow, shrink and member endpoints call the source,
// refusals keep their codes, and a node without replicas answers 501.
func TestReplicatedQueues(t *testing.T) {
	fq := &fakeQueues{q: map[string]*admin.QueueInfo{}}
	fr := &fakeReplicas{infos: []admin.ReplicaInfo{
		{Name: "local", Leader: "a", Members: []admin.ReplicaMember{
			{Node: "a", Known: true, Voter: true, Live: true},
			{Node: "b", Known: true, Voter: true, Live: true, Behind: 3},
			{Node: "c", Known: true, Voter: false, Live: true, Behind: 40},
		}, Change: "+c"},
		{Name: "remote", Leader: "b", Members: []admin.ReplicaMember{{Node: "b"}, {Node: "c"}},
			Counters: &admin.QueueInfo{MessagesReady: 4}, Error: "its leader's node b did not answer"},
	}}
	h := start(t, func(c *admin.Config) { c.Queues = fq; c.Replicas = fr })
	fq.set(admin.QueueInfo{Name: "local", MessagesReady: 1})
	fq.set(admin.QueueInfo{Name: "plain", MessagesReady: 2})
	h.tick(0)

	var list []obj
	h.get("/api/queues", &list)
	if n := names(list, "name"); !slices.Equal(n, []string{"local", "plain", "remote"}) {
		t.Fatalf("queues %v", n)
	}
	local, plain, remote := list[0], list[1], list[2]
	if local.at("type") != "quorum" || local.at("leader") != "a" || local.num("messages_ready") != 1 || local.at("membership_change") != "+c" {
		t.Errorf("local %v", local)
	}
	if got, _ := json.Marshal(local.at("members")); string(got) != `["a","b","c"]` {
		t.Errorf("local members %s", got)
	}
	if got, _ := json.Marshal(local.at("online")); string(got) != `["a","b"]` {
		t.Errorf("local online %s", got)
	}
	if got, _ := json.Marshal(local.at("replicas")); string(got) != `[{"behind":0,"live":true,"node":"a","role":"leader"},{"behind":3,"live":true,"node":"b","role":"voter"},{"behind":40,"live":true,"node":"c","role":"learner"}]` {
		t.Errorf("local replicas %s", got)
	}
	if plain.at("type") != "classic" || plain.at("leader") != "" {
		t.Errorf("plain %v", plain)
	}
	if remote.at("type") != "quorum" || remote.num("messages_ready") != 4 || remote.at("replica_error") == "" {
		t.Errorf("remote %v", remote)
	}
	if got, _ := json.Marshal(remote.at("replicas")); string(got) != `[{"behind":null,"live":false,"node":"b","role":"unknown"},{"behind":null,"live":false,"node":"c","role":"unknown"}]` {
		t.Errorf("remote replicas %s", got)
	}
	var one obj
	h.get("/api/queues/remote", &one)
	if one.at("leader") != "b" || one.num("messages_ready") != 4 {
		t.Errorf("GET remote %v", one)
	}
	h.get("/api/queues/local", &one)
	if one.at("type") != "quorum" || one.num("messages_ready") != 1 {
		t.Errorf("GET local %v", one)
	}

	for _, tc := range []struct {
		method, path, body string
		code               int
		call               string
	}{
		{"POST", "/api/queues/rebalance", `{"parallel": 2}`, 200, "rebalance 2"},
		{"POST", "/api/queues/rebalance", ``, 200, "rebalance 4"},
		{"POST", "/api/queues/local/members", `{"node": "d"}`, 200, "add local d"},
		{"DELETE", "/api/queues/local/members/b", ``, 200, "delete local b"},
		{"POST", "/api/queues/local/members", `{"node": "refused"}`, 409, ""},
		{"POST", "/api/queues/local/members", `{}`, 400, ""},
		{"POST", "/api/queues/grow", `{"node": "d", "selector": "even"}`, 200, "grow d even"},
		{"POST", "/api/queues/grow", `{"node": "d", "selector": "odd"}`, 400, ""},
		{"POST", "/api/queues/shrink", `{"node": "d"}`, 200, "shrink d"},
		{"GET", "/api/queues/rebalance", ``, 404, ""}, // a queue of that name
	} {
		fr.calls = nil
		code, _, body := h.do(tc.method, tc.path, tc.body)
		if code != tc.code {
			t.Errorf("%s %s %s: %d %s, want %d", tc.method, tc.path, tc.body, code, body, tc.code)
		}
		if tc.call != "" && (len(fr.calls) != 1 || fr.calls[0] != tc.call) {
			t.Errorf("%s %s: calls %v, want %q", tc.method, tc.path, fr.calls, tc.call)
		}
	}
	code, _, body := h.do("POST", "/api/queues/shrink", `{"node": "d"}`)
	if code != 200 || string(body) != "[]" {
		t.Errorf("shrink of nothing: %d %s", code, body)
	}

	alone := start(t, func(c *admin.Config) { c.Queues = fq })
	for p, b := range map[string]string{"/api/queues/rebalance": `{}`, "/api/queues/grow": `{"node": "d"}`, "/api/queues/local/members": `{"node": "d"}`} {
		if code, _, body := alone.do("POST", p, b); code != http.StatusNotImplemented {
			t.Errorf("POST %s alone: %d %s", p, code, body)
		}
	}
}
