package node

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/courier-mq/courier/internal/cluster"
	"github.com/courier-mq/courier/internal/cluster/meta"
	"github.com/courier-mq/courier/internal/cluster/replica"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/wire"
)

// Replicated queues on a node of a cluster (docs/replication.md, "In the
// broker"). The node runs one replica host (internal/cluster/replica)
// with its own log in the data directory's "replicas" directory, over the
// fabric's queue-raft connections. The metadata group places each
// durable task exchange on its replica nodes; each of them opens the
// queue's group when it learns the placement, and closes it when the
// exchange is deleted. The node whose replica leads serves the queue in
// its broker ([broker.Broker.ServeReplicated]) and records itself as the
// exchange's home in the metadata; it stops serving as soon as its
// replica no longer leads.

// replicaDirName is the replica host's directory in the data directory.
const replicaDirName = "replicas"

// replicaID is a node's replica id in every group: a hash of its name,
// the same on every node (node names are unique in a cluster).
func replicaID(node string) uint64 {
	h := fnv.New64a()
	h.Write([]byte("courier-replica:" + node))
	if id := h.Sum64(); id != 0 {
		return id
	}
	return 1
}

// queueReplicas is the node's replica host and the replicated queues
// placed on it.
type queueReplicas struct {
	n    *Node
	host *replica.Host
	tr   *replica.FabricTransport
	ops  net.Listener // queue-ops connections (replicas_view.go)

	mu     sync.Mutex
	queues map[string]*replicatedQueue // by exchange name
	closed bool
}

// startReplicas opens the node's replica host.
func (n *Node) startReplicas() error {
	f := n.fabric
	self := replicaID(n.cfg.Name)
	nodeOf := func(id uint64) (string, bool) {
		for _, m := range f.Members() {
			if replicaID(m.Name) == id {
				return m.Name, true
			}
		}
		return "", false
	}
	idOf := func(name string) (uint64, bool) { return replicaID(name), true }
	log := n.cfg.Log.With("part", "replicas")
	tr := replica.NewFabricTransport(f, self, nodeOf, idOf, log)
	so := store.DefaultOptions()
	if n.cfg.MinFreeDisk != 0 {
		so.MinFreeDisk = int64(n.cfg.MinFreeDisk)
	}
	h, err := replica.NewHost(store.OSFS{}, filepath.Join(n.cfg.DataDir, replicaDirName), replica.Config{
		ID: self, Transport: tr, Store: so, Logger: log,
	})
	if err != nil {
		_ = tr.Close()
		return fmt.Errorf("node: replica host: %w", err)
	}
	n.replicas = &queueReplicas{n: n, host: h, tr: tr, queues: map[string]*replicatedQueue{}, ops: f.Listener(cluster.KindQueueOps)}
	n.broker.SetReplicated(n.replicas)
	go n.replicas.serveOps(n.replicas.ops)
	return nil
}

// handOverTimeout bounds how long a graceful shutdown waits for the
// node's replicated queues' leaderships to move to other nodes.
const handOverTimeout = 10 * time.Second

// handOver moves the leadership of every replicated queue this node
// leads to another replica, before a graceful shutdown: the queues stay
// served while the node is away, with no election to wait for.
func (r *queueReplicas) handOver(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, handOverTimeout)
	defer cancel()
	start := time.Now()
	led, left, err := r.host.HandOver(ctx)
	if led == 0 && err == nil {
		return
	}
	log := r.n.cfg.Log.Info
	if left > 0 || err != nil {
		log = r.n.cfg.Log.Warn
	}
	log("replicated queues handed over", "led", led, "still_led", left, "took", time.Since(start), "err", err)
}

// close stops every replicated queue and the host.
func (r *queueReplicas) close() {
	r.mu.Lock()
	r.closed = true
	qs := r.queues
	r.queues = map[string]*replicatedQueue{}
	r.mu.Unlock()
	_ = r.ops.Close()
	for _, q := range qs {
		q.stopAndWait(fmt.Sprintf("node %s is shutting down", r.n.cfg.Name))
	}
	if err := r.host.Close(); err != nil {
		r.n.cfg.Log.Warn("replica host close", "err", err)
	}
	_ = r.tr.Close()
}

