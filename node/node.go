// Package node runs a Courier broker inside the process. A Node hands out
// in-process connections ([Node.Connect]) that satisfy the same
// [courier.Conn] API as network clients, and can also serve the network
// protocol to remote clients.
//
//	n, err := node.Start(node.Config{DataDir: "data"})
//	conn := n.Connect()
package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/server"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/wire"
)

// Config configures a Node.
type Config struct {
	// Name names the node in member ids, logs and the management API.
	// Default: "n1".
	Name string
	// DataDir holds the node's durable state. It is created if missing.
	// Default: "courier-data".
	DataDir string
	// Log receives structured logs. Default: slog.Default().
	Log *slog.Logger
	// Listen, when set, serves the network protocol on this TCP address,
	// such as "127.0.0.1:7400" (port 0 picks a free one; see [Node.Addr]).
	// Default: "" (in-process only).
	Listen string
	// Heartbeat is the network heartbeat interval; a client silent for
	// three intervals is disconnected. Default: 1s.
	Heartbeat time.Duration
	// MaxFrame bounds a network frame in bytes. Default: 4 MiB.
	MaxFrame int
	// SyncInterval, when set, makes durable queues fsync at most this
	// often instead of once per group of appends (group commit, the
	// default): fewer syncs, and publisher confirms that wait longer. A
	// confirmed task survives a crash either way.
	SyncInterval time.Duration
	// HTTP, when set, serves the management API, Prometheus metrics,
	// pprof and the web dashboard on this TCP address, such as
	// "127.0.0.1:7480" (port 0 picks a free one; see [Node.HTTPAddr]). It
	// must be a loopback address until Courier has users. Default: ""
	// (none); `courier server` defaults it to "127.0.0.1:7480".
	HTTP string
}

// DefaultConfig returns the configuration a Node starts with.
func DefaultConfig() Config {
	return Config{Name: "n1", DataDir: "courier-data"}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Name == "" {
		return fmt.Errorf("node: name is empty")
	}
	if c.HTTP != "" {
		if err := admin.CheckListen(c.HTTP); err != nil {
			return err
		}
	}
	return nil
}

// Node is an embedded broker.
type Node struct {
	cfg    Config
	broker *broker.Broker
	srv    *server.Server
	addr   net.Addr
	served chan struct{}
	admin  *admin.Server
	http   net.Addr
	hdone  chan struct{} // closed when the admin server stopped serving
	closed atomic.Bool
	mu     sync.Mutex // guards conns
	conns  map[*localTransport]struct{}
}

