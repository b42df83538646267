// Package server serves the Courier wire protocol over TCP: it accepts
// connections, runs the handshake, and gives each connection a read loop
// that hands frames to the broker and a write loop that batches what the
// broker sends back. Heartbeats find half-open connections; credit slows
// publishers; bad input closes only the connection that sent it.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/netserve"
	"github.com/courier-mq/courier/wire"
)

// ErrServerClosed is returned by [Server.Serve] after [Server.Shutdown].
var ErrServerClosed = errors.New("server: closed")

// Config configures a Server.
type Config struct {
	// Listen is the TCP address to listen on. Default: "127.0.0.1:7400".
	Listen string
	// MaxFrame is the largest frame accepted after the handshake.
	// Default: wire.DefaultMaxFrame (4 MiB).
	MaxFrame int
	// Heartbeat is the highest heartbeat interval; clients may ask for
	// less. A connection silent for three intervals is closed.
	// Default: 1s.
	Heartbeat time.Duration
	// HandshakeTimeout bounds the wait for HELLO. Default: 5s.
	HandshakeTimeout time.Duration
	// Credit is the window of PUBLISH and REQUEST frames a client may have
	// unprocessed. Default: 65536.
	Credit uint64
	// OutboxLimit is the bytes buffered for a client beyond which data
	// frames wait for it to read. Default: 128 KiB.
	OutboxLimit int
	// SlowTimeout is how long data frames wait for a client that does not
	// read before it is disconnected as a slow consumer. Default: 10s.
	SlowTimeout time.Duration
	// MaxConns bounds the connections whose handshake succeeded; the
	// HELLO of one more is refused with [wire.CodeTooManyConns].
	// Connections still in their handshake count against MaxHandshakes
	// instead, so that sockets that never log in cannot lock users out.
	// Default: 65536.
	MaxConns int
	// MaxHandshakes bounds the connections still in their handshake
	// (accepted, HELLO not yet answered), node-wide; one more is refused
	// at once with [wire.CodeHandshakeLimit]. Default: 1024.
	MaxHandshakes int
	// MaxHandshakesPerAddr bounds the connections still in their
	// handshake from one source address (an IPv4 address, or an IPv6
	// /64); one more is refused at once with [wire.CodeHandshakeLimit].
	// Default: 64.
	MaxHandshakesPerAddr int
	// MaxConnsPerUser bounds the connections of one user; one more is
	// refused with [wire.CodeTooManyConns] at its HELLO. Connections
	// without a user name are not counted. Default: 0, no limit.
	MaxConnsPerUser int
	// Log receives structured logs. Default: slog.Default().
	Log *slog.Logger
	// Version is reported in WELCOME. Default: "courier".
	Version string
	// Users authenticates clients at HELLO and decides what each may do
	// (see [auth.Store]). With nil, or while it has no users, every
	// client is anonymous and may do anything. Default: nil.
	Users *auth.Store
	// TLS, when set, makes the listener speak TLS only: a client that
	// sends plain frames gets a fatal ERROR saying so. Set ClientAuth and
	// ClientCAs to require client certificates. Default: nil (plain TCP).
	TLS *tls.Config
	// ManagementURL returns the management API's URL, which the server
	// names to an HTTP client that reached the client port; "" or nil
	// when there is none. Default: nil.
	ManagementURL func() string
	// ConnectURLs returns the client addresses (host:port) the WELCOME
	// names in connect_urls, where clients may reconnect: this server's
	// own, and in a cluster every node's. At most [MaxConnectURLs] of
	// them, each at most [MaxConnectURLLen] bytes, are sent. Default: nil
	// (none named).
	ConnectURLs func() []string
}

// Bounds on connect_urls in WELCOME, which clients enforce too.
const (
	MaxConnectURLs   = 64
	MaxConnectURLLen = 255
)

