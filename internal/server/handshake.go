package server

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
)

// Admission of connections. A connection is in its handshake from its
// accept until its HELLO is answered; only then does it count against
// Config.MaxConns. Handshakes have caps of their own, node-wide
// (Config.MaxHandshakes) and per source address
// (Config.MaxHandshakesPerAddr), so that sockets that never log in cannot
// take the places of users: one source holds at most MaxHandshakesPerAddr
// of them, each for at most Config.HandshakeTimeout.

// refusers bounds the goroutines writing a refusal over TLS: its
// handshake is work a flood must not multiply. Past it a refused TLS
// connection is closed without a word.
const refusers = 32

// admission is the server's count of connections in their handshake
// and of those logged in. Its fields are guarded by Server.mu.
type admission struct {
	// handshaking maps each connection in its handshake to its source
	// key (see addrKey); byAddr counts them per key.
	handshaking map[*conn]string
	byAddr      map[string]int
	// live holds the connections whose handshake succeeded.
	live map[*conn]struct{}
	// refusing holds a token per refusal being written over TLS.
	refusing chan struct{}
	// refusedLog and failedLog sample the logs of refused connections and
	// of failed handshakes.
	refusedLog, failedLog sampler
}

func newAdmission() admission {
	return admission{
		handshaking: make(map[*conn]string), byAddr: make(map[string]int),
		live: make(map[*conn]struct{}), refusing: make(chan struct{}, refusers),
	}
}

// addrKey is the source a handshake counts against: the IPv4 address,
// or the /64 of an IPv6 address (see [auth.Source]).
func addrKey(a net.Addr) string { return auth.Source(a.String()) }

// admitHandshake counts a new connection from key in its handshake, or
// refuses it past the node-wide or the per-address cap. s.mu is held.
func (s *Server) admitHandshake(key string) *wire.Error {
	a := &s.adm
	if len(a.handshaking) >= s.cfg.MaxHandshakes {
		return wire.Errorf(wire.CodeHandshakeLimit, "the server has %d connections in their handshake, its limit; try again later", s.cfg.MaxHandshakes)
	}
	if a.byAddr[key] >= s.cfg.MaxHandshakesPerAddr {
		return wire.Errorf(wire.CodeHandshakeLimit, "%s has %d connections in their handshake, the limit per address; try again later", key, s.cfg.MaxHandshakesPerAddr)
	}
	a.byAddr[key]++
	return nil
}

// startHandshake records c, admitted from key. s.mu is held.
func (s *Server) startHandshake(c *conn, key string) {
	s.adm.handshaking[c] = key
}

// endHandshake stops counting c as in its handshake; it may be called
// more than once.
func (s *Server) endHandshake(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := &s.adm
	key, ok := a.handshaking[c]
	if !ok {
		return
	}
	delete(a.handshaking, c)
	if a.byAddr[key]--; a.byAddr[key] <= 0 {
		delete(a.byAddr, key)
	}
}

// full reports whether Config.MaxConns connections are logged in. The
// handshake asks before it pays for a password check.
func (s *Server) full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.adm.live) >= s.cfg.MaxConns
}

// establish counts c as logged in, as user ("" for none), or refuses it
// past Config.MaxConns or Config.MaxConnsPerUser.
func (s *Server) establish(c *conn, user string) *wire.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.adm.live) >= s.cfg.MaxConns {
		return tooManyConns(s.cfg.MaxConns)
	}
	if user != "" {
		if max := s.cfg.MaxConnsPerUser; max > 0 && s.users[user] >= max {
			return wire.Errorf(wire.CodeTooManyConns, "user %q has %d connections, the limit per user", user, max)
		}
		s.users[user]++
	}
	s.adm.live[c] = struct{}{}
	return nil
}

func tooManyConns(max int) *wire.Error {
	return wire.Errorf(wire.CodeTooManyConns, "the server has %d connections, its limit", max)
}

// forget drops c from every count once it has ended.
func (s *Server) forget(c *conn) {
	s.endHandshake(c)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	delete(s.adm.live, c)
}

// refuseNew refuses a connection that was not admitted: one fatal ERROR
// frame and close. Over plain TCP the frame is written at once, from the
// accept loop (a new socket's send buffer takes it without waiting); over
// TLS it needs a handshake, which runs in one of at most [refusers]
// goroutines, each for at most a second, or not at all.
func (s *Server) refuseNew(nc net.Conn, e *wire.Error) {
	if s.cfg.TLS == nil {
		refuse(nc, e)
		return
	}
	select {
	case s.adm.refusing <- struct{}{}:
		go func() {
			defer func() { <-s.adm.refusing }()
			refuse(tls.Server(nc, s.cfg.TLS), e)
		}()
	default:
		nc.Close()
	}
}

// logRefused logs a refused connection, at most one line per
// refusedLogEvery with the count of those not logged since.
func (s *Server) logRefused(nc net.Conn, e *wire.Error) {
	if n, ok := s.adm.refusedLog.take(time.Now(), refusedLogEvery); ok {
		s.log.Warn("connection refused: limit reached", "peer", nc.RemoteAddr().String(), "code", int(e.Code), "err", e.Msg,
			slog.Int("refused_since_last_line", n))
	}
}

// logHandshakeFailed logs a failed handshake (silence, bad input, bad
// credentials), at most one line per refusedLogEvery with the count of
// those not logged since: any client can fail handshakes at will.
func (s *Server) logHandshakeFailed(peer string, err error) {
	if n, ok := s.adm.failedLog.take(time.Now(), refusedLogEvery); ok {
		s.log.Info("handshake failed", "peer", peer, "err", err, slog.Int("failed_since_last_line", n))
	}
}

// refusedLogEvery is the least interval between two log lines about
// refused connections.
const refusedLogEvery = 10 * time.Second

// sampler lets one event in per interval and counts the others.
type sampler struct {
	mu      sync.Mutex // guards last, skipped
	last    time.Time
	skipped int
}

// take reports whether an event at now is to be logged, and how many
// were skipped since the last that was.
func (l *sampler) take(now time.Time, every time.Duration) (skipped int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < every {
		l.skipped++
		return 0, false
	}
	skipped, l.skipped, l.last = l.skipped, 0, now
	return skipped, true
}

// login checks the credentials of HELLO h before deadline, the end of
// the handshake. On a failure it tells the client (the failure itself is
// logged by st, a line per source per 10 s) and returns the error.
func (c *conn) login(st *auth.Store, h wire.Hello, deadline time.Time) (string, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	go func() {
		// A shutdown does not wait out a failure's delay.
		select {
		case <-c.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	user, err := st.Login(ctx, auth.Attempt{User: h.User, Password: h.Password, Peer: c.peer, Via: "client"})
	if err == nil {
		return user, nil
	}
	var e *wire.Error
	switch {
	case errors.Is(err, auth.ErrBusy):
		e = wire.Errorf(wire.CodeHandshakeLimit, "too many logins in progress; try again later")
		c.s.logRefused(c.nc, e)
	case errors.Is(err, auth.ErrNoCredentials):
		e = wire.Errorf(wire.CodeUnauthorized, "this server requires a user name and password (courier://user:password@host:port)")
	default:
		e = wire.Errorf(wire.CodeUnauthorized, "bad user name or password")
	}
	c.fail(e, false)
	return "", e
}
