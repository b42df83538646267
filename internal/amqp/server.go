package amqp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/netserve"
)

// DefaultPort is AMQP's IANA port, where RabbitMQ listens.
const DefaultPort = "5672"

// Config configures a [Server].
type Config struct {
	// Listen is the TCP address to listen on. Default: "127.0.0.1:5672".
	Listen string
	// TLS, when set, makes the listener speak TLS only (amqps://).
	// Default: nil (plain TCP).
	TLS *tls.Config
	// Users authenticates logins (PLAIN and AMQPLAIN). While it is nil or
	// has no users, only guest/guest is accepted, and only from a
	// loopback address, as RabbitMQ's default user. Default: nil.
	Users *auth.Store
	// FrameMax is the largest frame offered in connection.tune, header
	// and end marker included; a client may ask for less. Default:
	// 131072, RabbitMQ's.
	FrameMax uint32
	// ChannelMax is the highest channel number offered in
	// connection.tune. Default: 2047, RabbitMQ's.
	ChannelMax uint16
	// Heartbeat is the heartbeat interval offered in connection.tune; the
	// client's tune-ok decides (0 turns heartbeats off). A connection
	// silent for two intervals is closed. Default: 60s, RabbitMQ's.
	Heartbeat time.Duration
	// HandshakeTimeout bounds the time from accept to connection.open.
	// Default: 10s, RabbitMQ's.
	HandshakeTimeout time.Duration
	// WriteTimeout bounds every write to a client: a client that takes
	// nothing of what waits for it (256 KiB at a time) for this long is
	// cut off as a slow consumer. Default: 10s.
	WriteTimeout time.Duration
	// OutboxLimit bounds the bytes waiting to be written to one client:
	// a delivery that would take it past the limit cuts the client off
	// as a slow consumer (one message always passes an empty buffer);
	// other frames may take it to twice the limit. Default: 16 MiB; at
	// least twice MaxMessage (and 64 KiB).
	OutboxLimit int
	// MaxHandshakes bounds the connections still in their handshake; one
	// more is closed at once. Default: 1024.
	MaxHandshakes int
	// MaxConns bounds the open connections past their handshake; one
	// more is refused with connection.close 530. Default: 65536.
	MaxConns int
	// Broker, when set, is where AMQP exchanges and publications go:
	// each connection is one of its sessions. Without it every method
	// beyond connection and channel fails with 540. Default: nil.
	Broker *broker.Broker
	// MaxMessage bounds a publication's body; a larger one closes its
	// channel with 406. Default: 4 MiB less 64 KiB, so that a message
	// fits a Courier frame of the default maximum.
	MaxMessage int
	// Log receives structured logs. Default: slog.Default().
	Log *slog.Logger
	// Version is the "version" server property. Default: "courier".
	Version string
}