// connectURLs returns what the WELCOME names in connect_urls.
func (c *Config) connectURLs() []string {
	if c.ConnectURLs == nil {
		return nil
	}
	var out []string
	for _, u := range c.ConnectURLs() {
		if len(out) == MaxConnectURLs {
			break
		}
		if u != "" && len(u) <= MaxConnectURLLen {
			out = append(out, u)
		}
	}
	return out
}

// DefaultConfig returns the defaults documented on [Config].
func DefaultConfig() Config {
	return Config{
		Listen:           "127.0.0.1:7400",
		MaxFrame:         wire.DefaultMaxFrame,
		Heartbeat:        time.Second,
		HandshakeTimeout: 5 * time.Second,
		Credit:           65536,
		OutboxLimit:      1 << 17,
		SlowTimeout:      10 * time.Second,
		MaxConns:         65536,
		MaxHandshakes:    1024,
		Version:          "courier",

		MaxHandshakesPerAddr: 64,
	}
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if c.MaxFrame <= 0 {
		c.MaxFrame = d.MaxFrame
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = d.Heartbeat
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.Credit == 0 {
		c.Credit = d.Credit
	}
	if c.OutboxLimit <= 0 {
		c.OutboxLimit = d.OutboxLimit
	}
	if c.SlowTimeout <= 0 {
		c.SlowTimeout = d.SlowTimeout
	}
	if c.MaxConns <= 0 {
		c.MaxConns = d.MaxConns
	}
	if c.MaxHandshakes <= 0 {
		c.MaxHandshakes = d.MaxHandshakes
	}
	if c.MaxHandshakesPerAddr <= 0 {
		c.MaxHandshakesPerAddr = d.MaxHandshakesPerAddr
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Version == "" {
		c.Version = d.Version
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.MaxFrame > 1<<30 {
		return fmt.Errorf("server: max frame %d over 1 GiB", c.MaxFrame)
	}
	if c.Credit < 2 {
		return fmt.Errorf("server: credit %d below 2", c.Credit)
	}
	return nil
}

// Server accepts client connections for one broker.
type Server struct {
	cfg Config
	b   *broker.Broker
	log *slog.Logger

	mu       sync.Mutex // guards ln, conns, users, adm, shutdown
	ln       net.Listener
	conns    map[*conn]struct{} // every connection, in its handshake or not
	users    map[string]int     // connections by user name
	adm      admission
	shutdown bool
	wg       sync.WaitGroup
	ends     endCounters
}

// New returns a server for b.
func New(cfg Config, b *broker.Broker) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, b: b, log: cfg.Log, conns: make(map[*conn]struct{}), users: make(map[string]int), adm: newAdmission()}, nil
}

// Listen opens the configured address; Serve then accepts on it.
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("server: listen %s: %w", s.cfg.Listen, err)
	}
	return ln, nil
}

// Addr returns the address being served, once Serve runs.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Serve accepts connections on ln until Shutdown; it then returns
// ErrServerClosed.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.ln = ln
	s.mu.Unlock()
	s.log.Info("listening", "addr", ln.Addr().String(), "tls", s.cfg.TLS != nil, "users", s.cfg.Users != nil && s.cfg.Users.HasUsers())
	err := netserve.Serve(ln, s.log, "accept failed; retrying", s.stopped, s.accept)
	if errors.Is(err, netserve.ErrStopped) {
		return ErrServerClosed
	}
	return fmt.Errorf("server: accept: %w", err)
}

// stopped reports whether the server stopped accepting.
func (s *Server) stopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shutdown
}

func (s *Server) accept(nc net.Conn) {
	c := s.admit(nc, ProtoTCP)
	if c == nil {
		return
	}
	go s.run(c)
}

