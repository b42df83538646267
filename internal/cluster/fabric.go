// Package cluster is the fabric of a Courier cluster: one cluster
// address per node, membership and failure detection (hashicorp
// memberlist), and node links, a control and a data connection between
// each pair of live nodes that carry frames of the wire codec.
//
// Every connection to the cluster address starts with a handshake that
// names its kind and authenticates the peer: with a shared cluster
// secret (TLS with ephemeral certificates, then an HMAC of the secret
// over the TLS session's exported keying material, each way), with
// mutual TLS against a cluster CA, or both; a loopback cluster address
// may run without either. memberlist's UDP packets are encrypted with a
// key derived from the secret. docs/cluster.md is the operator's guide.
package cluster

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
)

// Config configures a Fabric.
type Config struct {
	// Name is the node's name, unique in the cluster. Required.
	Name string
	// Listen is the cluster address: TCP for every stream, UDP on the
	// same port for memberlist's packets, such as "127.0.0.1:7500"
	// (port 0 picks a free one). Required.
	Listen string
	// Advertise is the address the other nodes reach this one at.
	// Default: the address listened on, which must then name an IP.
	Advertise string
	// Join lists seed nodes' cluster addresses; they are tried in the
	// background until one answers (a node may start before its seeds).
	Join []string
	// Secret is the shared cluster secret. Default: none.
	Secret []byte
	// CertFile, KeyFile and CAFile turn mutual TLS on: this node's
	// certificate and key, and the cluster CA that signed every node's.
	CertFile, KeyFile, CAFile string
	// ClientURL, HTTPURL and Version are gossiped to the other nodes.
	ClientURL, HTTPURL, Version string
	// Started is when the node started (gossiped). Default: now.
	Started time.Time
	// Hosts returns what the node hosts, gossiped every HostsInterval.
	// Default: nil (zeros).
	Hosts func() Hosts
	// MaxFrame bounds a frame on a node link. Default:
	// wire.DefaultMaxFrame plus 64 KiB.
	MaxFrame int
	// OutboxBytes is what a link buffers before Send refuses with
	// ErrLinkFull past eight times it. Default: 1 MiB.
	OutboxBytes int
	// SlowTimeout is how long a link's write may go without the peer
	// taking anything before the link is cut and redialled.
	// Default: 10s.
	SlowTimeout time.Duration
	// HandshakeTimeout bounds a connection's handshake. Default: 5s.
	HandshakeTimeout time.Duration
	// ProbeInterval and ProbeTimeout tune memberlist's failure detector.
	// Default: 500ms and 250ms.
	ProbeInterval, ProbeTimeout time.Duration
	// SuspicionMult scales how long a suspected node has to refute
	// before it is declared dead (SuspicionMult × ProbeInterval on up to
	// 10 nodes). Default: 4 (2 s).
	SuspicionMult int
	// LinkHeartbeat is how often a link sends a PING; a link that
	// receives nothing for three of them is cut. Default: 1s: on a
	// loaded machine, 1.5 s of silence cut healthy links (and failed
	// the requests routed over them); a process that dies is seen at
	// once anyway, by its connections closing.
	LinkHeartbeat time.Duration
	// HostsInterval is how often Hosts is read and gossiped when it
	// changed. Default: 2s.
	HostsInterval time.Duration
	// Log receives structured logs. Default: slog.Default().
	Log *slog.Logger
}

// Hosts is what a node hosts, as gossiped.
type Hosts struct {
	Connections int `json:"n,omitempty"`
	Exchanges   int `json:"x,omitempty"`
	Queues      int `json:"q,omitempty"`
}

