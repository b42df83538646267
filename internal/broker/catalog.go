package broker

import (
	"context"
	"errors"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/wire"
)

// In a cluster, exchanges are declared and deleted through a catalog that
// every node shares (the metadata Raft group, docs/cluster.md): the
// broker where a client declares asks the catalog, which applies the
// declaration on every node, in one order, by calling that node's
// [Broker.ApplyDeclare]. The call returns once the local broker has
// applied it, so a client reads its own writes on the node it uses.

// Catalog replicates declarations across the nodes of a cluster.
type Catalog interface {
	// Declare records exchange name with cfg, declared by user (trusted
	// when the declarer may do anything), unless an exchange of that
	// name is recorded already. It returns once this node's broker has
	// applied the record, or the error that kept it from being recorded.
	Declare(ctx context.Context, name string, cfg wire.ExchangeConfig, user string, trusted bool) error
	// Delete removes exchange name's record, returning once this node's
	// broker has applied it; wire.CodeNotFound if there is none.
	Delete(ctx context.Context, name string) error
	// Sync returns once this node's broker has applied every record the
	// catalog held when Sync was called: a read after it is
	// linearizable.
	Sync(ctx context.Context) error
}

// MatchingCatalog is a Catalog that can judge a declaration against an
// exchange it records by the declaration as the client made it (match,
// fields left out match anything) while creating a new one from cfg
// (the declaring node's defaults filled in). The broker then sends a
// declaration of an exchange it does not know to the catalog at once,
// without syncing first.
type MatchingCatalog interface {
	Catalog
	DeclareMatching(ctx context.Context, name string, cfg, match wire.ExchangeConfig, user string, trusted bool) error
}

// catalogTimeout bounds a declaration's wait for the catalog.
const catalogTimeout = 10 * time.Second

// ErrFuncsInCluster refuses, in a cluster, an exchange whose routing is a
// Go function: a function cannot be replicated to the other nodes.
var ErrFuncsInCluster = &wire.Error{Code: wire.CodeBadOptions, Msg: courier.ErrFuncsNotReplicable.Error()}

// ErrTasksInCluster refuses, in a cluster, a transient task exchange: a
// cluster's task queues are replicated (a Raft group over their replica
// nodes, on disk), which a queue kept in memory only is not.
var ErrTasksInCluster = wire.Errorf(wire.CodeBadOptions, "transient task exchanges are not available in a cluster: a cluster's queues are replicated on disk (docs/queues.md, \"Replicated queues\"); declare it durable")

// SetCatalog makes the broker declare and delete exchanges through c.
// Call it before clients connect.
func (b *Broker) SetCatalog(c Catalog) { b.cat.Store(&c) }

// Clustered reports whether the broker declares through a cluster's
// catalog (see SetCatalog).
func (b *Broker) Clustered() bool { return b.catalog() != nil }

func (b *Broker) catalog() Catalog {
	if c := b.cat.Load(); c != nil {
		return *c
	}
	return nil
}

// declareCluster declares through the catalog: an exchange this node
// knows is checked here; an unknown one is checked (its options, its
// expressions, vet) here too before the catalog records it, and is then
// the one every node applies.
func (b *Broker) declareCluster(c Catalog, name string, spec Spec, by Declarer, vet func(*Exchange) error) (*Exchange, error) {
	if !ValidName(name) {
		return b.declareHere(name, spec, by, nil, vet) // the same error
	}
	if spec.KeyFunc != nil || spec.RouteFunc != nil {
		return nil, ErrFuncsInCluster
	}
	ctx, cancel := context.WithTimeout(context.Background(), catalogTimeout)
	defer cancel()
	// This node's copy may lag: another node may have declared the
	// exchange a moment ago, or deleted it. An exchange this node knows,
	// or a passive declare, is answered from the local copy after a
	// sync, which makes it linearizable: it sees every write that
	// completed before this call. An exchange this node does not know
	// goes at once to a MatchingCatalog: its state machine creates it,
	// or judges the declaration as made against the one declared
	// elsewhere, in log order (one round trip to the leader rather than
	// two).
	ex := b.Exchange(name)
	mc, matching := c.(MatchingCatalog)
	if ex != nil || spec.Passive || !matching {
		if err := c.Sync(ctx); err != nil {
			return nil, catalogError(err)
		}
		ex = b.Exchange(name)
	}
	if ex != nil {
		if err := ex.matches(spec); err != nil {
			return ex, err
		}
		ex.adopt(spec, by)
		return ex, nil
	}
	deadline := time.Now().Add(catalogTimeout)
	if r := b.replicated(); r != nil {
		if _, _, ok := r.Queue(name); ok {
			return b.declareReplicated(name, spec, deadline)
		}
	}
	if spec.Passive {
		return nil, wire.Errorf(wire.CodeNotFound, "exchange %q not found", name)
	}
	if err := spec.ExchangeConfig.Check(); err != nil {
		return nil, wire.Errorf(wire.CodeBadOptions, "exchange %q: %v", name, err)
	}
	if spec.Pattern == wire.PatternTasks && (spec.Transient || b.replicated() == nil) {
		return nil, ErrTasksInCluster
	}
	probe, err := newExchange(b, name, spec)
	if err != nil {
		return nil, err
	}
	if vet != nil {
		if err := vet(probe); err != nil {
			return nil, err
		}
	}
	if matching {
		err = mc.DeclareMatching(ctx, name, probe.cfg, spec.ExchangeConfig, by.User, by.Policy == nil)
	} else {
		err = c.Declare(ctx, name, probe.cfg, by.User, by.Policy == nil)
	}
	if err != nil {
		return nil, catalogError(err)
	}
	if spec.Pattern == wire.PatternTasks {
		return b.declareReplicated(name, spec, deadline)
	}
	ex = b.Exchange(name)
	if ex == nil {
		// Deleted again before this call could look.
		return nil, wire.Errorf(wire.CodeNotFound, "exchange %q was deleted as it was declared", name)
	}
	return ex, ex.matches(spec)
}

// deleteCluster deletes through the catalog.
func (b *Broker) deleteCluster(c Catalog, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), catalogTimeout)
	defer cancel()
	return catalogError(c.Delete(ctx, name))
}

// catalogError turns a catalog's error into a wire error for the client.
func catalogError(err error) error {
	var we *wire.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &we):
		return we
	case errors.Is(err, context.DeadlineExceeded):
		return wire.Errorf(wire.CodeUnavailable, "the cluster's catalog did not answer within %s: %v", catalogTimeout, err)
	}
	return wire.Errorf(wire.CodeUnavailable, "the cluster's catalog: %v", err)
}

// ApplyDeclare declares exchange name with cfg on this node, as the
// catalog recorded it: the catalog calls it on every node, in the order
// of its records. declaredBy is the declarer's user; trusted, whether it
// may do anything (then the node's policy is not asked).
func (b *Broker) ApplyDeclare(name string, cfg wire.ExchangeConfig, declaredBy string, trusted bool) error {
	by := Declarer{User: declaredBy}
	if !trusted {
		by.Policy = b.cfg.Policy
	}
	_, err := b.declareHere(name, Spec{ExchangeConfig: cfg}, by, nil, nil)
	return err
}

// ApplyDelete deletes exchange name on this node, as the catalog
// recorded it; deleting an exchange this node does not know is no error.
func (b *Broker) ApplyDelete(name string) error {
	if b.Exchange(name) == nil {
		return nil
	}
	return b.deleteHere(name)
}
