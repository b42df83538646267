package node

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/cluster"
	"github.com/courier-mq/courier/internal/cluster/meta"
)

// Seeing replicas (issue 15, item 4): a replicated queue's leader,
// replicas and how far each is behind, on every node. The metadata
// names the replicas and the leader; how far each replica is behind is
// known only to the leader's replica (its Raft progress), so a node asks
// the leader's node over a cluster connection of kind queue-ops:
//
//	request:  | len u32 | JSON {"v":1} |          len at most 4 KiB
//	response: | len u32 | JSON {"queues":[...]} |  len at most 64 MiB
//
// big-endian lengths; one request per connection, 10 s for the whole
// exchange. The answer lists every queue the node leads.

const (
	opsVersion     = 1
	maxOpsRequest  = 4 << 10
	maxOpsResponse = 64 << 20
	opsTimeout     = 10 * time.Second
	// maxOpsConns bounds the queue-ops connections served at once.
	maxOpsConns = 16
)

// opsRequest is a status request.
type opsRequest struct {
	V int `json:"v"`
}

// opsQueue is one queue's status in a response: what only the leader
// knows.
type opsQueue struct {
	Name     string           `json:"name"`
	Members  []opsMember      `json:"members"`
	Counters *admin.QueueInfo `json:"counters,omitempty"`
}

type opsMember struct {
	Node   string `json:"node"`
	Voter  bool   `json:"voter"`
	Behind uint64 `json:"behind"`
}

type opsResponse struct {
	Queues []opsQueue `json:"queues"`
}

// writeMsg writes one length-prefixed JSON message.
func writeMsg(w io.Writer, v any, limit int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > limit {
		return fmt.Errorf("node: queue-ops message of %d bytes, over %d", len(b), limit)
	}
	out := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	_, err = w.Write(append(out, b...))
	return err
}

// errOpsMessage is a queue-ops message that cannot be read.
var errOpsMessage = errors.New("node: bad queue-ops message")

// readMsg reads one length-prefixed JSON message of at most limit
// bytes into v; the length is checked before anything is allocated.
func readMsg(r io.Reader, v any, limit int) error {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(h[:])
	if int64(n) > int64(limit) {
		return fmt.Errorf("%w: %d bytes, over %d", errOpsMessage, n, limit)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %w", errOpsMessage, err)
	}
	return nil
}

// serveOps answers the queue-ops connections of the cluster until ln
// is closed.
func (r *queueReplicas) serveOps(ln net.Listener) {
	sem := make(chan struct{}, maxOpsConns)
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close() // too many at once: the asker shows the figures as unknown
			continue
		}
		go func() {
			defer func() { <-sem }()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(opsTimeout))
			var req opsRequest
			if err := readMsg(c, &req, maxOpsRequest); err != nil || req.V != opsVersion {
				return
			}
			_ = writeMsg(c, opsResponse{Queues: r.ledStatus()}, maxOpsResponse)
		}()
	}
}

// askLeader asks node for the status of the queues it leads.
func (r *queueReplicas) askLeader(ctx context.Context, node string) (map[string]opsQueue, error) {
	ctx, cancel := context.WithTimeout(ctx, opsTimeout)
	defer cancel()
	c, err := r.n.fabric.Dial(ctx, node, cluster.KindQueueOps)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if err := writeMsg(c, opsRequest{V: opsVersion}, maxOpsRequest); err != nil {
		return nil, err
	}
	var resp opsResponse
	if err := readMsg(c, &resp, maxOpsResponse); err != nil {
		return nil, err
	}
	out := make(map[string]opsQueue, len(resp.Queues))
	for _, q := range resp.Queues {
		out[q.Name] = q
	}
	return out, nil
}

// ledStatus returns the status of every queue this node's replica
// leads.
func (r *queueReplicas) ledStatus() []opsQueue {
	r.mu.Lock()
	qs := make([]*replicatedQueue, 0, len(r.queues))
	for _, q := range r.queues {
		qs = append(qs, q)
	}
	r.mu.Unlock()
	var out []opsQueue
	for _, q := range qs {
		if s, ok := q.status(); ok {
			out = append(out, s)
		}
	}
	return out
}

// status is the queue's status if this node's replica leads it.
func (q *replicatedQueue) status() (opsQueue, bool) {
	q.gmu.Lock()
	g := q.g
	q.gmu.Unlock()
	if g == nil {
		return opsQueue{}, false
	}
	st, err := g.Status()
	if err != nil || st.Role != "leader" {
		return opsQueue{}, false
	}
	ex := q.exchange()
	out := opsQueue{Name: ex.Name}
	for _, node := range ex.ReplicaNodes() {
		id := replicaID(node)
		m := opsMember{Node: node, Voter: slices.Contains(st.Voters, id), Behind: st.Last}
		if match, ok := st.Match[id]; ok {
			m.Behind = st.Last - min(match, st.Last)
		}
		out.Members = append(out.Members, m)
	}
	if info, ok := (queueSource{q.r.n.broker}).Queue(ex.Name); ok {
		out.Counters = &info
	}
	return out, true
}