func (c *Config) setDefaults() {
	if c.MaxFrame <= 0 {
		c.MaxFrame = wire.DefaultMaxFrame + 64<<10
	}
	if c.OutboxBytes <= 0 {
		c.OutboxBytes = 1 << 20
	}
	if c.SlowTimeout <= 0 {
		c.SlowTimeout = 10 * time.Second
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 5 * time.Second
	}
	if c.ProbeInterval <= 0 {
		c.ProbeInterval = 500 * time.Millisecond
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = 250 * time.Millisecond
	}
	if c.SuspicionMult <= 0 {
		c.SuspicionMult = 4
	}
	if c.LinkHeartbeat <= 0 {
		c.LinkHeartbeat = time.Second
	}
	if c.HostsInterval <= 0 {
		c.HostsInterval = 2 * time.Second
	}
	if c.Started.IsZero() {
		c.Started = time.Now()
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// LinkHandler receives what comes from the node links. FromPeer is
// called from a link's read goroutine, in the order the peer sent, one
// frame at a time per link (control and data links apart); it owns fr.
// PeerUp and PeerDown are called one at a time per peer, and FromPeer
// for a peer only between its PeerUp and its PeerDown. None may block
// for long: a link's reads wait for them.
type LinkHandler interface {
	FromPeer(node string, fr *wire.Frame)
	PeerUp(node string)
	PeerDown(node string)
}

// Fabric is a node's membership and links. It is safe for concurrent
// use.
type Fabric struct {
	cfg       Config
	log       *slog.Logger
	name      string
	advertise string
	sec       *security
	tcp       net.Listener
	udp       *net.UDPConn
	tr        *transport
	ml        *memberlist.Memberlist
	epoch     time.Time
	handler   atomic.Pointer[handlerBox]
	leaving   atomic.Bool
	warn      logLimiter
	conflicts logLimiter
	hostsMu   sync.Mutex
	hostsSent Hosts // in the metadata memberlist took last
	hsSlots   chan struct{}

	mu        sync.RWMutex // guards peers, listeners, closed
	peers     map[string]*peer
	listeners map[Kind]*kindListener
	closed    bool

	done chan struct{}
	wg   sync.WaitGroup
}

type handlerBox struct{ h LinkHandler }

// maxHandshakes bounds the connections of the cluster address still in
// their handshake.
const maxHandshakes = 64

// New starts a node's fabric: it listens on the cluster address, joins
// the seeds in the background and links with every live node.
func New(cfg Config) (*Fabric, error) {
	cfg.setDefaults()
	if cfg.Name == "" || len(cfg.Name) > maxName {
		return nil, fmt.Errorf("cluster: node name of %d bytes (1 to %d)", len(cfg.Name), maxName)
	}
	if cfg.Listen == "" {
		return nil, errors.New("cluster: no cluster address")
	}
	sec, err := newSecurity(cfg.Secret, cfg.CertFile, cfg.KeyFile, cfg.CAFile)
	if err != nil {
		return nil, err
	}
	if err := checkSecure(cfg.Listen, cfg.Advertise, sec.mode); err != nil {
		return nil, err
	}
	f := &Fabric{
		cfg: cfg, log: cfg.Log.With("component", "cluster"), name: cfg.Name, sec: sec,
		epoch: time.Now(), peers: make(map[string]*peer), listeners: make(map[Kind]*kindListener),
		hsSlots: make(chan struct{}, maxHandshakes), done: make(chan struct{}),
	}
	if err := f.listen(); err != nil {
		return nil, err
	}
	f.tr = newTransport(f, f.udp, sec.mode == secMTLS)
	f.wg.Add(1)
	go f.acceptLoop()
	if err := f.startMemberlist(); err != nil {
		f.closeSockets()
		return nil, err
	}
	f.wg.Add(2)
	go f.joinLoop()
	go f.hostsLoop()
	f.log.Info("cluster address listening", "node", f.name, "addr", f.tcp.Addr().String(), "advertise", f.advertise,
		"security", securityName(sec.mode), "join", strings.Join(cfg.Join, ","))
	return f, nil
}

// checkSecure refuses a cluster address beyond loopback without
// security.
func checkSecure(listen, advertise string, mode byte) error {
	if mode != 0 {
		return nil
	}
	for _, a := range []string{listen, advertise} {
		if a == "" {
			continue
		}
		local, err := auth.Loopback(a)
		if err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
		if !local {
			return fmt.Errorf("%w: refusing the cluster address %s: without a cluster secret or mutual TLS anyone who reaches it could join the cluster; "+
				"give every node the same secret (--cluster-secret-file or COURIER_CLUSTER_SECRET) or cluster TLS files, or use a loopback address such as 127.0.0.1", ErrInsecure, a)
		}
	}
	return nil
}

// listen opens the cluster address's TCP listener and the UDP socket on
// the same port.
func (f *Fabric) listen() error {
	for try := 0; ; try++ {
		ln, err := net.Listen("tcp", f.cfg.Listen)
		if err != nil {
			return fmt.Errorf("cluster: listen on %s: %w", f.cfg.Listen, err)
		}
		ta := ln.Addr().(*net.TCPAddr)
		udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ta.IP, Port: ta.Port, Zone: ta.Zone})
		if err != nil {
			ln.Close()
			// Port 0 picked a TCP port whose UDP twin is taken: pick again.
			if _, port, _ := net.SplitHostPort(f.cfg.Listen); port == "0" && try < 10 {
				continue
			}
			return fmt.Errorf("cluster: listen on UDP %s: %w", ta, err)
		}
		f.tcp, f.udp = ln, udp
		break
	}
	f.advertise = f.cfg.Advertise
	if f.advertise == "" {
		ta := f.tcp.Addr().(*net.TCPAddr)
		if ta.IP.IsUnspecified() {
			f.closeSockets()
			return fmt.Errorf("cluster: listening on %s, all addresses: give the address other nodes reach this one at (cluster advertise)", f.tcp.Addr())
		}
		f.advertise = ta.String()
	} else if _, _, err := net.SplitHostPort(f.advertise); err != nil {
		f.closeSockets()
		return fmt.Errorf("cluster: advertise address: %w", err)
	}
	return nil
}