// admit counts a new connection, or refuses it (a fatal ERROR, then
// close) when too many are in their handshake, and returns nil. Over
// TCP it wraps nc in TLS when the listener speaks TLS.
func (s *Server) admit(nc net.Conn, proto string) *conn {
	key := addrKey(nc.RemoteAddr())
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		nc.Close()
		return nil
	}
	if e := s.admitHandshake(key); e != nil {
		s.mu.Unlock()
		s.logRefused(nc, e)
		if proto == ProtoTCP {
			s.refuseNew(nc, e)
		} else {
			refuse(nc, e)
		}
		return nil
	}
	if s.cfg.TLS != nil && proto == ProtoTCP {
		nc = tls.Server(nc, s.cfg.TLS)
	}
	c := newConn(s, nc)
	c.proto = proto
	s.conns[c] = struct{}{}
	s.startHandshake(c, key)
	s.wg.Add(1)
	s.mu.Unlock()
	return c
}

// run serves an admitted connection to its end.
func (s *Server) run(c *conn) {
	c.serve() // its end calls s.forget and s.wg.Done
}

// refuse writes one fatal ERROR frame and closes nc.
func refuse(nc net.Conn, e *wire.Error) {
	f := &wire.Frame{Type: wire.TypeError, Flags: wire.FlagFatal, Aux: uint64(e.Code), Tag: e.Msg}
	p, _ := wire.AppendFrame(nil, f, 0)
	nc.SetDeadline(time.Now().Add(time.Second))
	nc.Write(p)
	nc.Close()
}

// ConnEnds count the connections that ended otherwise than by the
// client's CLOSE or the server's: each is a subscriber that lost what
// was sent to it meanwhile, and a client that reconnects (the default)
// shows as one of them and a new connection.
type ConnEnds struct {
	// Heartbeat counts the connections cut because nothing came from
	// the client for the heartbeat timeout (three heartbeats).
	Heartbeat uint64
	// SlowConsumer counts the connections cut because the client did
	// not read for the slow-consumer timeout.
	SlowConsumer uint64
	// Vanished counts the connections the client closed or reset
	// without CLOSE: a process that died, or a client that gave up on
	// the connection (its own heartbeat timeout) to reconnect.
	Vanished uint64
}

// endCounters are a server's ConnEnds.
type endCounters struct {
	heartbeat, slow, vanished atomic.Uint64
}

// Ends returns the counts of connections that ended abnormally since
// the server started.
func (s *Server) Ends() ConnEnds {
	return ConnEnds{Heartbeat: s.ends.heartbeat.Load(), SlowConsumer: s.ends.slow.Load(), Vanished: s.ends.vanished.Load()}
}

// Conns returns the number of open connections, in their handshake or
// not.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// dropUser forgets a connection of user.
func (s *Server) dropUser(user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users[user]--; s.users[user] <= 0 {
		delete(s.users, user)
	}
}

// stopAccepting closes the listener for good and returns the open
// connections.
func (s *Server) stopAccepting() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.shutdown = true
	if s.ln != nil {
		s.ln.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// GoAway starts a graceful shutdown: the server stops accepting and
// sends every client a CLOSE with code 16 (shutting down) whose Ref gives
// drain in ms, the time the server keeps the connection open for the
// requests in flight to finish. Connections stay open until
// [Server.Shutdown].
func (s *Server) GoAway(drain time.Duration) {
	ms := uint64(max(drain, time.Millisecond) / time.Millisecond)
	msg := fmt.Sprintf("the server is shutting down; requests in flight have %s to finish", drain)
	for _, c := range s.stopAccepting() {
		c.goAway(&wire.Error{Code: wire.CodeShutdown, Msg: msg}, ms)
	}
}

// Shutdown stops accepting, tells every client the server is going (a
// CLOSE frame, unless [Server.GoAway] did), closes their connections and
// waits for their goroutines, or until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	for _, c := range s.stopAccepting() {
		c.fail(&wire.Error{Code: wire.CodeShutdown, Msg: "the server is shutting down"}, true)
	}
	return netserve.Wait(ctx, &s.wg)
}
