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
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/cluster"
	"github.com/courier-mq/courier/internal/cluster/meta"
	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/internal/server"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/supervise"
	"github.com/courier-mq/courier/wire"
)

// Config configures a Node. The toml keys are those of the
// configuration file of `courier server` (docs/operations.md).
type Config struct {
	// Name names the node in connection and member ids ("n1/c7.2"),
	// logs and the management API: 1 to 64 letters, digits, '-' and '_',
	// the first a letter or a digit. The data directory records the
	// name of its node ([IdentityFile]): a restart keeps it, and Start
	// refuses a data directory recorded under another name
	// ([ErrDataDirOfAnotherNode]). Default: the recorded name, or on a
	// new data directory a fresh one, the host's short name and four
	// random hexadecimal digits ("web1-3fa2").
	Name string `toml:"node"`
	// DataDir holds the node's durable state. It is created if missing.
	// Default: "courier-data".
	DataDir string `toml:"data_dir"`
	// Log receives structured logs. Default: slog.Default().
	Log *slog.Logger `toml:"-"`
	// Listen, when set, serves the network protocol on this TCP address,
	// such as "127.0.0.1:7400" (port 0 picks a free one; see [Node.Addr]).
	// Default: "" (in-process only).
	Listen string `toml:"listen"`
	// Heartbeat is the network heartbeat interval; a client silent for
	// three intervals is disconnected. Default: 1s.
	Heartbeat time.Duration `toml:"heartbeat"`
	// HTTP, when set, serves the management API, Prometheus metrics,
	// pprof and the web dashboard on this TCP address, such as
	// "127.0.0.1:7480" (port 0 picks a free one; see [Node.HTTPAddr]).
	// Default: "" (none); `courier server` defaults it to
	// "127.0.0.1:7480".
	//
	// Listen and HTTP may name an address other machines can reach only
	// when the node has users (see AdminUser): without users every client
	// is anonymous with full access, which the node allows on loopback
	// (127.0.0.0/8, ::1, localhost) only.
	HTTP string `toml:"http"`
	// AMQP, when set, serves AMQP 0-9-1 on this TCP address, such as
	// "127.0.0.1:5672" (port 0 picks a free one; see [Node.AMQPAddr]),
	// for RabbitMQ's clients (docs/amqp.md). It speaks TLS (amqps://) on
	// TLS's certificates when TLS is set. Default: "" (none);
	// `courier server` defaults it to port 5672 on the host of Listen.
	// Like Listen, it may name an address beyond loopback only when the
	// node has users.
	AMQP string `toml:"amqp"`
	// TLS serves the network protocol over TLS only, from PEM files,
	// optionally requiring client certificates. Default: none (plain TCP).
	TLS TLSFiles `toml:"tls"`
	// HTTPTLS serves the management listener over HTTPS only.
	// Default: none (plain HTTP).
	HTTPTLS TLSFiles `toml:"http_tls"`
	// WSOrigins are the browser origins, besides the management
	// listener's own, whose pages may open the WebSocket access layer
	// (ws://HTTP/ws, the client protocol over WebSocket; served when both
	// Listen and HTTP are set): host patterns such as "chat.example.com"
	// or "*.example.com", or "https://chat.example.com" to match the
	// scheme too (path.Match). Requests without an Origin header (not
	// from a browser) are always let in. Default: none (same origin
	// only).
	WSOrigins []string `toml:"ws_origins"`
	// AdminUser and AdminPassword create the first user, an administrator
	// with every permission, when the data directory has no users yet;
	// once users exist they are ignored. The users live in
	// DataDir/users.json and are managed through the management API
	// (`courier users`). `courier server` reads the password from
	// COURIER_ADMIN_PASSWORD or a file, never from its configuration.
	// Default: "" (none).
	AdminUser     string `toml:"admin_user"`
	AdminPassword string `toml:"-"`
	// MetricsAuth makes /metrics ask for credentials (any user) once the
	// node has users, like the rest of the management listener.
	// Default: false (/metrics stays open, for scrapers).
	MetricsAuth bool `toml:"metrics_auth"`
	// SyncInterval, when set, makes durable queues fsync at most this
	// often instead of once per group of appends (group commit, the
	// default): fewer syncs, and publisher confirms that wait longer. A
	// confirmed task survives a crash either way.
	SyncInterval time.Duration `toml:"sync_interval"`
	// MemoryBudget is what the node's durable queues may keep in RAM by
	// choice: past half of it they page message bodies, then the index of
	// deep queues, to disk, more the fuller it is, down to a small working
	// set at the budget; reads of paged messages come back from the page
	// cache. Raise it to keep more in RAM (docs/queues.md has the
	// trade-off, measured). -1: none (queues page only as they near the
	// high watermark, past half of it). Default: [DefaultMemoryBudget].
	MemoryBudget ByteSize `toml:"memory_budget"`
	// MemoryHighWatermark is what the node's queues may hold in RAM at
	// all, including what cannot page (transient queues; keyed, delayed
	// and retried messages; those in flight): past 85% of it the
	// publishers of the queues holding the most are slowed; at 100% (the
	// memory alarm) every publisher waits until it falls under 95%. It is
	// at least MemoryBudget. It does not count connections' buffers:
	// leave room for them. -1: none. Default: 40% of the machine's memory
	// (or its cgroup limit), as RabbitMQ's vm_memory_high_watermark.
	MemoryHighWatermark ByteSize `toml:"memory_high_watermark"`
	// MinFreeDisk is the free space of the data directory's file system
	// under which the disk alarm goes on: publishers of durable queues get
	// no credit until it is back (consumers go on, and their acks free
	// space). -1: no check. Default: 1 GiB.
	MinFreeDisk ByteSize `toml:"min_free_disk"`
	// ScrubRate is the pace, in bytes a second, of the store's
	// background check after each start: it reads every record the
	// start did not verify (those before the last checkpoint) and
	// reports those whose checksum fails, in the log, the management
	// API's overview and the courier_store_damaged_records metric.
	// -1: no check. Default: 64 MiB.
	ScrubRate ByteSize `toml:"scrub_rate"`
	// DrainTimeout bounds how long [Node.Shutdown] waits for requests in
	// flight to finish. Default: 10s.
	DrainTimeout time.Duration `toml:"drain_timeout"`
	// tuneStore, set by tests, adjusts the store's options.
	tuneStore func(*store.Options)
	// Limits protect the node from clients that ask too much.
	Limits Limits `toml:"limits"`
	// Supervision sets the restart intensity of the node's components.
	Supervision Supervision `toml:"supervision"`
	// Cluster makes the node one of a cluster. Default: none (a single
	// node).
	Cluster ClusterConfig `toml:"cluster"`
}