func (f *Fabric) closeSockets() {
	f.tcp.Close()
	f.udp.Close()
}

// gossipKey derives memberlist's AES-256 key from the secret.
func gossipKey(secret []byte) ([]byte, error) {
	return hkdf.Key(sha256.New, secret, nil, "courier cluster gossip key v1", 32)
}

func (f *Fabric) startMemberlist() error {
	mc := memberlist.DefaultLANConfig()
	mc.Name = f.name
	mc.Transport = f.tr
	mc.ProbeInterval = f.cfg.ProbeInterval
	mc.ProbeTimeout = f.cfg.ProbeTimeout
	mc.SuspicionMult = f.cfg.SuspicionMult
	mc.SuspicionMaxTimeoutMult = 2
	mc.GossipInterval = 100 * time.Millisecond
	mc.PushPullInterval = 15 * time.Second
	mc.TCPTimeout = f.cfg.HandshakeTimeout
	mc.DeadNodeReclaimTime = time.Second
	mc.Delegate = (*delegate)(f)
	mc.Events = (*events)(f)
	mc.Conflict = (*events)(f)
	mc.Logger = log.New(&mlLog{log: f.log}, "", 0)
	if len(f.cfg.Secret) > 0 {
		key, err := gossipKey(f.cfg.Secret)
		if err != nil {
			return fmt.Errorf("cluster: gossip key: %w", err)
		}
		mc.SecretKey = key
	}
	if _, err := f.nodeMeta(); err != nil {
		return err
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return fmt.Errorf("cluster: memberlist: %w", err)
	}
	f.mu.Lock()
	f.ml = ml
	f.mu.Unlock()
	return nil
}

// acceptLoop accepts connections on the cluster address.
func (f *Fabric) acceptLoop() {
	defer f.wg.Done()
	for {
		c, err := f.tcp.Accept()
		if err != nil {
			select {
			case <-f.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			f.log.Warn("cluster: accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		select {
		case f.hsSlots <- struct{}{}:
		default:
			c.Close() // too many handshakes in progress
			f.warn.log(f.log, "cluster: handshake refused: too many in progress", "peer", c.RemoteAddr().String())
			continue
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.handshake(c)
		}()
	}
}

// handshake authenticates an accepted connection and hands it on.
func (f *Fabric) handshake(nc net.Conn) {
	noDelay(nc)
	c, err := f.sec.serverHandshake(nc, f.serves, f.self(), f.cfg.HandshakeTimeout)
	<-f.hsSlots
	if err != nil {
		nc.Close()
		if errors.Is(err, io.EOF) && errors.Is(err, ErrHandshake) {
			f.log.Debug("cluster: connection closed before its handshake", "peer", nc.RemoteAddr().String())
			return
		}
		f.warn.log(f.log, "cluster: connection refused", "peer", nc.RemoteAddr().String(), "err", err)
		return
	}
	if c.peer == f.name {
		c.Close()
		f.warn.log(f.log, "cluster: connection refused: the peer has this node's name", "peer", nc.RemoteAddr().String(), "name", c.peer)
		return
	}
	switch c.kind {
	case KindMemberlist:
		f.tr.accept(c)
	case KindGossip:
		f.tr.acceptPackets(c)
	case KindLinkControl, KindLinkData:
		f.acceptLink(c)
	default:
		f.mu.Lock()
		l := f.listeners[c.kind]
		f.mu.Unlock()
		if l == nil || !l.offer(c) {
			c.Close()
		}
	}
}

func (f *Fabric) serves(k Kind) bool {
	switch k {
	case KindMemberlist, KindLinkControl, KindLinkData:
		return true
	case KindGossip:
		return f.tr.overTCP
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.listeners[k] != nil
}

func (f *Fabric) self() hello { return hello{Name: f.name, Addr: f.advertise} }

// dialAddr dials addr and runs the handshake for kind within timeout.
func (f *Fabric) dialAddr(addr string, kind Kind, timeout time.Duration) (*Conn, error) {
	return f.dialContext(context.Background(), addr, kind, timeout)
}

func (f *Fabric) dialContext(ctx context.Context, addr string, kind Kind, timeout time.Duration) (*Conn, error) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	d := net.Dialer{Deadline: deadline}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	noDelay(nc)
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()
	c, err := f.sec.clientHandshake(nc, kind, f.self(), time.Until(deadline))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("cluster: %s connection to %s: %w", kind, addr, err)
	}
	return c, nil
}

// Dial opens an authenticated connection of kind to node, for the Raft
// group and others; its reads and writes need their own deadlines.
func (f *Fabric) Dial(ctx context.Context, node string, kind Kind) (net.Conn, error) {
	addr := f.addrOf(node)
	if addr == "" {
		return nil, fmt.Errorf("%w: %q", ErrUnknownNode, node)
	}
	c, err := f.dialContext(ctx, addr, kind, f.cfg.HandshakeTimeout)
	if err != nil {
		return nil, err
	}
	if c.peer != node {
		c.Close()
		return nil, fmt.Errorf("cluster: %s answers at %s, not %s", c.peer, addr, node)
	}
	return c, nil
}

// addrOf returns the cluster address of a node, "" if unknown.
func (f *Fabric) addrOf(node string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.peers[node]; p != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.addr
	}
	return ""
}