// DefaultConfig returns the defaults documented on [Config].
func DefaultConfig() Config {
	return Config{
		Listen:           "127.0.0.1:" + DefaultPort,
		FrameMax:         131072,
		ChannelMax:       2047,
		Heartbeat:        60 * time.Second,
		HandshakeTimeout: 10 * time.Second,
		WriteTimeout:     10 * time.Second,
		OutboxLimit:      16 << 20,
		MaxHandshakes:    1024,
		MaxConns:         65536,
		MaxMessage:       4<<20 - 64<<10,
		Version:          "courier",
	}
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if c.FrameMax == 0 {
		c.FrameMax = d.FrameMax
	}
	if c.ChannelMax == 0 {
		c.ChannelMax = d.ChannelMax
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = d.Heartbeat
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = d.WriteTimeout
	}
	if c.OutboxLimit <= 0 {
		c.OutboxLimit = d.OutboxLimit
	}
	if c.MaxMessage <= 0 {
		c.MaxMessage = d.MaxMessage
	}
	// Two of the largest messages always fit, with their frames.
	c.OutboxLimit = max(c.OutboxLimit, 2*c.MaxMessage+64<<10)
	if c.MaxHandshakes <= 0 {
		c.MaxHandshakes = d.MaxHandshakes
	}
	if c.MaxConns <= 0 {
		c.MaxConns = d.MaxConns
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
	if c.FrameMax != 0 && c.FrameMax < FrameMinSize {
		return fmt.Errorf("amqp: frame max %d below %d: %w", c.FrameMax, FrameMinSize, ErrConfig)
	}
	if c.Heartbeat < 0 || c.Heartbeat > 0xffff*time.Second {
		return fmt.Errorf("amqp: heartbeat %s outside 0 to 65535s: %w", c.Heartbeat, ErrConfig)
	}
	return nil
}

// Server accepts AMQP 0-9-1 connections.
type Server struct {
	cfg Config
	log *slog.Logger

	mu          sync.Mutex // guards ln, conns, handshaking, open, shutdown
	ln          net.Listener
	conns       map[*conn]struct{}
	owners      owners              // exclusive queues
	consumers   queueConsumers      // AMQP consumers by queue, exclusive ones
	kinds       exchangeKinds       // exchange types, for bindings
	autoDel     autoDeletes         // auto-delete queues
	autoDelX    autoDeleteExchanges // auto-delete exchanges
	replies     replies             // direct reply-to consumers
	movers      movers              // bindings moved into their queues, in a cluster
	handshaking int
	open        int
	shutdown    bool
	wg          sync.WaitGroup
}

// New returns a server with cfg.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	s := &Server{cfg: cfg, log: cfg.Log, conns: make(map[*conn]struct{})}
	s.movers.s = s
	return s, nil
}

// Listen opens the configured address; [Server.Serve] then accepts on it.
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("%w on %s: %w", ErrListen, s.cfg.Listen, err)
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

// OutboxLimit returns the outbox limit in force: [Config.OutboxLimit]
// after its default and its floor (twice MaxMessage and 64 KiB).
func (s *Server) OutboxLimit() int { return s.cfg.OutboxLimit }

// Conns returns the number of open connections, in their handshake or not.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Serve accepts connections on ln until [Server.Shutdown], and then
// returns [ErrServerClosed].
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.ln = ln
	s.mu.Unlock()
	s.log.Info("amqp listening", "addr", ln.Addr().String(), "tls", s.cfg.TLS != nil)
	s.startMovers()
	err := netserve.Serve(ln, s.log, "amqp accept failed; retrying", s.stopped, s.accept)
	if errors.Is(err, netserve.ErrStopped) {
		return ErrServerClosed
	}
	return fmt.Errorf("amqp: accept: %w", err)
}

// stopped reports whether Shutdown ran.
func (s *Server) stopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shutdown
}

func (s *Server) accept(nc net.Conn) {
	s.mu.Lock()
	if s.shutdown || s.handshaking >= s.cfg.MaxHandshakes {
		full := !s.shutdown
		s.mu.Unlock()
		if full {
			s.log.Warn("amqp connection refused: too many in their handshake", "peer", nc.RemoteAddr().String(), "limit", s.cfg.MaxHandshakes)
		}
		nc.Close()
		return
	}
	if s.cfg.TLS != nil {
		nc = tls.Server(nc, s.cfg.TLS)
	}
	c := newConn(s, nc)
	s.conns[c] = struct{}{}
	s.handshaking++
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		c.serve()
		s.forget(c)
	}()
}

// opened moves c from its handshake to the open connections, or refuses
// it past MaxConns.
func (s *Server) opened(c *conn) *Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.inHandshake = false
	s.handshaking--
	if s.open >= s.cfg.MaxConns {
		return Errorf(NotAllowed, "the server has %d connections, its limit", s.cfg.MaxConns)
	}
	s.open++
	c.counted = true
	return nil
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	if c.inHandshake {
		s.handshaking--
	}
	if c.counted {
		s.open--
	}
}

// Shutdown stops accepting, closes every connection with
// connection.close 320 (connection forced), and waits for their
// goroutines or until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shutdown = true
	if s.ln != nil {
		s.ln.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.shutdown()
	}
	err := netserve.Wait(ctx, &s.wg)
	s.movers.close()
	return err
}
