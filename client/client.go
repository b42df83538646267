// Package client connects to a Courier server over the network. Dial
// returns the same [courier.Conn] an embedded node gives, so code written
// against one runs against the other.
//
//	conn, err := client.Dial(ctx, "courier://127.0.0.1:7400", client.Options{})
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/wire"
)

// DefaultPort is the port of a courier:// URL that names none.
const DefaultPort = "7400"

// frameSlack mirrors the server's allowance for routing fields it adds.
const frameSlack = 64 << 10

// Options configure Dial.
type Options struct {
	// Name names the client in the server's logs and management API.
	Name string
	// Heartbeat is the heartbeat interval to ask for; the server may
	// lower it. The connection is declared dead after three silent
	// intervals. Default: the server's (1s).
	Heartbeat time.Duration
	// User and Password authenticate when the server has users. A URL's
	// userinfo sets them too.
	User, Password string
	// TLS configures TLS. A courier+tls:// (or tls://) URL turns TLS on,
	// with this config or, when nil, the system's roots; with a
	// courier:// URL a non-nil TLS turns it on too. Give Certificates for
	// a server that requires client certificates and RootCAs for a
	// private CA. ServerName defaults to the URL's host. Default: nil.
	TLS *tls.Config
	// OutboxLimit bounds the bytes buffered for sending before senders
	// wait. Default: 128 KiB.
	OutboxLimit int
	// Log receives what the connection cannot return to a caller.
	// Default: slog.Default().
	Log *slog.Logger

	// NoReconnect turns reconnecting off: the Conn closes when its
	// connection is lost, as [courier.ErrClosed] with the reason.
	// Default: false (reconnect).
	NoReconnect bool
	// MaxReconnects bounds the rounds of attempts after a loss (each
	// round tries every known server once) before the Conn gives up and
	// closes. Negative: no bound. Default: 0, which means 120 (about two
	// minutes with the default waits).
	MaxReconnects int
	// ReconnectWait is the wait after the first round of attempts that
	// failed; it doubles with each round up to ReconnectWaitMax, and
	// each wait is jittered to between half and all of it, so that
	// clients that lost the same server do not come back in step. The
	// first round starts at once. Defaults: 100ms and 1s.
	ReconnectWait, ReconnectWaitMax time.Duration
	// DialTimeout bounds one connection attempt while reconnecting:
	// TCP connect, TLS and the HELLO/WELCOME handshake. Default: 2s.
	DialTimeout time.Duration
	// ReconnectBufSize bounds the bytes of publishes and submits held
	// while reconnecting, to be sent once reconnected; past it a
	// publish or submit fails at once with [ErrReconnectBufferFull].
	// Negative: hold nothing. Default: 8 MiB (as NATS).
	ReconnectBufSize int
	// IgnoreDiscoveredURLs makes the client reconnect only to the URLs
	// it was given, not to those a server names in its WELCOME
	// (connect_urls). Default: false.
	IgnoreDiscoveredURLs bool
	// OnConnEvent, if set, is called with every [courier.ConnEvent]:
	// disconnected, reconnected, closed. See [courier.Conn.OnConnEvent].
	OnConnEvent func(courier.ConnEvent)
	// ProducerID names the Conn's confirmed submits for deduplication
	// (see [courier.ConnOptions.ProducerID]): a submit resent after a
	// reconnect carries the same (producer, seq) and is stored once.
	// Set it, stable across restarts of the process, together with
	// [courier.Task.Seq], for a producer that resends what its previous
	// run may have submitted. At most 64 bytes of [A-Za-z0-9._:-].
	// Default: a random id, new for each Dial. Against a server that
	// does not deduplicate (its WELCOME lacks "dedup"), none is sent.
	ProducerID string
	// NoDedup sends no producer id: submits are not deduplicated.
	// Default: false.
	NoDedup bool
}

// Reconnect defaults; see [Options].
const (
	DefaultMaxReconnects    = 120
	DefaultReconnectWait    = 100 * time.Millisecond
	DefaultReconnectWaitMax = time.Second
	DefaultDialTimeout      = 2 * time.Second
	DefaultReconnectBufSize = 8 << 20
)