// Limits bound what clients may take of a node. Reaching one refuses
// only that operation or connection, with an error of its own code
// (docs/protocol.md), and loses nothing already accepted. Zero fields
// take their defaults.
type Limits struct {
	// MaxFrame bounds a network frame in bytes. Default: 4 MiB.
	MaxFrame int `toml:"max_frame"`
	// MaxConns bounds the network connections of the node that have
	// logged in (their HELLO succeeded). Default: 65536.
	MaxConns int `toml:"max_connections"`
	// MaxHandshakes bounds the network connections still in their
	// handshake (accepted, no answered HELLO yet), which do not count
	// against MaxConns. Default: 1024.
	MaxHandshakes int `toml:"max_handshakes"`
	// MaxHandshakesPerAddr bounds the connections in their handshake
	// from one source address (IPv4 address or IPv6 /64). Default: 64.
	MaxHandshakesPerAddr int `toml:"max_handshakes_per_address"`
	// MaxHTTPConns bounds the management listener's open connections;
	// past it new ones wait in the kernel's backlog. Default: 256.
	MaxHTTPConns int `toml:"max_http_connections"`
	// MaxConnsPerUser bounds the network connections of one user (the
	// authenticated user; on a node without users, the user name of the
	// client's HELLO). Default: 0, no limit.
	MaxConnsPerUser int `toml:"max_connections_per_user"`
	// MaxAttachments bounds the attachments of one connection. Default:
	// 4096.
	MaxAttachments int `toml:"max_attachments"`
	// MaxPatternsPerAttachment bounds the distinct subscription patterns
	// of one subscriber (a durable subscription's too). Default: 1000.
	MaxPatternsPerAttachment int `toml:"max_patterns_per_attachment"`
	// MaxPatternsPerConnection bounds the subscription patterns of one
	// connection's subscribers together. Default: 10000.
	MaxPatternsPerConnection int `toml:"max_patterns_per_connection"`
	// MaxDurableSubscriptions bounds the durable subscriptions of the
	// node, those of every pub-sub exchange together. Default: 10000.
	MaxDurableSubscriptions int `toml:"max_durable_subscriptions"`
	// MaxPatternsPerPeer bounds, in a cluster, the subscription patterns
	// another node may have installed on this one for one exchange (its
	// aggregated interest). Past it, that node gets every publication
	// of the exchange and sorts them out itself, until its link comes
	// up again (docs/cluster.md). Default: 65536.
	MaxPatternsPerPeer int `toml:"max_patterns_per_peer"`
	// MaxInflight bounds the requests one connection may have in flight
	// as a requester. Default: 65536.
	MaxInflight int `toml:"max_inflight"`
	// MaxDeadline bounds a request's deadline; a request without one
	// gets this one. Default: 0, no maximum.
	MaxDeadline time.Duration `toml:"max_request_deadline"`
	// HandshakeTimeout bounds the wait for a new connection's HELLO.
	// Default: 5s.
	HandshakeTimeout time.Duration `toml:"handshake_timeout"`
	// Credit is the window of PUBLISH, REQUEST and SUBMIT frames a
	// client may send ahead of the server. Default: 65536.
	Credit uint64 `toml:"credit"`
	// OutboxBytes is what the server buffers for a client before data
	// frames wait for it to read. Default: 128 KiB.
	OutboxBytes int `toml:"outbox_bytes"`
	// SlowConsumerTimeout is how long data frames wait for a client that
	// does not read before it is disconnected. Default: 10s.
	SlowConsumerTimeout time.Duration `toml:"slow_consumer_timeout"`
	// AMQPOutboxBytes bounds what waits to be written to one AMQP
	// client: a delivery that would take it past the limit cuts the
	// client off as a slow consumer (docs/amqp.md, "Slow consumers").
	// It is raised to at least twice the largest AMQP message and
	// 64 KiB (8.1 MiB with the default max_frame). Default: 16 MiB.
	AMQPOutboxBytes int `toml:"amqp_outbox_bytes"`
	// ExprCost bounds one evaluation of a key or route expression, in
	// CEL cost units; it bounds what the evaluation allocates as well
	// (1 MiB at the default). An expression whose estimated cost is over
	// it is refused at declare. Default: 40000.
	ExprCost uint64 `toml:"expr_cost"`
	// ExprTime bounds the time of one evaluation of an expression with
	// comprehensions, and never past the request's deadline. Default:
	// 10ms.
	ExprTime time.Duration `toml:"expr_time"`
}