// Queue implements broker.Replicated from the metadata group's state on
// this node: the leader is the home its replica recorded, "" until one
// did.
func (r *queueReplicas) Queue(name string) (wire.ExchangeConfig, string, bool) {
	m := r.n.hooks.meta.Load()
	if m == nil {
		return wire.ExchangeConfig{}, "", false
	}
	ex, ok := m.Exchange(name)
	if !ok || !ex.Replicated() {
		return wire.ExchangeConfig{}, "", false
	}
	if ex.LeaderTerm == 0 {
		return ex.Config, "", true
	}
	return ex.Config, ex.Home, true
}

// placed opens the group of a replicated queue this node holds a replica
// of; it runs on the metadata group's apply goroutine, and returns at
// once (the queue's own goroutine opens the group).
func (r *queueReplicas) placed(ex meta.Exchange) {
	self := r.n.cfg.Name
	mine := false
	for _, node := range ex.ReplicaNodes() {
		mine = mine || node == self
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.queues[ex.Name]
	if old != nil && old.ex.Group == ex.Group && mine {
		old.ex = ex // a new home or membership; the group is the same
		select {
		case old.kick <- struct{}{}:
		default:
		}
		return
	}
	if old != nil {
		why := fmt.Sprintf("exchange %q was deleted", ex.Name)
		if old.ex.Group == ex.Group {
			why = fmt.Sprintf("queue %q: this node's replica was removed", ex.Name)
		}
		delete(r.queues, ex.Name)
		go old.stopAndWait(why)
	}
	if !mine || r.closed {
		return
	}
	q := &replicatedQueue{r: r, ex: ex, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	r.queues[ex.Name] = q
	go q.run(old)
}

// removed closes the group of a deleted replicated queue.
func (r *queueReplicas) removed(name string) {
	r.mu.Lock()
	q := r.queues[name]
	delete(r.queues, name)
	r.mu.Unlock()
	if q != nil {
		go q.stopAndWait(fmt.Sprintf("exchange %q was deleted", name))
	}
}

// group returns the open group of the replicated queue name on this
// node, or nil; for tests.
func (r *queueReplicas) group(name string) *replica.Group {
	r.mu.Lock()
	q := r.queues[name]
	r.mu.Unlock()
	if q == nil {
		return nil
	}
	q.gmu.Lock()
	defer q.gmu.Unlock()
	return q.g
}

// replicatedQueue is one replicated queue placed on this node: its
// goroutine opens the group, serves the queue while this replica leads,
// and closes the group when the queue is deleted or the node stops.
type replicatedQueue struct {
	r    *queueReplicas
	ex   meta.Exchange // guarded by r.mu once running
	kick chan struct{} // leadership changed
	stop chan struct{}
	done chan struct{}
	once sync.Once
	why  string

	gmu sync.Mutex
	g   *replica.Group
	st  *replica.JournalState
}

// queueSM is a queue's state machine: the replicated journal's state,
// with leadership changes kicking the queue's goroutine.
type queueSM struct {
	*replica.JournalState
	kick chan struct{}
}

// LeaderChanged implements replica.LeaderObserver.
func (s queueSM) LeaderChanged(uint64, uint64) {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// leaderCheck is how often a queue's goroutine looks at its group's
// leader besides the kicks.
const leaderCheck = time.Second

func (q *replicatedQueue) stopAndWait(why string) {
	q.once.Do(func() {
		q.why = why
		close(q.stop)
	})
	<-q.done
}

func (q *replicatedQueue) exchange() meta.Exchange {
	q.r.mu.Lock()
	defer q.r.mu.Unlock()
	return q.ex
}

func (q *replicatedQueue) run(prev *replicatedQueue) {
	defer close(q.done)
	if prev != nil {
		<-prev.done // the exchange's former group is closed first
	}
	r := q.r
	ex := q.exchange()
	log := r.n.cfg.Log.With("queue", ex.Name, "group", ex.Group)
	var peers []uint64
	for _, node := range ex.ReplicaNodes() {
		peers = append(peers, replicaID(node))
	}
	if joining(ex, r.n.cfg.Name) {
		peers = nil // added to a running group: the leader sends the log
	}
	st := replica.NewJournalState()
	g, err := r.host.Group(replica.GroupID(ex.Group), peers, queueSM{JournalState: st, kick: q.kick})
	if err != nil {
		if !errors.Is(err, replica.ErrClosed) {
			log.Error("replicated queue: opening its group failed", "err", err)
		}
		return
	}
	q.gmu.Lock()
	q.g, q.st = g, st
	q.gmu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-q.stop
		cancel()
	}()
	s := &serving{q: q, g: g, st: st, log: log}
	t := time.NewTicker(leaderCheck)
	defer t.Stop()
	for {
		s.reconcile(ctx)
		s.manage(ctx)
		select {
		case <-q.stop:
			s.stop(q.why)
			if err := r.host.CloseGroup(g.ID()); err != nil {
				log.Warn("replicated queue: closing its group", "err", err)
			}
			return
		case <-q.kick:
		case <-t.C:
		}
	}
}

// serving is the state of a queue's goroutine: the term in which this
// node serves the queue, 0 when it does not.
type serving struct {
	servingOps
	q    *replicatedQueue
	g    *replica.Group
	st   *replica.JournalState
	log  *slog.Logger
	term uint64
}

// reconcile serves the queue when this replica leads, and stops serving
// it when it does not, or leads another term (the journal of the former
// term may have lost proposals: the queue is rebuilt from the replica).
func (s *serving) reconcile(ctx context.Context) {
	self := s.q.r.host.ID()
	leader, term := s.g.Leader()
	if leader == self && term == s.term {
		return
	}
	if s.term != 0 {
		s.stop(fmt.Sprintf("queue %q: this node's replica no longer leads (term %d); its new leader serves it", s.q.exchange().Name, term))
	}
	if leader != self {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := s.g.WaitLeaderReady(wctx)
	cancel()
	if err != nil {
		return // the next kick or check tries again
	}
	if l, t := s.g.Leader(); l != self || t != term {
		return
	}
	ex := s.q.exchange()
	j := replica.NewJournal(s.g, s.st)
	r := s.q.r
	if err := r.n.broker.ServeReplicated(ex.Name, ex.Config, ex.DeclaredBy, ex.DeclaredBy == "", j, s.st.Replay); err != nil {
		r.n.cfg.Log.Error("replicated queue: serving failed", "queue", ex.Name, "err", err)
		return
	}
	s.term = term
	s.log.Info("replicated queue: this node leads", "term", term)
	go s.q.recordLeader(ctx, ex, term)
}

// stop stops serving the queue here.
func (s *serving) stop(why string) {
	if s.term == 0 {
		return
	}
	s.q.r.n.broker.StopServing(s.q.exchange().Name, why)
	s.term = 0
}

// recordLeader records this node as the queue's home in the metadata
// group, retrying until it is recorded, a later term is, or ctx ends.
func (q *replicatedQueue) recordLeader(ctx context.Context, ex meta.Exchange, term uint64) {
	m := q.r.n.hooks.meta.Load()
	if m == nil {
		return
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := m.QueueLeader(cctx, ex.Name, ex.Group, term)
		cancel()
		if err == nil || errors.Is(err, meta.ErrStale) || ctx.Err() != nil {
			if err != nil {
				q.r.n.cfg.Log.Debug("replicated queue: recording its leader", "queue", ex.Name, "term", term, "err", err)
			}
			return
		}
		q.r.n.cfg.Log.Debug("replicated queue: recording its leader, will retry", "queue", ex.Name, "term", term, "err", err)
		var we *wire.Error
		if errors.As(err, &we) && we.Code == wire.CodeNotFound {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// restore makes the replicated queues placed on this node those of st,
// the metadata group's whole state after a snapshot was loaded.
func (r *queueReplicas) restore(st meta.State) {
	r.mu.Lock()
	var gone []string
	for name, q := range r.queues {
		if ex, ok := st.Exchanges[name]; !ok || ex.Group != q.ex.Group {
			gone = append(gone, name)
		}
	}
	r.mu.Unlock()
	for _, name := range gone {
		r.removed(name)
	}
	for _, ex := range st.Exchanges {
		if ex.Replicated() {
			r.placed(ex)
		}
	}
}