func (o *Options) setDefaults() {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.OutboxLimit <= 0 {
		o.OutboxLimit = 1 << 17
	}
	if o.MaxReconnects == 0 {
		o.MaxReconnects = DefaultMaxReconnects
	}
	if o.ReconnectWait <= 0 {
		o.ReconnectWait = DefaultReconnectWait
	}
	if o.ReconnectWaitMax <= 0 {
		o.ReconnectWaitMax = DefaultReconnectWaitMax
	}
	o.ReconnectWaitMax = max(o.ReconnectWaitMax, o.ReconnectWait)
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.ReconnectBufSize == 0 {
		o.ReconnectBufSize = DefaultReconnectBufSize
	}
}

// URL schemes: courier:// is plain TCP; courier+tls:// and its short
// form tls:// are TLS; ws:// and wss:// are the protocol over WebSocket
// (on the management listener, path /ws by default).
const (
	Scheme    = "courier"
	SchemeTLS = "courier+tls"
	SchemeWS  = "ws"
	SchemeWSS = "wss"
)

// DefaultWSPath is the WebSocket endpoint's path when a ws:// or wss://
// URL gives none.
const DefaultWSPath = "/ws"

// IsWebSocket reports whether a URL parsed by [ParseURL] asks for
// WebSocket.
func IsWebSocket(u *url.URL) bool { return u.Scheme == SchemeWS || u.Scheme == SchemeWSS }

// ParseURL checks a courier://, courier+tls:// or tls:// URL and returns
// its host:port.
func ParseURL(raw string) (addr string, u *url.URL, err error) {
	if !strings.Contains(raw, "://") {
		return "", nil, fmt.Errorf("client: bad URL %q: want courier://host:port", raw)
	}
	u, err = url.Parse(raw)
	if err != nil {
		// url.Parse quotes the URL, password included; say less.
		return "", nil, fmt.Errorf("client: bad URL: %v", errors.Unwrap(err))
	}
	shown := u.Redacted()
	if u.Scheme != Scheme && u.Scheme != SchemeTLS && u.Scheme != "tls" && !IsWebSocket(u) {
		return "", nil, fmt.Errorf("client: bad URL %q: scheme %q, want courier://host:port, courier+tls://host:port or ws://host:port/ws", shown, u.Scheme)
	}
	if u.Hostname() == "" {
		return "", nil, fmt.Errorf("client: bad URL %q: no host", shown)
	}
	port := u.Port()
	if port == "" {
		port = DefaultPort
		if IsWebSocket(u) {
			port = "7480" // the management listener's
		}
	}
	if IsWebSocket(u) {
		if u.Path == "" || u.Path == "/" {
			u.Path = DefaultWSPath
		}
		if u.RawQuery != "" || u.Fragment != "" {
			return "", nil, fmt.Errorf("client: bad URL %q: unexpected query", shown)
		}
		return net.JoinHostPort(u.Hostname(), port), u, nil
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", nil, fmt.Errorf("client: bad URL %q: unexpected path or query", shown)
	}
	return net.JoinHostPort(u.Hostname(), port), u, nil
}

// IsTLS reports whether a URL parsed by [ParseURL] asks for TLS.
func IsTLS(u *url.URL) bool {
	return u.Scheme == SchemeTLS || u.Scheme == "tls" || u.Scheme == SchemeWSS
}

// URLs is a list of servers parsed by [ParseURLs]: one scheme and one
// userinfo for them all.
type URLs struct {
	// TLS is set for courier+tls:// (or tls://).
	TLS bool
	// User is the URL's userinfo, or nil.
	User *url.Userinfo
	// Addrs are the servers' host:port, in the order given.
	Addrs []string
	// WSPath is the WebSocket endpoint's path for ws:// and wss://
	// URLs (the first URL's); "" for the TCP schemes.
	WSPath string

	scheme string
	shown  map[string]string // addr → the URL as given, password redacted
}

