package admin

import (
	"context"
	"net/http"
	"strconv"
	"time"
)

// Replicated queues (issue 15): /api/queues shows, for a queue that is
// one Raft group over several nodes, what RabbitMQ shows for a quorum
// queue (type, leader, members, online), with how far each replica is
// behind its leader; /api/queues/rebalance and the member endpoints move
// leaders and replicas. The node answers from the metadata and, for the
// figures only the leader has, from the queue's leader node.

// ReplicaMember is one replica of a replicated queue.
type ReplicaMember struct {
	// Node holds the replica.
	Node string
	// Known is whether the leader answered for it: Voter, Behind and
	// BehindBytes are known only then.
	Known bool
	// Voter is false for a learner: a replica being added that has not
	// caught up, or one that lost part of its log and rejoined.
	Voter bool
	// Live is whether the node is alive in the cluster.
	Live bool
	// Behind is how many log entries the replica lacks of the leader's
	// log (0 for the leader).
	Behind uint64
}

// ReplicaInfo is a replicated queue's replicas as the management API
// shows them.
type ReplicaInfo struct {
	Name string
	// Leader is the node whose replica leads and serves the queue, ""
	// while none does.
	Leader string
	// Members lists every replica, the metadata's order.
	Members []ReplicaMember
	// Change is the membership change under way: "+node" (adding),
	// "-node" (removing), "" when none.
	Change string
	// Counters are the queue's figures on its leader's node, when it
	// answered; nil otherwise.
	Counters *QueueInfo
	// Error says why the leader's figures are missing, "" when they are
	// not.
	Error string
}

// Online lists the members whose node is alive and which vote.
func (r *ReplicaInfo) Online() []string {
	var out []string
	for _, m := range r.Members {
		if m.Live && m.Known && m.Voter {
			out = append(out, m.Node)
		}
	}
	return out
}

// MemberResult is the outcome of one membership change of a grow or a
// shrink.
type MemberResult struct {
	Queue string `json:"queue"`
	Node  string `json:"node"`
	// Error is why it was refused or failed, "" if it was made.
	Error string `json:"error,omitempty"`
}

// Move is one leadership moved (or not) by a rebalance.
type Move struct {
	Queue string `json:"queue"`
	From  string `json:"from"`
	To    string `json:"to"`
	// Error is why it did not happen, "" if it did.
	Error string `json:"error,omitempty"`
}

// Rebalance is what a rebalance did: the leaders each live node had
// before and after, and the moves.
type Rebalance struct {
	Before map[string]int `json:"before"`
	After  map[string]int `json:"after"`
	Moves  []Move         `json:"moves"`
}

// ReplicaSource is the replicated queues of a cluster as the management
// API sees them; nil on a node alone.
type ReplicaSource interface {
	// ReplicatedQueues returns every replicated queue of the cluster.
	ReplicatedQueues(ctx context.Context) []ReplicaInfo
	// ReplicatedQueue returns one; ok is false if name is not one.
	ReplicatedQueue(ctx context.Context, name string) (info ReplicaInfo, ok bool)
	// Rebalance spreads the leaders over the live nodes, moving at most
	// parallel at once.
	Rebalance(ctx context.Context, parallel int) (Rebalance, error)
	// ChangeMember adds node as a replica of queue (removes it with
	// remove), and returns once the change is made.
	ChangeMember(ctx context.Context, queue, node string, remove bool) error
	// Grow adds a replica on node to every replicated queue without one
	// (only those with an even number of replicas with even), one at a
	// time; Shrink removes node's replica from every queue.
	Grow(ctx context.Context, node string, even bool) []MemberResult
	Shrink(ctx context.Context, node string) []MemberResult
}

// appendReplicaNodes appends the names of the replica nodes.
func appendReplicaNodes(b []byte, r *ReplicaInfo) []byte {
	b = append(b, '[')
	for i, m := range r.Members {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, m.Node)
	}
	return append(b, ']')
}

func appendOnline(b []byte, r *ReplicaInfo) []byte {
	b = append(b, '[')
	for i, n := range r.Online() {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, n)
	}
	return append(b, ']')
}