// replicaSource is the node's admin.ReplicaSource.
type replicaSource struct{ n *Node }

// replicaSource returns the node's replicated queues for the management
// API; nil for a node alone.
func (n *Node) replicaSource() admin.ReplicaSource {
	if !n.cfg.Cluster.Enabled() {
		return nil
	}
	return replicaSource{n}
}

var _ admin.ReplicaSource = replicaSource{}

// ready returns the node's metadata and replicas, nil when the node has
// not joined a cluster (yet).
func (s replicaSource) ready() (*meta.Meta, *queueReplicas) {
	m := s.n.hooks.meta.Load()
	if m == nil || s.n.replicas == nil || s.n.fabric == nil {
		return nil, nil
	}
	return m, s.n.replicas
}

// liveNodes returns the nodes alive or suspect in the fabric.
func (s replicaSource) liveNodes() map[string]bool {
	live := map[string]bool{}
	for _, m := range s.n.fabric.Members() {
		if m.State == "alive" || m.State == "suspect" {
			live[m.Name] = true
		}
	}
	return live
}

// ReplicatedQueues implements admin.ReplicaSource.
func (s replicaSource) ReplicatedQueues(ctx context.Context) []admin.ReplicaInfo {
	m, r := s.ready()
	if m == nil {
		return nil
	}
	var exs []meta.Exchange
	for _, ex := range m.Exchanges() {
		if ex.Replicated() {
			exs = append(exs, ex)
		}
	}
	return s.infos(ctx, r, exs)
}

// ReplicatedQueue implements admin.ReplicaSource.
func (s replicaSource) ReplicatedQueue(ctx context.Context, name string) (admin.ReplicaInfo, bool) {
	m, r := s.ready()
	if m == nil {
		return admin.ReplicaInfo{}, false
	}
	ex, ok := m.Exchange(name)
	if !ok || !ex.Replicated() {
		return admin.ReplicaInfo{}, false
	}
	return s.infos(ctx, r, []meta.Exchange{ex})[0], true
}

// infos builds the queues' infos from the metadata and their leaders'
// answers, asked in parallel, one request per leader node.
func (s replicaSource) infos(ctx context.Context, r *queueReplicas, exs []meta.Exchange) []admin.ReplicaInfo {
	live := s.liveNodes()
	self := s.n.cfg.Name
	type answer struct {
		qs  map[string]opsQueue
		err error
	}
	answers := map[string]*answer{}
	var wg sync.WaitGroup
	for _, ex := range exs {
		leader := leaderOf(ex)
		if leader == "" || answers[leader] != nil {
			continue
		}
		a := &answer{}
		answers[leader] = a
		if leader == self {
			a.qs = map[string]opsQueue{}
			for _, q := range r.ledStatus() {
				a.qs[q.Name] = q
			}
			continue
		}
		if !live[leader] {
			a.err = fmt.Errorf("its leader's node %s is not alive", leader)
			continue
		}
		wg.Go(func() { a.qs, a.err = r.askLeader(ctx, leader) })
	}
	wg.Wait()
	out := make([]admin.ReplicaInfo, 0, len(exs))
	for _, ex := range exs {
		info := admin.ReplicaInfo{Name: ex.Name, Leader: leaderOf(ex), Change: ex.Change}
		a := answers[info.Leader]
		var q opsQueue
		var ok bool
		switch {
		case a == nil:
			info.Error = "no replica leads it yet"
		case a.err != nil:
			info.Error = fmt.Sprintf("its leader's node %s did not answer: %v", info.Leader, a.err)
		default:
			if q, ok = a.qs[ex.Name]; !ok {
				info.Error = fmt.Sprintf("%s no longer leads it (a new leader is being recorded)", info.Leader)
			}
		}
		info.Counters = q.Counters
		for _, node := range ex.ReplicaNodes() {
			mb := admin.ReplicaMember{Node: node, Live: live[node]}
			for _, qm := range q.Members {
				if qm.Node == node {
					mb.Known, mb.Voter, mb.Behind = true, qm.Voter, qm.Behind
				}
			}
			info.Members = append(info.Members, mb)
		}
		out = append(out, info)
	}
	return out
}

// leaderOf is the node recorded as leading ex, "" if none yet.
func leaderOf(ex meta.Exchange) string {
	if ex.LeaderTerm == 0 {
		return ""
	}
	return ex.Home
}