// ParseURLs parses a list of servers: one URL whose host part is a
// comma-separated list, such as
// "courier://user:password@10.0.0.1:7400,10.0.0.2:7400,10.0.0.3"
// (a host without a port takes [DefaultPort]), or full URLs separated by
// commas, all with the same scheme: "courier://a:7400,courier://b:7400".
// The userinfo, given once, holds for every server.
func ParseURLs(raw string) (URLs, error) {
	var list URLs
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return list, fmt.Errorf("client: bad URL %q: want courier://host:port", raw)
	}
	var parts []string
	if strings.Contains(rest, "://") {
		parts = strings.Split(raw, ",") // full URLs
	} else {
		userinfo := ""
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			userinfo, rest = rest[:at+1], rest[at+1:]
		}
		for _, h := range strings.Split(rest, ",") {
			parts = append(parts, scheme+"://"+userinfo+h)
		}
	}
	for i, p := range parts {
		p = strings.TrimSpace(p)
		addr, u, err := ParseURL(p)
		if err != nil {
			if len(parts) > 1 {
				return list, fmt.Errorf("%w (server %d of %d)", err, i+1, len(parts))
			}
			return list, err
		}
		if i == 0 {
			list.scheme, list.TLS, list.User = u.Scheme, IsTLS(u), u.User
			list.shown = make(map[string]string)
			if IsWebSocket(u) {
				list.WSPath = u.Path
			}
		} else {
			if IsWebSocket(u) != (list.WSPath != "") {
				return list, fmt.Errorf("client: bad URL list: %q and %q mix WebSocket and TCP", list.shown[list.Addrs[0]], u.Redacted())
			}
			if IsTLS(u) != list.TLS {
				return list, fmt.Errorf("client: bad URL list: %q and %q mix TLS and plain TCP", list.shown[list.Addrs[0]], u.Redacted())
			}
			if u.User != nil && (list.User == nil || u.User.String() != list.User.String()) {
				return list, fmt.Errorf("client: bad URL list: %q: give the user once, in the first URL", u.Redacted())
			}
		}
		if _, dup := list.shown[addr]; dup {
			continue
		}
		list.Addrs = append(list.Addrs, addr)
		list.shown[addr] = u.Redacted()
	}
	return list, nil
}

// show returns addr as a URL for messages, without the password.
func (l *URLs) show(addr string) string {
	if s, ok := l.shown[addr]; ok {
		return s
	}
	return l.scheme + "://" + addr
}

// Dial connects to a server at rawURL, such as "courier://127.0.0.1:7400"
// or "courier+tls://user:password@broker.example:7400", and completes the
// handshake before it returns. rawURL may list several servers, which
// Dial tries in order: "courier://a:7400,b:7400,c:7400" (see
// [ParseURLs]), each for at most [Options.DialTimeout] when there are
// several. A server that refuses the credentials fails it with a
// [*wire.Error] of code [wire.CodeUnauthorized].
//
// Unless [Options.NoReconnect], the Conn outlives its connection: when
// the connection is lost it reconnects to one of the servers it knows
// (the list and those the servers name in their WELCOME), at random,
// with jittered exponential backoff, declares its exchanges again and
// re-attaches its attachments; see [Options] and [courier.ConnEvent].
func Dial(ctx context.Context, rawURL string, opts Options) (*courier.Conn, error) {
	list, err := ParseURLs(rawURL)
	if err != nil {
		return nil, err
	}
	if list.User != nil && opts.User == "" {
		opts.User = list.User.Username()
		opts.Password, _ = list.User.Password()
	}
	if opts.ProducerID != "" && !wire.ValidProducer(opts.ProducerID) {
		return nil, fmt.Errorf("%w: producer id %.80q: want 1 to %d bytes of [A-Za-z0-9._:-]", courier.ErrBadOptions, opts.ProducerID, wire.MaxProducerLen)
	}
	opts.setDefaults()
	t := newTransport(list, opts)
	var errs []error
	for _, addr := range list.Addrs {
		l, err := t.dialFirst(ctx, addr, len(list.Addrs) > 1)
		if err != nil {
			if len(list.Addrs) == 1 {
				return nil, err
			}
			errs = append(errs, err)
			if errors.Is(err, courier.ErrUnauthorized) {
				break // the same users everywhere: no use trying on
			}
			continue
		}
		t.start(l)
		return t.conn, nil
	}
	return nil, fmt.Errorf("client: no server of %d reachable: %w", len(list.Addrs), dialErrors(errs))
}

// dialErrors are the errors of the servers of a list, on one line.
type dialErrors []error

func (e dialErrors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e dialErrors) Unwrap() []error { return e }

// dialFirst is dial for Dial: with more servers to try, one that does
// not answer gets at most DialTimeout of ctx.
func (t *transport) dialFirst(ctx context.Context, addr string, more bool) (*link, error) {
	if more {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.opts.DialTimeout)
		defer cancel()
	}
	return t.dial(ctx, addr)
}