// Start starts a node.
func Start(cfg Config) (*Node, error) {
	d := DefaultConfig()
	if cfg.Name == "" {
		cfg.Name = d.Name
	}
	if cfg.DataDir == "" {
		cfg.DataDir = d.DataDir
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("node: data dir: %w", err)
	}
	n := &Node{
		cfg:    cfg,
		broker: broker.New(broker.Config{Node: cfg.Name, Log: cfg.Log}),
		conns:  make(map[*localTransport]struct{}),
	}
	sc := broker.StoreConfig{Dir: filepath.Join(cfg.DataDir, "store")}
	if cfg.SyncInterval > 0 {
		o := store.DefaultOptions()
		o.Sync, o.SyncInterval = store.Interval, cfg.SyncInterval
		sc.Options = &o
	}
	rec, err := n.broker.OpenStore(sc)
	if err != nil {
		n.broker.Close()
		return nil, fmt.Errorf("node: %w", err)
	}
	if rec.Clean() {
		cfg.Log.Info("store opened", "dir", sc.Dir, "recovery", rec)
	} else {
		cfg.Log.Warn("store recovered with damage", "dir", sc.Dir, "recovery", rec)
	}
	if cfg.Listen != "" {
		srv, err := server.New(server.Config{
			Listen: cfg.Listen, Heartbeat: cfg.Heartbeat, MaxFrame: cfg.MaxFrame, Log: cfg.Log,
		}, n.broker)
		if err != nil {
			n.broker.Close()
			return nil, err
		}
		ln, err := srv.Listen()
		if err != nil {
			n.broker.Close()
			return nil, err
		}
		n.srv, n.addr, n.served = srv, ln.Addr(), make(chan struct{})
		go func() {
			defer close(n.served)
			if err := srv.Serve(ln); err != nil && err != server.ErrServerClosed {
				cfg.Log.Error("server stopped", "err", err)
			}
		}()
	}
	if cfg.HTTP != "" {
		if err := n.startAdmin(); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// startAdmin serves the management API on Config.HTTP.
func (n *Node) startAdmin() error {
	a, err := admin.New(admin.Config{
		Listen: n.cfg.HTTP, Broker: n.broker, Node: n.cfg.Name, Log: n.cfg.Log,
		Queues:   queueSource{n.broker},
		Describe: describe,
		Listeners: func() []admin.Listener {
			if n.addr == nil {
				return nil
			}
			return []admin.Listener{{Protocol: "courier", Address: n.addr.String()}}
		},
	})
	if err != nil {
		return err
	}
	ln, err := a.Listen()
	if err != nil {
		a.Shutdown(context.Background())
		return err
	}
	n.admin, n.http, n.hdone = a, ln.Addr(), make(chan struct{})
	go func() {
		defer close(n.hdone)
		if err := a.Serve(ln); err != nil && err != http.ErrServerClosed {
			n.cfg.Log.Error("management API stopped", "err", err)
		}
	}()
	return nil
}

// describe tells the management API what a session's transport knows of
// its peer.
func describe(sink broker.Sink) (admin.ConnInfo, bool) {
	if t, ok := sink.(*localTransport); ok {
		return admin.ConnInfo{Type: "embedded", ConnectedAt: t.opened}, true
	}
	if ci, ok := server.Describe(sink); ok {
		return admin.ConnInfo{Type: "network", Peer: ci.Peer, User: ci.User, ConnectedAt: ci.ConnectedAt}, true
	}
	return admin.ConnInfo{}, false
}

// HTTPAddr returns the management API's address, or nil without HTTP.
func (n *Node) HTTPAddr() net.Addr { return n.http }

// HTTPURL returns the management API's base URL, such as
// "http://127.0.0.1:7480", or "".
func (n *Node) HTTPURL() string {
	if n.http == nil {
		return ""
	}
	return "http://" + n.http.String()
}

// Addr returns the network address served, or nil without Listen.
func (n *Node) Addr() net.Addr { return n.addr }

// URL returns the courier:// URL of the network address served, or "".
func (n *Node) URL() string {
	if n.addr == nil {
		return ""
	}
	return "courier://" + n.addr.String()
}

// Name returns the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Broker returns the routing core, for the server and the management API
// inside this module.
func (n *Node) Broker() *broker.Broker { return n.broker }

// Connect returns a new in-process connection.
func (n *Node) Connect() *courier.Conn {
	t := &localTransport{n: n, opened: time.Now()}
	t.s = n.broker.Open(t, "embedded")
	n.mu.Lock()
	n.conns[t] = struct{}{}
	n.mu.Unlock()
	c := courier.NewConn(t, courier.ConnOptions{ID: t.s.ID(), Log: n.cfg.Log})
	t.conn = c
	return c
}

// Close stops serving the network, telling remote clients, and closes
// every in-process connection.
func (n *Node) Close() error {
	if n.closed.Swap(true) {
		return nil
	}
	n.broker.StopQueues()
	if n.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n.admin.Shutdown(ctx)
		cancel()
		<-n.hdone
	}
	if n.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n.srv.Shutdown(ctx)
		cancel()
		<-n.served
	}
	n.mu.Lock()
	conns := make([]*localTransport, 0, len(n.conns))
	for t := range n.conns {
		conns = append(conns, t)
	}
	n.mu.Unlock()
	for _, t := range conns {
		t.conn.Closed(fmt.Errorf("courier: node %s closed", n.cfg.Name))
		t.Close()
	}
	return n.broker.Close()
}

// localTransport connects a Conn to the broker in-process: frames change
// hands without being encoded.
type localTransport struct {
	n      *Node
	s      *broker.Session
	conn   *courier.Conn
	recv   func(*wire.Frame)
	opened time.Time
	closed atomic.Bool
}

var (
	_ courier.Transport    = (*localTransport)(nil)
	_ courier.FuncDeclarer = (*localTransport)(nil)
	_ broker.Sink          = (*localTransport)(nil)
)

func (t *localTransport) Start(recv func(*wire.Frame)) { t.recv = recv }

// Send takes a frame from the Conn to the broker.
func (t *localTransport) Send(f *wire.Frame) error {
	if t.closed.Load() {
		f.Release()
		return courier.ErrClosed
	}
	t.s.Handle(f)
	return nil
}

// Deliver takes a frame from the broker to the Conn.
func (t *localTransport) Deliver(f *wire.Frame) {
	if t.closed.Load() {
		f.Release()
		return
	}
	t.recv(f)
}

func (t *localTransport) DeclareFuncs(name string, spec courier.ExchangeSpec) (wire.ExchangeInfo, error) {
	return t.s.DeclareFuncs(name, spec)
}

func (t *localTransport) Close() error {
	if t.closed.Swap(true) {
		return nil
	}
	t.s.Close()
	t.n.mu.Lock()
	delete(t.n.conns, t)
	t.n.mu.Unlock()
	return nil
}