// Supervision configures the node's supervisor: a component (the client
// listener, the management listener, the broker's sweeper, the
// management sampler) that crashes is restarted, but one that crashes
// more than MaxRestarts times within RestartWindow is marked failed. See
// [Node.Failed].
type Supervision struct {
	// MaxRestarts is the restarts allowed within RestartWindow.
	// Default: 5.
	MaxRestarts int `toml:"max_restarts"`
	// RestartWindow is the period of the restart intensity. Default: 60s.
	RestartWindow time.Duration `toml:"restart_window"`
}

// DefaultScrubRate is the default [Config.ScrubRate]: a 1 GiB store is
// checked in 16 seconds, without taking the disk from the queues.
const DefaultScrubRate ByteSize = 64 << 20

// DefaultConfig returns the configuration a Node starts with: every
// default documented on [Config], [Limits] and [Supervision].
func DefaultConfig() Config {
	sd := server.DefaultConfig()
	return Config{
		DataDir: "courier-data", Heartbeat: sd.Heartbeat, DrainTimeout: 10 * time.Second,
		ScrubRate: DefaultScrubRate,
		Limits: Limits{
			MaxFrame: sd.MaxFrame, MaxConns: sd.MaxConns, MaxAttachments: 4096, MaxInflight: 65536,
			MaxPatternsPerAttachment: 1000, MaxPatternsPerConnection: 10000, MaxDurableSubscriptions: 10000,
			MaxPatternsPerPeer: 65536,
			MaxHandshakes:      sd.MaxHandshakes, MaxHandshakesPerAddr: sd.MaxHandshakesPerAddr,
			MaxHTTPConns:     admin.DefaultMaxConns,
			HandshakeTimeout: sd.HandshakeTimeout, Credit: sd.Credit, OutboxBytes: sd.OutboxLimit,
			SlowConsumerTimeout: sd.SlowTimeout, ExprCost: broker.DefaultExprCost, ExprTime: broker.DefaultExprTime,
			AMQPOutboxBytes: amqp.DefaultConfig().OutboxLimit,
		},
		Supervision: Supervision{MaxRestarts: 5, RestartWindow: time.Minute},
	}
}