// dial connects to addr and runs the handshake.
func (t *transport) dial(ctx context.Context, addr string) (*link, error) {
	shown := t.list.show(addr)
	if t.list.WSPath != "" {
		nc, err := dialWebSocket(ctx, t.list, addr, t.opts.TLS)
		if err != nil {
			return nil, fmt.Errorf("client: dial %s: %w", shown, err)
		}
		return t.handshake(ctx, addr, shown, nc)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", shown, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if t.list.TLS || t.opts.TLS != nil {
		host, _, _ := net.SplitHostPort(addr)
		if nc, err = handshakeTLS(ctx, nc, host, t.opts.TLS); err != nil {
			return nil, fmt.Errorf("client: %s: %w", shown, err)
		}
	}
	return t.handshake(ctx, addr, shown, nc)
}

// handshake runs the protocol's handshake on nc, a new connection to
// addr, and returns its link.
func (t *transport) handshake(ctx context.Context, addr, shown string, nc net.Conn) (*link, error) {
	l := &link{
		t:       t,
		addr:    addr,
		nc:      nc,
		out:     wire.NewOutbox(nc, wire.HandshakeMaxFrame, t.opts.OutboxLimit),
		r:       wire.NewReader(nc, wire.HandshakeMaxFrame+frameSlack),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		credit:  make(chan struct{}, 1),
	}
	w, err := l.handshake(ctx, t.opts)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("client: %s: %w", shown, err)
	}
	l.welcome = w
	t.learn(w.ConnectURLs)
	return l, nil
}

// handshakeTLS runs the TLS handshake over nc, closing nc if it fails.
func handshakeTLS(ctx context.Context, nc net.Conn, host string, cfg *tls.Config) (net.Conn, error) {
	if cfg == nil {
		cfg = &tls.Config{}
	} else {
		cfg = cfg.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	tc := tls.Client(nc, cfg)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) {
			return nil, fmt.Errorf("TLS handshake: the server did not answer in TLS (a plain courier:// port?): %w", err)
		}
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	return tc, nil
}

// link is one TCP (or TLS) connection to a server; a [transport] uses
// one at a time.
type link struct {
	t       *transport
	addr    string // host:port
	nc      net.Conn
	out     *wire.Outbox
	r       *wire.Reader
	welcome wire.Welcome

	avail  atomic.Int64  // PUBLISH and REQUEST credit left
	credit chan struct{} // signalled when credit arrives

	seen atomic.Bool
	// holding is set while the read loop hands a frame to the
	// application, which may hold it (an inbox full): the server is not
	// silent then, the client is slow, and the server judges that.
	holding atomic.Bool
	// away is set when the server sent CLOSE with a drain time: new
	// requests fail with it (publishes and submits are held for the next
	// connection when the transport reconnects), the rest goes on until
	// the server closes the connection.
	away      atomic.Pointer[error]
	closeOnce sync.Once
	closeErr  error // what the Conn ends with when it does not reconnect
	cause     error // why the link ended, for ErrConnectionLost
	closing   chan struct{}
	done      chan struct{} // closed when the read loop ended
}

func (l *link) handshake(ctx context.Context, opts Options) (wire.Welcome, error) {
	var w wire.Welcome
	if d, ok := ctx.Deadline(); ok {
		l.nc.SetDeadline(d)
	} else {
		l.nc.SetDeadline(time.Now().Add(10 * time.Second))
	}
	defer l.nc.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { l.nc.SetDeadline(time.Now()) })
	defer stop()
	h := wire.Hello{
		Versions: []int{wire.Version}, Name: opts.Name,
		HeartbeatMS: int(max(opts.Heartbeat, 0) / time.Millisecond),
		User:        opts.User, Password: opts.Password,
	}
	body, _ := json.Marshal(h)
	p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeHello, Body: body}, 0)
	if _, err := l.nc.Write(p); err != nil {
		return w, fmt.Errorf("handshake: %w", err)
	}
	var f wire.Frame
	if err := l.r.Next(&f); err != nil {
		if errors.Is(err, wire.ErrFrameTooLarge) && bytes.HasPrefix(l.r.Head(), []byte("HTTP/")) {
			return w, fmt.Errorf("handshake: %w: the server answered in HTTP: this is a web port (a Courier server's management API?), not a Courier client port (the server's --listen address, default port %s)", ErrWrongPort, DefaultPort)
		}
		return w, fmt.Errorf("handshake: %w", err)
	}
	switch f.Type {
	case wire.TypeWelcome:
	case wire.TypeError:
		return w, &wire.Error{Code: wire.Code(f.Aux), Msg: f.Tag, Fatal: true}
	default:
		return w, fmt.Errorf("handshake: server sent %s before WELCOME", f.Type)
	}
	if err := json.Unmarshal(f.Body, &w); err != nil {
		return w, fmt.Errorf("handshake: bad WELCOME: %w", err)
	}
	if w.MaxFrame <= 0 || w.HeartbeatMS <= 0 {
		return w, fmt.Errorf("handshake: WELCOME lacks max_frame or heartbeat_ms")
	}
	l.out.SetMax(w.MaxFrame)
	l.r.SetMax(w.MaxFrame + frameSlack)
	l.avail.Store(int64(w.Credit))
	return w, nil
}

