package broker

import (
	"fmt"
	"time"

	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/wire"
)

// Replicated queues (docs/replication.md, "In the broker"). In a
// cluster, a durable task exchange is one Raft group over its replica
// nodes (internal/cluster/replica), placed by the catalog. The node
// drives it: on the node whose replica leads the group, it calls
// [Broker.ServeReplicated], and the broker runs the task exchange there
// with today's queue code on the group's journal; when that replica
// stops leading, or the exchange is deleted, the node calls
// [Broker.StopServing]. Every other node knows the exchange only through
// [Replicated]: an operation on it there is refused with
// wire.CodeUnavailable naming the node that serves it.

// Replicated tells the broker about the cluster's replicated queues.
type Replicated interface {
	// Queue returns the replicated task exchange name's configuration
	// as the catalog recorded it (replicas filled in), and the node
	// whose replica leads its group ("" while none is known); ok is
	// false when name is not a replicated queue.
	Queue(name string) (cfg wire.ExchangeConfig, leader string, ok bool)
}

// SetReplicated makes the broker ask r about replicated queues. Call it
// before clients connect.
func (b *Broker) SetReplicated(r Replicated) { b.repl.Store(&r) }

func (b *Broker) replicated() Replicated {
	if r := b.repl.Load(); r != nil {
		return *r
	}
	return nil
}

// notServedHere returns the error for an operation on name, unknown to
// this broker, when name is a replicated queue served elsewhere (or by
// no node yet); nil otherwise.
func (b *Broker) notServedHere(name string) error {
	r := b.replicated()
	if r == nil {
		return nil
	}
	_, leader, ok := r.Queue(name)
	switch {
	case !ok:
		return nil
	case leader == "" || leader == b.cfg.Node:
		return wire.Errorf(wire.CodeUnavailable, "queue %q has no leader yet (its replicas are electing one); try again", name)
	}
	return wire.Errorf(wire.CodeUnavailable, "queue %q is served by node %s, the leader of its replicas, and the link to it is down; try again, or use %s", name, leader, leader)
}

// ServeReplicated runs the replicated task exchange name on this node,
// its group's leader: the queue is rebuilt from the records replay hands
// over (the replica's live records, in log order) and journals to j,
// the group's journal, which confirms a task once a majority of the
// replicas has it on disk. declaredBy and trusted are the declarer's,
// as for [Broker.ApplyDeclare]. In-flight deliveries of a former leader
// are not in the records: their tasks come back ready, without a failed
// attempt.
func (b *Broker) ServeReplicated(name string, cfg wire.ExchangeConfig, declaredBy string, trusted bool, j queue.Journal, replay func(func(queue.Entry) error) error) error {
	if cfg.Pattern != wire.PatternTasks {
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: only task exchanges are replicated", name)
	}
	by := Declarer{User: declaredBy}
	if !trusted {
		by.Policy = b.cfg.Policy
	}
	rb := queue.NewRebuilder() // bodies in memory: the journal is no Reader
	err := replay(func(e queue.Entry) error {
		if err := rb.Apply(e); err != nil {
			b.log.Warn("replicated queue: skipped a record", "queue", name, "err", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("broker: replicated queue %q: %w", name, err)
	}
	def := queueDef{Name: name, Exchange: name, Config: cfg, DeclaredBy: declaredBy, Trusted: trusted}
	rq := &recoveredQueue{def: def, rb: rb, journal: j}
	ex, err := b.declareHere(name, Spec{ExchangeConfig: cfg}, by, rq, nil)
	if err != nil {
		return err
	}
	if ex.tq == nil || !ex.tq.replicated {
		return wire.Errorf(wire.CodeClash, "exchange %q exists on this node and is not its replicated queue", name)
	}
	b.log.Info("replicated queue: serving as its leader", "queue", name, "messages", ex.tq.q.Stats().Messages())
	return nil
}

// StopServing stops serving the replicated queue name on this node: its
// workers are detached with why, their tasks stay in the group (a new
// leader delivers them again), and the queue is closed without touching
// its records. Nothing is done when this node does not serve it.
func (b *Broker) StopServing(name, why string) {
	b.mu.Lock()
	v, ok := b.exchanges.Load(name)
	if ok {
		if ex := v.(*Exchange); ex.tq == nil || !ex.tq.replicated {
			ok = false
		} else {
			b.exchanges.Delete(name)
			b.exVersion.Add(1)
		}
	}
	b.mu.Unlock()
	if !ok {
		return
	}
	ex := v.(*Exchange)
	tq := ex.tq
	// Closed first, not purged: from now on it delivers nothing and
	// journals nothing (a worker's tasks do not come back as failed
	// attempts: a new leader delivers them again as they are), and its
	// records, the group's, stay.
	tq.q.Close()
	ex.closeWith(why)
	b.qmu.Lock()
	if v, ok := b.queues.Load(name); ok && v == tq {
		b.removeQueue(name)
	}
	b.qmu.Unlock()
	consumers := tq.attachedConsumers()
	for _, a := range consumers {
		tq.detachConsumer(a)
	}
	b.log.Info("replicated queue: no longer served here", "queue", name, "why", why)
}

// declareReplicated finishes a declaration of a replicated task exchange
// that the catalog recorded: it waits until the queue's group has a
// leader (bounded by catalogTimeout), and returns the exchange if this
// node serves it, or else a stand-in that describes it.
func (b *Broker) declareReplicated(name string, spec Spec, deadline time.Time) (*Exchange, error) {
	r := b.replicated()
	for {
		if ex := b.Exchange(name); ex != nil {
			return ex, ex.matches(spec)
		}
		cfg, leader, ok := r.Queue(name)
		if !ok {
			return nil, wire.Errorf(wire.CodeNotFound, "exchange %q was deleted as it was declared", name)
		}
		if leader != "" && leader != b.cfg.Node {
			ex, err := newExchange(b, name, Spec{ExchangeConfig: cfg})
			if err != nil {
				return nil, err
			}
			return ex, ex.matches(spec)
		}
		if time.Now().After(deadline) {
			return nil, wire.Errorf(wire.CodeUnavailable, "queue %q was declared, but its replicas elected no leader within %s; try again", name, catalogTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