// setDefaults fills the zero fields with their defaults.
func (c *Config) setDefaults() {
	d := DefaultConfig()
	setDefault(&c.DataDir, d.DataDir)
	setDefault(&c.Heartbeat, d.Heartbeat)
	setDefault(&c.DrainTimeout, d.DrainTimeout)
	setDefault(&c.ScrubRate, d.ScrubRate)
	setDefault(&c.MemoryBudget, DefaultMemoryBudget)
	if c.MemoryHighWatermark == 0 {
		c.MemoryHighWatermark = defaultHighWatermark()
	}
	l, dl := &c.Limits, d.Limits
	setDefault(&l.MaxFrame, dl.MaxFrame)
	setDefault(&l.MaxConns, dl.MaxConns)
	setDefault(&l.MaxHandshakes, dl.MaxHandshakes)
	setDefault(&l.MaxHandshakesPerAddr, dl.MaxHandshakesPerAddr)
	setDefault(&l.MaxHTTPConns, dl.MaxHTTPConns)
	setDefault(&l.MaxAttachments, dl.MaxAttachments)
	setDefault(&l.MaxInflight, dl.MaxInflight)
	setDefault(&l.MaxPatternsPerAttachment, dl.MaxPatternsPerAttachment)
	setDefault(&l.MaxPatternsPerConnection, dl.MaxPatternsPerConnection)
	setDefault(&l.MaxDurableSubscriptions, dl.MaxDurableSubscriptions)
	setDefault(&l.MaxPatternsPerPeer, dl.MaxPatternsPerPeer)
	setDefault(&l.HandshakeTimeout, dl.HandshakeTimeout)
	setDefault(&l.Credit, dl.Credit)
	setDefault(&l.OutboxBytes, dl.OutboxBytes)
	setDefault(&l.SlowConsumerTimeout, dl.SlowConsumerTimeout)
	setDefault(&l.AMQPOutboxBytes, dl.AMQPOutboxBytes)
	setDefault(&l.ExprCost, dl.ExprCost)
	setDefault(&l.ExprTime, dl.ExprTime)
	setDefault(&c.Supervision.MaxRestarts, d.Supervision.MaxRestarts)
	setDefault(&c.Supervision.RestartWindow, d.Supervision.RestartWindow)
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

func setDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Name != "" && !broker.ValidNodeName(c.Name) {
		return fmt.Errorf("node: invalid node name %q: use 1 to %d letters, digits, '-' and '_', starting with a letter or a digit", c.Name, broker.MaxNodeName)
	}
	if (c.AdminUser == "") != (c.AdminPassword == "") {
		return fmt.Errorf("node: the first administrator needs both a user name and a password")
	}
	for _, o := range c.WSOrigins {
		if _, err := path.Match(strings.ToLower(o), ""); err != nil || o == "" {
			return fmt.Errorf("node: ws_origins: bad origin pattern %q: want a host pattern such as chat.example.com, *.example.com or https://chat.example.com", o)
		}
	}
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if c.HTTPTLS.ClientCAFile != "" {
		return fmt.Errorf("node: client certificates are not supported on the management listener")
	}
	if err := c.HTTPTLS.Validate(); err != nil {
		return err
	}
	if err := c.Cluster.Validate(); err != nil {
		return err
	}
	l := c.Limits
	for _, v := range []struct {
		key string
		bad bool
	}{
		{"drain_timeout", c.DrainTimeout < 0},
		{"memory_budget", c.MemoryBudget < -1},
		{"memory_high_watermark", c.MemoryHighWatermark < -1},
		{"min_free_disk", c.MinFreeDisk < -1},
		{"scrub_rate", c.ScrubRate < -1},
		{"heartbeat", c.Heartbeat < 0},
		{"limits.max_frame", l.MaxFrame < 0 || l.MaxFrame > 1<<30},
		{"limits.max_connections", l.MaxConns < 0},
		{"limits.max_handshakes", l.MaxHandshakes < 0},
		{"limits.max_handshakes_per_address", l.MaxHandshakesPerAddr < 0},
		{"limits.max_http_connections", l.MaxHTTPConns < 0},
		{"limits.max_connections_per_user", l.MaxConnsPerUser < 0},
		{"limits.max_attachments", l.MaxAttachments < 0},
		{"limits.max_inflight", l.MaxInflight < 0},
		{"limits.max_patterns_per_attachment", l.MaxPatternsPerAttachment < 0},
		{"limits.max_patterns_per_connection", l.MaxPatternsPerConnection < 0},
		{"limits.max_durable_subscriptions", l.MaxDurableSubscriptions < 0},
		{"limits.max_patterns_per_peer", l.MaxPatternsPerPeer < 0},
		{"limits.max_request_deadline", l.MaxDeadline < 0 || l.MaxDeadline > 0 && l.MaxDeadline < time.Millisecond},
		{"limits.handshake_timeout", l.HandshakeTimeout < 0},
		{"limits.credit", l.Credit == 1},
		{"limits.outbox_bytes", l.OutboxBytes < 0},
		{"limits.slow_consumer_timeout", l.SlowConsumerTimeout < 0},
		{"limits.amqp_outbox_bytes", l.AMQPOutboxBytes < 0},
		{"limits.expr_time", l.ExprTime < 0},
		{"supervision.max_restarts", c.Supervision.MaxRestarts < 0},
		{"supervision.restart_window", c.Supervision.RestartWindow < 0},
	} {
		if v.bad {
			return fmt.Errorf("node: %s is out of range; docs/operations.md gives its range", v.key)
		}
	}
	return nil
}

// memory returns the node's budget, nil for none.
func (c *Config) memory() *queue.Memory {
	limit, budget := memorySizes(c.MemoryBudget, c.MemoryHighWatermark)
	if limit <= 0 {
		return nil
	}
	m := queue.NewMemory(limit)
	m.SetBudget(budget)
	return m
}

// Node is an embedded broker.
type Node struct {
	cfg    Config
	broker *broker.Broker
	sup    *supervise.Supervisor
	srv    *server.Server
	addr   net.Addr
	// amqp serves AMQP 0-9-1 on amqpAddr; nil without Config.AMQP.
	amqp     *amqp.Server
	amqpAddr net.Addr
	admin    *admin.Server
	http     net.Addr
	users    *auth.Store
	boot     uint64
	tls      []*tlsFiles // the listeners' TLS files, read again by Reload
	closed   atomic.Bool
	// fabric is the cluster's membership and links; nil for a single
	// node.
	fabric *cluster.Fabric
	// meta is the cluster's metadata group, and metaStop and metaDone
	// end and await its membership loop; nil for a single node.
	meta  *meta.Meta
	hooks *clusterHooks
	// replicas is the replica host and the replicated queues placed on
	// this node (replicas.go); nil for a single node.
	replicas *queueReplicas
	metaStop chan struct{}
	metaDone chan struct{}
	started  time.Time
	adminLn  net.Listener // until the supervisor serves it
	// clientLn is the client listener being served (a net.Listener), for
	// tests that break it.
	clientLn atomic.Value
	mu       sync.Mutex // guards conns
	conns    map[*localTransport]struct{}
}