// send encodes f for the server; it does not take ownership of f.
// PUBLISH, REQUEST and SUBMIT wait for credit. It fails with a
// *downError once the link ends, and with an *awayError for those three
// once the server announced its shutdown.
func (l *link) send(ctx context.Context, f *wire.Frame) error {
	mode := wire.Control
	switch f.Type {
	case wire.TypePublish, wire.TypeRequest, wire.TypeSubmit:
		if away := l.away.Load(); away != nil {
			return &awayError{*away}
		}
		mode = wire.Data
		if f.Type == wire.TypeRequest {
			mode = wire.Urgent
		}
		if f.Type == wire.TypeSubmit && !l.welcome.Dedup && f.Tag != "" {
			f.Tag = stripDedup(f.Tag)
		}
		waited := false
		for l.avail.Add(-1) < 0 {
			l.avail.Add(1)
			waited = true
			select {
			case <-l.credit:
			case <-l.closing:
				return l.down()
			case <-ctx.Done():
				return fmt.Errorf("client: waiting for credit: %w", ctx.Err())
			}
		}
		if waited && l.avail.Load() > 0 {
			// One CREDIT wakes one waiter; pass the wake-up on while
			// credit is left, or the other waiters sleep on it.
			select {
			case l.credit <- struct{}{}:
			default:
			}
		}
	case wire.TypeResponse, wire.TypeAsk, wire.TypeAnswer:
		mode = wire.Urgent
	}
	if err := l.out.PutCancel(f, mode, ctx.Done()); err != nil {
		if errors.Is(err, wire.ErrOutboxClosed) {
			return l.down()
		}
		if errors.Is(err, wire.ErrOutboxFull) && ctx.Err() != nil {
			return fmt.Errorf("client: waiting for the server to read: %w", ctx.Err())
		}
		return err
	}
	return nil
}

// downError is the error of a send on a link that ended.
type downError struct{ err error }

func (e *downError) Error() string { return e.err.Error() }
func (e *downError) Unwrap() error { return e.err }

// awayError is the error of a PUBLISH, REQUEST or SUBMIT to a server that
// announced its shutdown.
type awayError struct{ err error }

func (e *awayError) Error() string { return e.err.Error() }
func (e *awayError) Unwrap() error { return e.err }

// down is the error of a send once the link is ending.
func (l *link) down() error {
	select {
	case <-l.closing:
		if l.closeErr != nil {
			return &downError{l.closeErr}
		}
	default:
	}
	return &downError{courier.ErrClosed}
}

// end starts closing with err, what the Conn ends with if it does not
// reconnect, caused by cause: the write loop flushes and closes the
// socket.
func (l *link) end(err, cause error) {
	l.closeOnce.Do(func() {
		l.closeErr, l.cause = err, cause
		close(l.closing)
		// A write held by a server that does not read ends within a
		// second, and the socket closes.
		l.out.Expire(time.Now().Add(time.Second))
	})
}

// run starts the link's loops.
func (l *link) run() {
	go l.writeLoop()
	go l.readLoop()
}

// testHookRead, when set, runs before each frame a link's read loop
// reads: tests hold the loop there, as a starved one would be.
var testHookRead atomic.Pointer[func()]