// Listener returns the listener of the authenticated connections of
// kind, made on first call; connections of a kind are refused in the
// handshake until then. The kinds the fabric serves itself
// (KindMemberlist, KindLinkControl, KindLinkData) have none. Closing it
// stops the kind being served.
func (f *Fabric) Listener(kind Kind) net.Listener {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l := f.listeners[kind]; l != nil {
		return l
	}
	l := &kindListener{f: f, kind: kind, ch: make(chan *Conn, 64), done: make(chan struct{})}
	switch kind {
	case KindMemberlist, KindLinkControl, KindLinkData, KindGossip:
		close(l.done)
		return l
	}
	if f.closed {
		close(l.done)
	}
	f.listeners[kind] = l
	return l
}

// kindListener is the net.Listener of one kind of connection.
type kindListener struct {
	f    *Fabric
	kind Kind
	ch   chan *Conn
	done chan struct{}
	once sync.Once
}

func (l *kindListener) offer(c *Conn) bool {
	select {
	case <-l.done:
		return false
	default:
	}
	select {
	case l.ch <- c:
		return true
	default:
		return false
	}
}

// Accept returns the next authenticated connection; it is a *Conn.
func (l *kindListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("cluster: %s listener: %w", l.kind, net.ErrClosed)
	}
}

func (l *kindListener) Close() error {
	l.once.Do(func() {
		l.f.mu.Lock()
		if l.f.listeners[l.kind] == l {
			delete(l.f.listeners, l.kind)
		}
		l.f.mu.Unlock()
		select {
		case <-l.done:
		default:
			close(l.done)
		}
		for {
			select {
			case c := <-l.ch:
				c.Close()
			default:
				return
			}
		}
	})
	return nil
}

func (l *kindListener) Addr() net.Addr { return l.f.tcp.Addr() }

// Addr returns the cluster address listened on.
func (f *Fabric) Addr() net.Addr { return f.tcp.Addr() }

// Advertise returns the cluster address the other nodes use.
func (f *Fabric) Advertise() string { return f.advertise }

// Name returns the node's name.
func (f *Fabric) Name() string { return f.name }

// SetHandler sets the receiver of link frames and peer events. Until it
// is set, frames are dropped and events not told.
func (f *Fabric) SetHandler(h LinkHandler) { f.handler.Store(&handlerBox{h}) }

func (f *Fabric) handle() LinkHandler {
	if b := f.handler.Load(); b != nil {
		return b.h
	}
	return nil
}