// Start starts a node.
func Start(cfg Config) (*Node, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := prepareDataDir(cfg.DataDir, cfg.Log); err != nil {
		return nil, err
	}
	if err := checkDataDir(cfg.DataDir, cfg.Name); err != nil {
		return nil, err // before the users file may get a first administrator
	}
	logFDs := func() {}
	if cfg.Listen != "" || cfg.HTTP != "" {
		logFDs = applyFDLimit(&cfg)
	}
	users, err := openUsers(cfg)
	if err != nil {
		return nil, err
	}
	// After the checks that refuse a configuration: a start refused
	// records no name and counts no start.
	named := cfg.Name
	name, boot, undo, err := claimDataDir(cfg.DataDir, cfg.Name)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			undo() // nothing was served: the start is not counted
		}
	}()
	cfg.Name = name
	hooks := &clusterHooks{node: cfg.Name}
	n := &Node{
		hooks: hooks,
		cfg:   cfg,
		broker: broker.New(broker.Config{
			Node: cfg.Name, Boot: boot, Log: cfg.Log, Supervised: true,
			Home: hooks.home, LeaseValid: hooks.leaseValid,
			Memory:      cfg.memory(),
			Policy:      users,
			MaxInflight: cfg.Limits.MaxInflight, MaxAttachments: cfg.Limits.MaxAttachments, MaxDeadline: cfg.Limits.MaxDeadline,
			MaxPatternsPerAttachment: cfg.Limits.MaxPatternsPerAttachment, MaxPatternsPerConnection: cfg.Limits.MaxPatternsPerConnection,
			MaxDurableSubscriptions: cfg.Limits.MaxDurableSubscriptions,
			MaxPatternsPerPeer:      cfg.Limits.MaxPatternsPerPeer,
			ExprCost:                cfg.Limits.ExprCost, ExprTime: cfg.Limits.ExprTime,
		}),
		sup: supervise.New(supervise.Config{
			MaxRestarts: cfg.Supervision.MaxRestarts, Window: cfg.Supervision.RestartWindow, Log: cfg.Log,
		}),
		conns:   make(map[*localTransport]struct{}),
		users:   users,
		boot:    boot,
		started: time.Now(),
	}
	users.OnChange(func() { n.broker.Reauthorize() })
	sc := broker.StoreConfig{Dir: filepath.Join(cfg.DataDir, storeDirName)}
	so := store.DefaultOptions()
	if cfg.SyncInterval > 0 {
		so.Sync, so.SyncInterval = store.Interval, cfg.SyncInterval
	}
	if cfg.MinFreeDisk != 0 {
		so.MinFreeDisk = int64(cfg.MinFreeDisk)
	}
	so.ScrubRate = max(int64(cfg.ScrubRate), 0)
	so.Logger = cfg.Log // DefaultOptions discards: the store's rare events belong in the node's log
	if cfg.tuneStore != nil {
		cfg.tuneStore(&so)
	}
	sc.Options = &so
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
	n.sup.Add(supervise.Component{Name: "sweeper", Critical: true, Run: n.broker.Sweep})
	ok := false // Start succeeded
	// AMQP first: when its address is busy, Start fails before a client
	// listener opened that a retry without AMQP would open again.
	if cfg.AMQP != "" {
		ln, err := n.startAMQP()
		if err != nil {
			n.broker.Close()
			return nil, err
		}
		defer func() {
			if !ok {
				ln.Close()
			}
		}()
	}
	if cfg.Listen != "" {
		l := cfg.Limits
		scfg := server.Config{
			Listen: cfg.Listen, Heartbeat: cfg.Heartbeat, Log: cfg.Log,
			MaxFrame: l.MaxFrame, MaxConns: l.MaxConns, MaxConnsPerUser: l.MaxConnsPerUser,
			MaxHandshakes: l.MaxHandshakes, MaxHandshakesPerAddr: l.MaxHandshakesPerAddr,
			HandshakeTimeout: l.HandshakeTimeout, Credit: l.Credit, OutboxLimit: l.OutboxBytes, SlowTimeout: l.SlowConsumerTimeout,
			Users: users, ManagementURL: n.HTTPURL, ConnectURLs: n.connectURLs,
		}
		if scfg.TLS, err = n.loadTLS(cfg.TLS, "client"); err != nil {
			n.broker.Close()
			return nil, err
		}
		srv, err := server.New(scfg, n.broker)
		if err != nil {
			n.broker.Close()
			return nil, err
		}
		ln, err := srv.Listen()
		if err != nil {
			n.broker.Close()
			return nil, err
		}
		n.srv, n.addr = srv, ln.Addr()
		n.sup.Add(supervise.Component{Name: "listener", Critical: true, Run: n.serveClients(ln)})
		defer func() {
			if !ok {
				ln.Close() // the management listener or the cluster failed: Start fails
			}
		}()
	}
	if cfg.HTTP != "" {
		if err := n.startAdmin(); err != nil {
			n.broker.Close()
			return nil, err
		}
	}
	if err := n.startCluster(); err != nil {
		if n.admin != nil {
			n.adminLn.Close()
			n.admin.Shutdown(context.Background())
		}
		n.broker.Close()
		return nil, err
	}
	ok = true
	logFDs()
	n.sup.Start()
	started = true
	if named == "" && boot == 1 {
		cfg.Log.Info("node name chosen; the data directory keeps it", "node", name, "file", filepath.Join(cfg.DataDir, IdentityFile))
	}
	return n, nil
}

// serveClients returns the client listener's component: it serves ln,
// and after a crash listens again on the same address. Connections
// already accepted live on through a restart.
func (n *Node) serveClients(ln net.Listener) func(context.Context) error {
	return func(ctx context.Context) error {
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", n.addr.String()); err != nil {
				return fmt.Errorf("listen again on %s: %w", n.addr, err)
			}
			n.cfg.Log.Info("client listener restarted", "addr", n.addr.String())
		}
		l := ln
		ln = nil
		n.clientLn.Store(l)
		defer l.Close()
		stop := context.AfterFunc(ctx, func() { l.Close() })
		defer stop()
		if err := n.srv.Serve(l); !errors.Is(err, server.ErrServerClosed) && ctx.Err() == nil {
			return err
		}
		return nil
	}
}