func (l *link) readLoop() {
	defer close(l.done)
	var drain *time.Timer
	defer func() {
		if drain != nil {
			drain.Stop()
		}
		l.end(courier.ErrClosed, courier.ErrClosed)
	}()
	for {
		if h := testHookRead.Load(); h != nil {
			(*h)()
		}
		f := wire.NewFrame(0)
		if err := l.r.Next(f); err != nil {
			f.Release()
			if away := l.away.Load(); away != nil {
				l.end(*away, *away) // the end the server announced
			}
			l.end(fmt.Errorf("%w: %v", courier.ErrClosed, err), err)
			return
		}
		l.seen.Store(true)
		switch f.Type {
		case wire.TypePing:
			f.Type = wire.TypePong
			l.out.Put(f, wire.Control, 0)
			f.Release()
		case wire.TypePong:
			f.Release()
		case wire.TypeCredit:
			l.avail.Add(int64(f.Aux))
			f.Release()
			select {
			case l.credit <- struct{}{}:
			default:
			}
		case wire.TypeClose:
			// The error matches both ErrClosed and the code, such as
			// wire.CodeShutdown.
			we := &wire.Error{Code: wire.Code(f.Aux), Msg: f.Tag}
			err := fmt.Errorf("%w by the server: %w", courier.ErrClosed, we)
			ms := f.Ref
			f.Release()
			if ms == 0 || l.away.Load() != nil {
				l.end(err, we)
				return
			}
			// The server drains: it takes no new requests, and answers
			// those in flight for ms before it closes. Wait for that
			// (and a heartbeat timeout more), not longer.
			l.away.Store(&err)
			wait := time.Duration(ms)*time.Millisecond + time.Duration(l.welcome.TimeoutMS)*time.Millisecond
			drain = time.AfterFunc(wait, func() { l.end(err, we) })
		case wire.TypeError:
			if f.Flags&wire.FlagFatal != 0 {
				we := &wire.Error{Code: wire.Code(f.Aux), Msg: f.Tag, Fatal: true}
				l.end(we, we)
				f.Release()
				return
			}
			l.hand(f)
		default:
			l.hand(f)
		}
	}
}

// hand gives f to the application, which may hold the read loop.
func (l *link) hand(f *wire.Frame) {
	l.holding.Store(true)
	l.t.receive(f)
	l.holding.Store(false)
}

// writeLoop writes batches until the connection is to end; a
// [wire.Heartbeat] pings when idle and ends a connection that stayed
// silent for three heartbeats, even while a write is held.
func (l *link) writeLoop() {
	hb := time.Duration(l.welcome.HeartbeatMS) * time.Millisecond
	timeout := time.Duration(l.welcome.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = 3 * hb
	}
	watch := wire.Heartbeat{
		Out:      l.out,
		Interval: func() time.Duration { return hb },
		Timeout:  func(time.Duration) time.Duration { return timeout },
		// Bytes from the server waiting in the socket for a read loop
		// that is behind (busy, or starved of CPU) are not silence: see
		// wire.Unread.
		Heard: func() bool { return l.seen.Swap(false) || l.holding.Load() || wire.Unread(l.nc) > 0 },
		Silent: func(timeout time.Duration) {
			we := &wire.Error{Code: wire.CodeHeartbeat, Msg: fmt.Sprintf("nothing from the server for %s", timeout)}
			l.end(we, we)
		},
		Done: l.closing,
	}
	defer watch.Start(hb)()
	for {
		select {
		case <-l.out.Ready():
			if _, err := l.out.Flush(); err != nil {
				l.end(fmt.Errorf("%w: %v", courier.ErrClosed, err), err)
			}
		case <-l.closing:
			if rest := l.out.Close(); len(rest) > 0 {
				l.nc.SetWriteDeadline(time.Now().Add(time.Second))
				l.nc.Write(rest)
			}
			l.nc.Close()
			return
		}
	}
}

// stripDedup removes the pid and seq task options from a SUBMIT's Tag,
// for a server that does not deduplicate (a Conn that reconnected to an
// older one): it would refuse them.
func stripDedup(tag string) string {
	if !strings.Contains(tag, "pid=") {
		return tag
	}
	parts := strings.Split(tag, ";")
	kept := parts[:0]
	for _, p := range parts {
		if !strings.HasPrefix(p, "pid=") && !strings.HasPrefix(p, "seq=") {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, ";")
}
