package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/cluster"
	"github.com/courier-mq/courier/internal/cluster/meta"
	"github.com/courier-mq/courier/wire"
)

// A node of a cluster ties three things together here: the fabric's
// links carry its broker's frames to the other nodes' brokers (the
// broker's Peers), and the metadata group (internal/cluster/meta), over
// the fabric's authenticated streams, is the catalog of its exchanges and
// the keeper of its users. The group's observer applies every change, in
// log order, to this node's broker and users.

// metaDirName is the metadata group's directory in the data directory.
const metaDirName = "meta"

// joinCluster wires the started fabric to the broker and starts the
// metadata group.
func (n *Node) joinCluster() error {
	f := n.fabric
	if f == nil {
		return nil
	}
	n.broker.SetPeers(fabricPeers{f})
	f.SetHandler(n.broker)
	if err := n.startReplicas(); err != nil {
		return err
	}
	expect := n.cfg.Cluster.BootstrapExpect
	if expect == 0 {
		expect = 1 + len(n.cfg.Cluster.Join)
	}
	if expect < 0 {
		expect = 0
	}
	obs := &metaObserver{n: n}
	m, err := meta.New(meta.Config{
		NodeID: n.cfg.Name, Dir: filepath.Join(n.cfg.DataDir, metaDirName), Advertise: n.cfg.Name,
		Stream:          &raftStream{Listener: f.Listener(cluster.KindRaft), f: f},
		Forward:         &forwardLayer{Listener: f.Listener(cluster.KindMetaRPC), f: f},
		BootstrapExpect: expect, Observer: obs, Log: n.cfg.Log.With("part", "meta"),
	})
	if err != nil {
		n.replicas.close()
		n.replicas = nil
		return fmt.Errorf("node: metadata group: %w", err)
	}
	n.meta = m
	n.hooks.meta.Store(m)
	n.broker.SetCatalog(metaCatalog{m})
	n.users.SetRemote(metaUsers{m})
	n.metaStop = make(chan struct{})
	n.metaDone = make(chan struct{})
	go n.reconcileLoop()
	return nil
}

// leaveCluster stops the metadata group's loop and the group.
func (n *Node) leaveCluster() {
	if n.replicas != nil {
		n.replicas.close()
	}
	if n.meta == nil {
		return
	}
	close(n.metaStop)
	<-n.metaDone
	if err := n.meta.Shutdown(); err != nil {
		n.cfg.Log.Warn("metadata group shutdown", "err", err)
	}
}

// reconcileEvery is how often the metadata group is told the fabric's
// live members (bootstrap, and the leader adding the nodes it lacks).
const reconcileEvery = 500 * time.Millisecond