// openUsers opens the users of the data directory, creates the first
// administrator if the config names one, and refuses listeners beyond
// loopback without users.
func openUsers(cfg Config) (*auth.Store, error) {
	users, err := auth.Open(auth.Config{Dir: cfg.DataDir, Log: cfg.Log})
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if cfg.AdminUser != "" {
		created, err := users.Bootstrap(cfg.AdminUser, cfg.AdminPassword)
		switch {
		case err != nil:
			return nil, fmt.Errorf("node: first administrator: %w", err)
		case created:
			cfg.Log.Info("administrator created", "user", cfg.AdminUser, "file", users.Path())
		default:
			cfg.Log.Info("first administrator not created: users exist", "user", cfg.AdminUser, "file", users.Path())
		}
	}
	for _, l := range []struct {
		what, addr string
		tls        bool
	}{{"client", cfg.Listen, cfg.TLS.Enabled()}, {"management", cfg.HTTP, cfg.HTTPTLS.Enabled()}, {"amqp", cfg.AMQP, cfg.TLS.Enabled()}} {
		if l.addr == "" {
			continue
		}
		local, err := auth.Loopback(l.addr)
		if err != nil {
			return nil, fmt.Errorf("node: %s listener: %w", l.what, err)
		}
		if local {
			continue
		}
		if !users.HasUsers() {
			return nil, fmt.Errorf("node: refusing the %s listener on %s: the node has no users, so anyone who can reach it would have full access; "+
				"create an administrator (COURIER_ADMIN_USER and COURIER_ADMIN_PASSWORD with `courier server`) or listen on a loopback address such as 127.0.0.1", l.what, l.addr)
		}
		if err := users.Require(); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
		if !l.tls {
			cfg.Log.Warn("listener beyond loopback without TLS: passwords and messages cross the network in clear", "listener", l.what, "addr", l.addr)
		}
	}
	return users, nil
}

// loadTLS reads the TLS files of a listener ("client" or "management");
// nil when f turns no TLS on.
func (n *Node) loadTLS(f TLSFiles, listener string) (*tls.Config, error) {
	if !f.Enabled() {
		return nil, nil
	}
	t, err := newTLSFiles(f, listener, n.cfg.Log)
	if err != nil {
		return nil, err
	}
	n.tls = append(n.tls, t)
	return t.config(), nil
}