// appendReplicas appends the members' details: node, role, live and
// entries behind ("role" is "leader", "voter", "learner", or "unknown"
// when the leader did not answer).
func appendReplicas(b []byte, r *ReplicaInfo) []byte {
	b = append(b, '[')
	for i, m := range r.Members {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"node":`...)
		b = appendString(b, m.Node)
		role := "unknown"
		switch {
		case m.Known && m.Node == r.Leader:
			role = "leader"
		case m.Known && m.Voter:
			role = "voter"
		case m.Known:
			role = "learner"
		}
		b = append(b, `,"role":`...)
		b = appendString(b, role)
		b = append(b, `,"live":`...)
		b = strconv.AppendBool(b, m.Live)
		b = append(b, `,"behind":`...)
		if m.Known {
			b = strconv.AppendUint(b, m.Behind, 10)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

// errNoReplicas answers the replica endpoints on a node alone.
var errNoReplicas = &apiError{http.StatusNotImplemented, "not_implemented",
	"this node is not part of a cluster: it has no replicated queues"}

// replicaOpTime bounds one membership change or rebalance; grow and
// shrink get it per queue.
const replicaOpTime = 2 * time.Minute

// rebalanceBody is the body of POST /api/queues/rebalance.
type rebalanceBody struct {
	// Parallel is how many leaderships move at once (default 4).
	Parallel int `json:"parallel"`
}

// rebalanceQueues serves POST /api/queues/rebalance, as RabbitMQ's
// rabbitmq-queues rebalance quorum.
func (s *Server) rebalanceQueues(w http.ResponseWriter, r *http.Request) {
	var body rebalanceBody
	if err := readBody(r, &body, true); err != nil {
		writeError(w, err)
		return
	}
	if s.cfg.Replicas == nil {
		writeError(w, errNoReplicas)
		return
	}
	if body.Parallel <= 0 {
		body.Parallel = 4
	}
	ctx, cancel := context.WithTimeout(r.Context(), replicaOpTime)
	defer cancel()
	res, err := s.cfg.Replicas.Rebalance(ctx, min(body.Parallel, 64))
	if err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("replicated queues rebalanced through the management API", "moves", len(res.Moves), "by", requester(r))
	writeJSON(w, http.StatusOK, res)
}

// memberBody is the body of POST /api/queues/{name}/members and of
// POST /api/queues/grow and /api/queues/shrink.
type memberBody struct {
	Node string `json:"node"`
	// Selector, for grow: "all" (default) or "even" (only the queues
	// with an even number of replicas), as rabbitmq-queues grow.
	Selector string `json:"selector,omitempty"`
}

// queueMembers serves POST /api/queues/{name}/members (add a replica on
// the node of the body) and DELETE /api/queues/{name}/members/{node}.
func (s *Server) queueMembers(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	node := r.PathValue("node")
	remove := r.Method == http.MethodDelete
	if !remove {
		var body memberBody
		if err := readBody(r, &body, false); err != nil {
			writeError(w, err)
			return
		}
		node = body.Node
	}
	if node == "" {
		writeError(w, badRequest("name the node: {\"node\": \"n2\"}"))
		return
	}
	if s.cfg.Replicas == nil {
		writeError(w, errNoReplicas)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), replicaOpTime)
	defer cancel()
	if err := s.cfg.Replicas.ChangeMember(ctx, name, node, remove); err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("queue membership changed through the management API", "queue", name, "node", node, "removed", remove, "by", requester(r))
	info, _ := s.cfg.Replicas.ReplicatedQueue(ctx, name)
	serveObject(w, r, queueSchema, &queueRow{item: remoteItem(&info)}, http.StatusOK)
}

// growQueues serves POST /api/queues/grow: a replica on the body's node
// for every replicated queue without one, one queue at a time.
func (s *Server) growQueues(w http.ResponseWriter, r *http.Request) { s.growShrink(w, r, false) }

// shrinkQueues serves POST /api/queues/shrink: the body's node's
// replica removed from every replicated queue, one at a time.
func (s *Server) shrinkQueues(w http.ResponseWriter, r *http.Request) { s.growShrink(w, r, true) }

func (s *Server) growShrink(w http.ResponseWriter, r *http.Request, shrink bool) {
	var body memberBody
	if err := readBody(r, &body, false); err != nil {
		writeError(w, err)
		return
	}
	if body.Node == "" {
		writeError(w, badRequest("name the node: {\"node\": \"n2\"}"))
		return
	}
	if body.Selector != "" && body.Selector != "all" && body.Selector != "even" {
		writeError(w, badRequest("selector %q: use all or even", body.Selector))
		return
	}
	if s.cfg.Replicas == nil {
		writeError(w, errNoReplicas)
		return
	}
	var res []MemberResult
	if shrink {
		res = s.cfg.Replicas.Shrink(r.Context(), body.Node)
	} else {
		res = s.cfg.Replicas.Grow(r.Context(), body.Node, body.Selector == "even")
	}
	if res == nil {
		res = []MemberResult{}
	}
	s.log.Info("replicated queues grown or shrunk through the management API", "node", body.Node, "shrink", shrink, "queues", len(res), "by", requester(r))
	writeJSON(w, http.StatusOK, res)
}