func (n *Node) reconcileLoop() {
	defer close(n.metaDone)
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	for {
		var members []meta.Member
		for _, m := range n.fabric.Members() {
			if m.State == "alive" || m.State == "suspect" {
				members = append(members, meta.Member{ID: m.Name, Addr: m.Name})
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := n.meta.Reconcile(ctx, members); err != nil && !errors.Is(err, meta.ErrClosed) {
			n.cfg.Log.Debug("metadata group: reconcile", "err", err)
		}
		cancel()
		select {
		case <-n.metaStop:
			return
		case <-t.C:
		}
	}
}

// Meta returns the node's metadata group, or nil for a single node; for
// the packages of this module.
func (n *Node) Meta() *meta.Meta { return n.meta }

// fabricPeers makes the fabric the broker's links to other nodes. The
// broker hands its frames over; the fabric encodes them at once. A link
// that cannot take a frame is cut, so that the broker's PeerDown follows
// rather than a silent loss (a lost interest or view would stay wrong
// until the link next failed).
type fabricPeers struct{ f *cluster.Fabric }

func (p fabricPeers) Send(node string, fr *wire.Frame) error {
	return p.send(node, fr, p.f.Send)
}

func (p fabricPeers) SendControl(node string, fr *wire.Frame) error {
	return p.send(node, fr, p.f.SendControl)
}

func (p fabricPeers) send(node string, fr *wire.Frame, send func(string, *wire.Frame) error) error {
	err := send(node, fr)
	fr.Release()
	if errors.Is(err, cluster.ErrLinkFull) {
		// Not from inside Send: the broker may hold its locks here.
		go p.f.Cut(node, "a frame found the link's outbox full")
	}
	return err
}

// raftStream is the metadata group's Raft transport over the fabric:
// addresses are node names.
type raftStream struct {
	net.Listener
	f *cluster.Fabric
}

func (s *raftStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return s.f.Dial(ctx, string(addr), cluster.KindRaft)
}

// forwardLayer carries the metadata group's forwarded commands over the
// fabric; its connections say which node is at the other end.
type forwardLayer struct {
	net.Listener
	f *cluster.Fabric
}

func (l *forwardLayer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if cc, ok := c.(*cluster.Conn); ok {
		return peerConn{Conn: c, peer: cc.Peer()}, nil
	}
	return c, nil
}

func (l *forwardLayer) Dial(ctx context.Context, id, _ string) (net.Conn, error) {
	return l.f.Dial(ctx, id, cluster.KindMetaRPC)
}

// peerConn is a forwarding connection that knows its peer node.
type peerConn struct {
	net.Conn
	peer string
}

func (c peerConn) PeerNode() string { return c.peer }

// metaCatalog is the metadata group as the broker's catalog.
type metaCatalog struct{ m *meta.Meta }

func (c metaCatalog) Declare(ctx context.Context, name string, cfg wire.ExchangeConfig, user string, _ bool) error {
	_, _, err := c.m.Declare(ctx, name, cfg, meta.DeclareOptions{By: user})
	return err
}

// DeclareMatching makes metaCatalog a broker.MatchingCatalog.
func (c metaCatalog) DeclareMatching(ctx context.Context, name string, cfg, match wire.ExchangeConfig, user string, _ bool) error {
	_, _, err := c.m.Declare(ctx, name, cfg, meta.DeclareOptions{By: user, Match: &match})
	return err
}

func (c metaCatalog) Delete(ctx context.Context, name string) error { return c.m.Delete(ctx, name) }

func (c metaCatalog) Sync(ctx context.Context) error { return c.m.Sync(ctx) }

// metaUsers is the metadata group as the user store's remote.
type metaUsers struct{ m *meta.Meta }

func (u metaUsers) PutUser(ctx context.Context, name string, ch auth.UserChange) (bool, error) {
	return u.m.PutUser(ctx, name, ch)
}

func (u metaUsers) DeleteUser(ctx context.Context, name string) error {
	return u.m.DeleteUser(ctx, name)
}

// metaObserver applies the metadata group's changes to this node. It
// runs on the group's apply goroutine, in log order.
type metaObserver struct {
	n *Node
}

func (o *metaObserver) Apply(c meta.Change) {
	n := o.n
	var err error
	switch {
	case c.Exchange.Replicated() && (c.Kind == meta.ExchangeDeclared || c.Kind == meta.ExchangeRehomed || c.Kind == meta.ReplicasChanged):
		// Served where its group's leader is (replicas.go).
		n.replicas.placed(c.Exchange)
		return
	case c.Exchange.Replicated() && c.Kind == meta.ExchangeDeleted:
		n.replicas.removed(c.Exchange.Name)
		return
	}
	switch c.Kind {
	case meta.ExchangeDeclared:
		err = n.broker.ApplyDeclare(c.Exchange.Name, c.Exchange.Config, c.Exchange.DeclaredBy, c.Exchange.DeclaredBy == "")
	case meta.ExchangeDeleted:
		err = n.broker.ApplyDelete(c.Exchange.Name)
	case meta.UserPut, meta.PermissionsChanged:
		err = n.users.ApplyUser(c.User)
	case meta.UserDeleted:
		err = n.users.ApplyDeleteUser(c.User.Name)
	case meta.ExchangeRehomed, meta.NodeChanged:
		// Off the group's apply goroutine: the broker reads the homes
		// back from the group.
		go n.broker.RecheckHomes()
	}
	if err != nil {
		n.cfg.Log.Error("metadata group: applying a change on this node failed", "change", c.Kind, "exchange", c.Exchange.Name, "user", c.User.Name, "err", err)
	}
}

// Restore makes this node's exchanges and users those of st: the group's
// whole state, when this node loads a snapshot. Exchanges this node has
// and st does not are deleted, except task exchanges, whose queues live
// in this node's store (they are kept, and logged).
func (o *metaObserver) Restore(st meta.State) {
	n := o.n
	users := make([]auth.User, 0, len(st.Users))
	for _, u := range st.Users {
		users = append(users, u)
	}
	slices.SortFunc(users, func(a, b auth.User) int { return strings.Compare(a.Name, b.Name) })
	if err := n.users.ApplyUsers(users); err != nil {
		n.cfg.Log.Error("metadata group: restoring the users failed", "err", err)
	}
	n.replicas.restore(st)
	for _, info := range n.broker.Exchanges() {
		if _, ok := st.Exchanges[info.Name]; ok {
			continue
		}
		if info.Pattern == wire.PatternTasks {
			n.cfg.Log.Warn("metadata group: a task exchange of this node is not in the cluster's catalog; kept on this node", "exchange", info.Name)
			continue
		}
		if err := n.broker.ApplyDelete(info.Name); err != nil {
			n.cfg.Log.Error("metadata group: restore: deleting an exchange", "exchange", info.Name, "err", err)
		}
	}
	for _, ex := range st.Exchanges {
		if ex.Replicated() {
			continue // placed above
		}
		if err := n.broker.ApplyDeclare(ex.Name, ex.Config, ex.DeclaredBy, ex.DeclaredBy == ""); err != nil {
			n.cfg.Log.Error("metadata group: restore: declaring an exchange", "exchange", ex.Name, "err", err)
		}
	}
	go n.broker.RecheckHomes()
}

// clusterHooks answer the broker's questions about the cluster from the
// metadata group: an exchange's home node, and this node's lease. Alone
// (no group yet, or none at all) every exchange is at home here.
type clusterHooks struct {
	node string
	meta atomic.Pointer[meta.Meta]
}

// home returns the home node of a request-response exchange and its
// fencing epoch, which only grows (the index of the record that gave the
// exchange that home).
func (h *clusterHooks) home(exchange string) (string, uint64) {
	m := h.meta.Load()
	if m == nil {
		return h.node, 0
	}
	ex, ok := m.Exchange(exchange)
	if !ok {
		return h.node, 0
	}
	return ex.Home, ex.HomeEpoch()
}

// leaseValid reports whether this node's liveness lease holds: while it
// does not, the node acts as home for nothing.
func (h *clusterHooks) leaseValid() bool {
	m := h.meta.Load()
	return m == nil || m.LeaseValid()
}

// forgetNode is the management API's DELETE /api/nodes/{name} of a node
// of a cluster; nil for a single node.
func (n *Node) forgetNode() func(ctx context.Context, name string) error {
	if !n.cfg.Cluster.Enabled() {
		return nil
	}
	return func(ctx context.Context, name string) error {
		m := n.meta
		if m == nil {
			return fmt.Errorf("%w: the metadata group is not running", admin.ErrUnavailable)
		}
		err := m.Remove(ctx, name)
		switch {
		case errors.Is(err, meta.ErrUnknownNode):
			return fmt.Errorf("%w: %w", admin.ErrUnknownNode, err)
		case errors.Is(err, meta.ErrNoQuorum), errors.Is(err, meta.ErrBehind):
			return fmt.Errorf("%w: %w", admin.ErrUnavailable, err)
		}
		return err
	}
}