// Reload reads the users file and the listeners' TLS files again, as
// `courier server` does on SIGHUP. No connection is dropped: each session
// sees the new permissions on its next operation, attachments whose
// permission was revoked are detached (EVENT detached), and new TLS
// handshakes use the new certificates. On an error, what was loaded
// before stays in use.
func (n *Node) Reload() error {
	var errs []error
	if err := n.users.Reload(); err != nil {
		errs = append(errs, err)
	}
	for _, t := range n.tls {
		if err := t.load(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// startAdmin sets up the management API on Config.HTTP, served under
// the supervisor.
func (n *Node) startAdmin() error {
	httpTLS, err := n.loadTLS(n.cfg.HTTPTLS, "management")
	if err != nil {
		return err
	}
	a, err := admin.New(admin.Config{
		Listen: n.cfg.HTTP, Broker: n.broker, Node: n.cfg.Name, Log: n.cfg.Log,
		Describe: describe, CloseConn: server.Close, Supervised: true, Components: n.components,
		Queues: queueSource{n.broker}, ConnEnds: n.connEnds,
		Users: n.users, TLS: httpTLS, ClientURL: n.URL, HTTPURL: n.HTTPURL, WebSocket: n.webSocket(),
		Cluster: func() []admin.ClusterNode {
			if n.fabric == nil {
				return nil
			}
			return n.clusterNodes()
		}, ForgetNode: n.forgetNode(), Replicas: n.replicaSource(), MetricsAuth: n.cfg.MetricsAuth, MaxConns: n.cfg.Limits.MaxHTTPConns,
		Listeners: func() []admin.Listener {
			var ls []admin.Listener
			if n.addr != nil {
				proto := "courier"
				if n.cfg.TLS.Enabled() {
					proto = "courier+tls"
				}
				ls = append(ls, admin.Listener{Protocol: proto, Address: n.addr.String()})
			}
			if n.amqpAddr != nil {
				proto := "amqp"
				if n.cfg.TLS.Enabled() {
					proto = "amqps"
				}
				ls = append(ls, admin.Listener{Protocol: proto, Address: n.amqpAddr.String()})
			}
			return ls
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
	n.admin, n.http, n.adminLn = a, ln.Addr(), ln
	n.sup.Add(supervise.Component{Name: "http", Run: func(ctx context.Context) error {
		if ln == nil {
			if ln, err = net.Listen("tcp", n.http.String()); err != nil {
				return fmt.Errorf("listen again on %s: %w", n.http, err)
			}
			n.cfg.Log.Info("management listener restarted", "addr", n.http.String())
		}
		l := ln
		ln = nil
		stop := context.AfterFunc(ctx, func() { l.Close() })
		defer stop()
		if err := a.Serve(l); !errors.Is(err, http.ErrServerClosed) && ctx.Err() == nil {
			return err
		}
		return nil
	}})
	n.sup.Add(supervise.Component{Name: "sampler", Run: a.RunSampler})
	return nil
}

// webSocket returns the handler of the WebSocket access layer, served
// by the management listener; nil without a client listener.
func (n *Node) webSocket() http.Handler {
	if n.srv == nil {
		return nil
	}
	return n.srv.WebSocketHandler(n.cfg.WSOrigins)
}

// components lists the supervised components for the management API.
func (n *Node) components() []admin.Component {
	st := n.sup.Status()
	out := make([]admin.Component, len(st))
	for i, c := range st {
		out[i] = admin.Component{Name: c.Name, State: string(c.State), Critical: c.Critical, Restarts: c.Restarts, LastError: c.LastError}
	}
	return out
}

// Failed receives one error when a component the node cannot serve
// without (the client listener, the broker's sweeper) has crashed more
// often than Config.Supervision allows. The node should then be closed,
// and its process exit so that its service manager starts it again;
// `courier server` does so.
func (n *Node) Failed() <-chan error { return n.sup.Failed() }

// describe tells the management API what a session's transport knows of
// its peer.
func describe(sink broker.Sink) (admin.ConnInfo, bool) {
	if t, ok := sink.(*localTransport); ok {
		return admin.ConnInfo{Type: "embedded", Protocol: "courier", User: t.user, ConnectedAt: t.opened}, true
	}
	if ci, ok := server.Describe(sink); ok {
		return admin.ConnInfo{Type: "network", Protocol: "courier", Transport: ci.Protocol, Peer: ci.Peer, User: ci.User, ConnectedAt: ci.ConnectedAt,
			SendPending: ci.SendPending, SendBlocked: ci.SendBlocked}, true
	}
	if ci, ok := amqp.Describe(sink); ok {
		return admin.ConnInfo{Type: "network", Protocol: "amqp", Peer: ci.Peer, User: ci.User, ConnectedAt: ci.ConnectedAt}, true
	}
	return admin.ConnInfo{}, false
}

// HTTPAddr returns the management API's address, or nil without HTTP.
func (n *Node) HTTPAddr() net.Addr { return n.http }

// HTTPURL returns the management API's base URL, such as
// "http://127.0.0.1:7480" (https with HTTPTLS), or "".
func (n *Node) HTTPURL() string {
	if n.http == nil {
		return ""
	}
	if n.cfg.HTTPTLS.Enabled() {
		return "https://" + n.http.String()
	}
	return "http://" + n.http.String()
}

// Addr returns the network address served, or nil without Listen.
func (n *Node) Addr() net.Addr { return n.addr }

// URL returns the courier:// (or, with TLS, courier+tls://) URL of the
// network address served, or "".
func (n *Node) URL() string {
	if n.addr == nil {
		return ""
	}
	if n.cfg.TLS.Enabled() {
		return "courier+tls://" + n.addr.String()
	}
	return "courier://" + n.addr.String()
}

// connectURLs is what the node's WELCOME names in connect_urls: its own
// client address, unless it listens on every interface (0.0.0.0 or ::),
// which names no reachable host; clients know how they reached it.
//
// In a cluster it names every live node's client address too, as the
// nodes gossip them, so that a client given one node learns the others.
func (n *Node) connectURLs() []string {
	var out []string
	if n.addr != nil {
		if ta, ok := n.addr.(*net.TCPAddr); !ok || !ta.IP.IsUnspecified() {
			out = append(out, n.addr.String())
		}
	}
	if f := n.fabric; f != nil {
		for _, m := range f.Members() {
			if m.Self || m.State != "alive" || m.ClientURL == "" {
				continue
			}
			if u, err := url.Parse(m.ClientURL); err == nil && u.Host != "" && !slices.Contains(out, u.Host) {
				out = append(out, u.Host)
			}
		}
	}
	return out
}

// Name returns the node's name: Config.Name, or the one recorded in or
// chosen for its data directory.
func (n *Node) Name() string { return n.cfg.Name }

// Boot returns how many times a node has started on this data directory,
// this start included (1 for the first); see [IdentityFile].
func (n *Node) Boot() uint64 { return n.boot }

// Broker returns the routing core, for the server and the management API
// inside this module.
func (n *Node) Broker() *broker.Broker { return n.broker }

// Connect returns a new in-process connection. It is trusted: it may do
// anything, whatever users the node has. See [Node.ConnectAs] for one
// limited to a user's permissions.
func (n *Node) Connect() *courier.Conn {
	return n.connect("", nil)
}

// ConnectAs returns a new in-process connection that authenticates as
// user and may do only what user's permissions allow, as a network client
// logged in as user would. While the node has no users it is anonymous
// and may do anything. A wrong user name or password fails with a
// [*wire.Error] of code [wire.CodeUnauthorized].
func (n *Node) ConnectAs(user, password string) (*courier.Conn, error) {
	// A failure is logged by the store, a line per 10 s.
	name, err := n.users.Authenticate(user, password)
	if err != nil {
		return nil, &wire.Error{Code: wire.CodeUnauthorized, Msg: "bad user name or password", Fatal: true}
	}
	return n.connect(name, n.users), nil
}

func (n *Node) connect(user string, policy auth.Policy) *courier.Conn {
	t := &localTransport{n: n, opened: time.Now(), user: user}
	if policy != nil {
		t.s = n.broker.OpenAs(t, "embedded", user, policy)
	} else {
		t.s = n.broker.Open(t, "embedded")
	}
	n.mu.Lock()
	n.conns[t] = struct{}{}
	n.mu.Unlock()
	c := courier.NewConn(t, courier.ConnOptions{ID: t.s.ID(), Log: n.cfg.Log})
	t.conn = c
	return c
}

// Shutdown closes the node gracefully: it stops accepting connections
// and new requests, tells every network client it is going (a CLOSE with
// code 16), waits for the requests in flight to be answered, for at most
// Config.DrainTimeout or until ctx ends, hands the leadership of the
// replicated queues it leads, and of the metadata group, over to other
// nodes (for up to 10 s each), and then closes as [Node.Close] does. It
// returns an error when requests were still in flight.
func (n *Node) Shutdown(ctx context.Context) error {
	if n.closed.Load() {
		return nil
	}
	n.broker.Drain()
	if n.srv != nil {
		n.srv.GoAway(n.cfg.DrainTimeout)
	}
	parent := ctx // the hand-overs below end with it, not with the drain
	ctx, cancel := context.WithTimeout(ctx, n.cfg.DrainTimeout)
	defer cancel()
	busy := n.broker.Busy()
	if busy > 0 {
		n.cfg.Log.Info("draining: waiting for requests in flight", "requests", busy, "timeout", n.cfg.DrainTimeout)
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for busy > 0 && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			busy = n.broker.Busy()
		}
	}
	var err error
	if busy > 0 {
		err = fmt.Errorf("node: %d requests still in flight when the drain ended: %w", busy, ctx.Err())
		n.cfg.Log.Warn("drain ended with requests in flight", "requests", busy)
	}
	if n.replicas != nil {
		// The replicated queues this node leads move to other replicas
		// first, so that they stay served (handOverTimeout at most).
		n.replicas.handOver(parent)
	}
	if n.meta != nil {
		// So does the metadata group's leadership, if it is here.
		hctx, cancel := context.WithTimeout(parent, handOverTimeout)
		if err := n.meta.HandOver(hctx); err != nil {
			n.cfg.Log.Warn("metadata leadership not handed over", "err", err)
		}
		cancel()
	}
	n.Close()
	return err
}

// Close stops serving the network, telling remote clients, and closes
// every in-process connection at once; see [Node.Shutdown] for a
// graceful close.
func (n *Node) Close() error {
	if n.closed.Swap(true) {
		return nil
	}
	n.leaveCluster()
	if n.fabric != nil {
		// Leave first: the other nodes see this one left, not dead.
		n.fabric.Close()
	}
	n.broker.StopQueues()
	if n.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n.admin.Shutdown(ctx)
		cancel()
	}
	if n.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n.srv.Shutdown(ctx)
		cancel()
	}
	if n.amqp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n.amqp.Shutdown(ctx)
		cancel()
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
	n.sup.Stop()
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
	user   string // fixed at connect
	closed atomic.Bool
}

var (
	_ courier.Transport    = (*localTransport)(nil)
	_ courier.FuncDeclarer = (*localTransport)(nil)
	_ broker.Sink          = (*localTransport)(nil)
)

func (t *localTransport) Start(recv func(*wire.Frame)) { t.recv = recv }

var (
	_ courier.ContextSender   = (*localTransport)(nil)
	_ courier.WaiterTransport = (*localTransport)(nil)
)

// Send takes a frame from the Conn to the broker.
func (t *localTransport) Send(f *wire.Frame) error {
	return t.SendContext(context.Background(), f)
}

// SendContext is Send for a caller that may give up: a SUBMIT waits
// while its queue's flow control is full (memory or disk alarm), and a
// PUBLISH while that of the durable subscription its session published
// to last is, as a network client waits for credit.
func (t *localTransport) SendContext(ctx context.Context, f *wire.Frame) error {
	if t.closed.Load() {
		f.Release()
		return courier.ErrClosed
	}
	var err error
	switch {
	case f.Type == wire.TypeSubmit && t.s.SubmitPressure(f.Name) >= 1:
		name := f.Name
		err = t.waitPressure(ctx, name, func() float64 { return t.s.SubmitPressure(name) })
	case f.Type == wire.TypePublish && t.s.Pressure() >= 1:
		err = t.waitPressure(ctx, f.Name, t.s.Pressure)
	}
	if err != nil {
		f.Release()
		return err
	}
	t.s.Handle(f)
	return nil
}

// waitPressure waits until pressure, the flow control of a publisher to
// exchange name, falls under 1.
func (t *localTransport) waitPressure(ctx context.Context, name string, pressure func() float64) error {
	tick := time.NewTicker(pressurePoll)
	defer tick.Stop()
	for pressure() >= 1 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("courier: waiting for flow control of %s: %w", name, ctx.Err())
		}
		if t.closed.Load() {
			return courier.ErrClosed
		}
	}
	return nil
}

// pressurePoll is how often a submit held by flow control looks again.
const pressurePoll = 10 * time.Millisecond

// Deliver takes a frame from the broker to the Conn. A frame for a
// request (it has a Waiter) is delivered even once the transport is
// closed: the Conn's requests wait for it (see courier.WaiterTransport).
func (t *localTransport) Deliver(f *wire.Frame) {
	if t.closed.Load() && f.Waiter == nil {
		f.Release()
		return
	}
	t.recv(f)
}

// KeepsWaiters reports that the broker gives requests' waiters back.
func (t *localTransport) KeepsWaiters() bool { return true }

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