// joinLoop joins the seeds, retrying until one answers, and while this
// node knows no other live node; it also tries again, every
// reconnectEvery, the nodes it saw die (not those that left), so that a
// healed partition merges.
func (f *Fabric) joinLoop() {
	defer f.wg.Done()
	seeds := slices.DeleteFunc(slices.Clone(f.cfg.Join), func(s string) bool { return s == f.advertise || s == "" })
	t := time.NewTimer(0)
	defer t.Stop()
	var lastWarn, lastReconnect time.Time
	joined := false
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
		}
		if len(seeds) > 0 && (!joined || f.ml.NumMembers() <= 1) {
			n, err := f.ml.Join(seeds)
			switch {
			case n > 0:
				if !joined {
					f.log.Info("cluster: joined", "seeds", strings.Join(seeds, ","), "answered", n)
				}
				joined = true
			case time.Since(lastWarn) > 30*time.Second:
				lastWarn = time.Now()
				f.log.Warn("cluster: no seed answered yet; retrying", "seeds", strings.Join(seeds, ","), "err", err)
			}
		}
		if time.Since(lastReconnect) >= reconnectEvery {
			lastReconnect = time.Now()
			if addrs := f.deadAddrs(8); len(addrs) > 0 {
				f.ml.Join(addrs)
			}
		}
		t.Reset(time.Second + rand.N(200*time.Millisecond))
	}
}

// reconnectEvery is how often a node tries again the nodes it saw die.
const reconnectEvery = 5 * time.Second

// deadAddrs returns up to n addresses of nodes seen dead.
func (f *Fabric) deadAddrs(n int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.peers {
		p.mu.Lock()
		if p.ml == stateDead && p.addr != "" && len(out) < n {
			out = append(out, p.addr)
		}
		p.mu.Unlock()
	}
	return out
}

// hostsLoop gossips what the node hosts when it changed since the
// metadata memberlist last took.
func (f *Fabric) hostsLoop() {
	defer f.wg.Done()
	if f.cfg.Hosts == nil {
		return
	}
	t := time.NewTicker(f.cfg.HostsInterval)
	defer t.Stop()
	for {
		select {
		case <-f.done:
			return
		case <-t.C:
		}
		f.hostsMu.Lock()
		sent := f.hostsSent
		f.hostsMu.Unlock()
		if f.cfg.Hosts() != sent {
			if err := f.ml.UpdateNode(f.cfg.HostsInterval); err != nil {
				f.log.Debug("cluster: gossiping node meta", "err", err)
			}
		}
	}
}

// nodeMeta is what memberlist gossips of a node.
type nodeMeta struct {
	Cluster string `json:"c"`
	Client  string `json:"u,omitempty"`
	HTTP    string `json:"h,omitempty"`
	Version string `json:"v,omitempty"`
	Started int64  `json:"s"` // unix ms
	Leaving bool   `json:"l,omitempty"`
	Hosts
}

func (f *Fabric) nodeMeta() ([]byte, error) {
	m := nodeMeta{Cluster: f.advertise, Client: f.cfg.ClientURL, HTTP: f.cfg.HTTPURL, Version: f.cfg.Version,
		Started: f.cfg.Started.UnixMilli(), Leaving: f.leaving.Load()}
	if f.cfg.Hosts != nil {
		m.Hosts = f.cfg.Hosts()
		f.hostsMu.Lock()
		f.hostsSent = m.Hosts
		f.hostsMu.Unlock()
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("cluster: node metadata of %d bytes, limit %d: shorten the URLs or version", len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

// delegate is memberlist's Delegate: node metadata only.
type delegate Fabric

func (d *delegate) NodeMeta(limit int) []byte {
	b, err := (*Fabric)(d).nodeMeta()
	if err != nil || len(b) > limit {
		return nil
	}
	return b
}
func (d *delegate) NotifyMsg([]byte)                {}
func (d *delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (d *delegate) LocalState(bool) []byte          { return nil }
func (d *delegate) MergeRemoteState([]byte, bool)   {}

// events is memberlist's EventDelegate. Its calls come with memberlist's
// locks held: they only record and wake.
type events Fabric

func (e *events) NotifyJoin(n *memberlist.Node)   { (*Fabric)(e).memberEvent(n, stateAlive) }
func (e *events) NotifyUpdate(n *memberlist.Node) { (*Fabric)(e).memberEvent(n, stateAlive) }
func (e *events) NotifyLeave(n *memberlist.Node) {
	st := stateDead
	if n.State == memberlist.StateLeft {
		st = stateLeft
	}
	(*Fabric)(e).memberEvent(n, st)
}

// NotifyConflict is told when two nodes have the same name: the others
// keep the first, and the second is never admitted.
func (e *events) NotifyConflict(existing, other *memberlist.Node) {
	f := (*Fabric)(e)
	f.conflicts.log(f.log, "cluster: two nodes have the same name: node names must be unique; the one that came second is not admitted",
		"node", existing.Name, "addr", existing.Address(), "other_addr", other.Address())
}

// mlLog passes memberlist's log lines on to slog at their level, a line
// of a kind every 10 s at most (memberlist repeats some at each gossip).
type mlLog struct {
	log  *slog.Logger
	mu   sync.Mutex
	last map[string]time.Time
}

func (m *mlLog) Write(p []byte) (int, error) {
	s := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	switch {
	case strings.Contains(s, "[DEBUG]"):
		level = slog.LevelDebug
	case strings.Contains(s, "[ERR]"):
		level = slog.LevelWarn
	}
	if level > slog.LevelDebug && !m.due(s) {
		return len(p), nil
	}
	m.log.Log(context.Background(), level, "memberlist: "+s)
	return len(p), nil
}

// due reports whether a line like s may be logged now.
func (m *mlLog) due(s string) bool {
	key := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, s)
	if len(key) > 60 {
		key = key[:60]
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last == nil || len(m.last) > 256 {
		m.last = make(map[string]time.Time)
	}
	now := time.Now()
	if now.Sub(m.last[key]) < 10*time.Second {
		return false
	}
	m.last[key] = now
	return true
}

// logLimiter keeps a hostile peer from flooding the log: one line a
// second, with the count of those suppressed.
type logLimiter struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (l *logLimiter) log(log *slog.Logger, msg string, args ...any) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.last) < time.Second {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed_before", n)
	}
	log.Warn(msg, args...)
}

// Close leaves the cluster gracefully (the others see this node as
// left, not dead), closes every link and stops listening.
func (f *Fabric) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	ls := make([]*kindListener, 0, len(f.listeners))
	for _, l := range f.listeners {
		ls = append(ls, l)
	}
	peers := f.peerList()
	f.mu.Unlock()
	// memberlist's dead message about a node does not tell the others
	// whether it left: its metadata and a CLOSE on each link do.
	f.leaving.Store(true)
	for _, p := range peers {
		f.SendControl(p.name, &wire.Frame{Type: wire.TypeClose, Tag: "leaving"})
	}
	if err := f.ml.UpdateNode(time.Second); err != nil {
		f.log.Debug("cluster: leave", "err", err)
	}
	if err := f.ml.Leave(time.Second); err != nil {
		f.log.Debug("cluster: leave", "err", err)
	}
	close(f.done)
	f.ml.Shutdown()
	f.closeSockets()
	for _, l := range ls {
		l.Close()
	}
	for _, p := range peers {
		f.teardown(p, 0, cutOther, "this node is closing")
	}
	f.tr.wg.Wait()
	f.wg.Wait()
	return nil
}

// peerList returns the peers; f.mu is held.
func (f *Fabric) peerList() []*peer {
	peers := make([]*peer, 0, len(f.peers))
	for _, p := range f.peers {
		peers = append(peers, p)
	}
	return peers
}

func noDelay(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
}

// refusedErr reports whether a dial found nothing listening.
func refusedErr(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// readFile reads a small file (a CA bundle).
func readFile(name string) ([]byte, error) {
	fh, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, 1<<20+1))
	if err != nil {
		return nil, err
	}
	if len(b) > 1<<20 {
		return nil, fmt.Errorf("%s is over 1 MiB", name)
	}
	return b, nil
}

// ReadSecret reads a cluster secret file: its content, trailing line
// ends trimmed. It must hold at least 16 bytes and at most 4 KiB, and
// must not be readable by others than its owner.
func ReadSecret(name string) ([]byte, error) {
	fi, err := os.Stat(name)
	if err != nil {
		return nil, fmt.Errorf("cluster secret file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("cluster secret file %s is readable by others (mode %s): chmod 600 it", name, fi.Mode().Perm())
	}
	if fi.Size() > 4096 {
		return nil, fmt.Errorf("cluster secret file %s is over 4 KiB", name)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("cluster secret file: %w", err)
	}
	return CheckSecret([]byte(strings.TrimRight(string(b), "\r\n")))
}

// CheckSecret checks a cluster secret's length: 16 bytes to 4 KiB.
func CheckSecret(b []byte) ([]byte, error) {
	if len(b) < 16 {
		return nil, fmt.Errorf("cluster secret of %d bytes: at least 16 (openssl rand -hex 32 makes one)", len(b))
	}
	if len(b) > 4096 {
		return nil, errors.New("cluster secret over 4 KiB")
	}
	return b, nil
}
