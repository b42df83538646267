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
}

// URL schemes: courier:// is plain TCP; courier+tls:// and its short
// form tls:// are TLS.
const (
	Scheme    = "courier"
	SchemeTLS = "courier+tls"
)

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
	if u.Scheme != Scheme && u.Scheme != SchemeTLS && u.Scheme != "tls" {
		return "", nil, fmt.Errorf("client: bad URL %q: scheme %q, want courier://host:port or courier+tls://host:port", shown, u.Scheme)
	}
	if u.Hostname() == "" {
		return "", nil, fmt.Errorf("client: bad URL %q: no host", shown)
	}
	port := u.Port()
	if port == "" {
		port = DefaultPort
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", nil, fmt.Errorf("client: bad URL %q: unexpected path or query", shown)
	}
	return net.JoinHostPort(u.Hostname(), port), u, nil
}

// IsTLS reports whether a URL parsed by [ParseURL] asks for TLS.
func IsTLS(u *url.URL) bool { return u.Scheme == SchemeTLS || u.Scheme == "tls" }

// Dial connects to a server at rawURL, such as "courier://127.0.0.1:7400"
// or "courier+tls://user:password@broker.example:7400", and completes the
// handshake before it returns. A server that refuses the credentials
// fails it with a [*wire.Error] of code [wire.CodeUnauthorized].
func Dial(ctx context.Context, rawURL string, opts Options) (*courier.Conn, error) {
	addr, u, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	shown := u.Redacted()
	if u.User != nil && opts.User == "" {
		opts.User = u.User.Username()
		opts.Password, _ = u.User.Password()
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.OutboxLimit <= 0 {
		opts.OutboxLimit = 1 << 17
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", shown, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if IsTLS(u) || opts.TLS != nil {
		if nc, err = handshakeTLS(ctx, nc, u.Hostname(), opts.TLS); err != nil {
			return nil, fmt.Errorf("client: %s: %w", shown, err)
		}
	}
	t := &transport{
		nc:      nc,
		out:     wire.NewOutbox(nc, wire.HandshakeMaxFrame, opts.OutboxLimit),
		r:       wire.NewReader(nc, wire.HandshakeMaxFrame+frameSlack),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		credit:  make(chan struct{}, 1),
	}
	w, err := t.handshake(ctx, opts)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("client: %s: %w", shown, err)
	}
	t.welcome = w
	t.conn = courier.NewConn(t, courier.ConnOptions{ID: w.Conn, Log: opts.Log})
	go t.writeLoop()
	go t.readLoop()
	return t.conn, nil
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

// transport carries a Conn's frames over TCP.
type transport struct {
	nc      net.Conn
	out     *wire.Outbox
	r       *wire.Reader
	welcome wire.Welcome
	conn    *courier.Conn
	recv    func(*wire.Frame)

	avail  atomic.Int64  // PUBLISH and REQUEST credit left
	credit chan struct{} // signalled when credit arrives

	seen atomic.Bool
	// holding is set while the read loop hands a frame to the
	// application, which may hold it (an inbox full): the server is not
	// silent then, the client is slow, and the server judges that.
	holding atomic.Bool
	// away is set when the server sent CLOSE with a drain time: new
	// requests and publishes fail with it, the rest goes on until the
	// server closes the connection.
	away      atomic.Pointer[error]
	closeOnce sync.Once
	closeErr  error
	closing   chan struct{}
	done      chan struct{} // closed when the read loop ended
}

var (
	_ courier.Transport     = (*transport)(nil)
	_ courier.ContextSender = (*transport)(nil)
)

func (t *transport) handshake(ctx context.Context, opts Options) (wire.Welcome, error) {
	var w wire.Welcome
	if d, ok := ctx.Deadline(); ok {
		t.nc.SetDeadline(d)
	} else {
		t.nc.SetDeadline(time.Now().Add(10 * time.Second))
	}
	defer t.nc.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { t.nc.SetDeadline(time.Now()) })
	defer stop()
	h := wire.Hello{
		Versions: []int{wire.Version}, Name: opts.Name,
		HeartbeatMS: int(max(opts.Heartbeat, 0) / time.Millisecond),
		User:        opts.User, Password: opts.Password,
	}
	body, _ := json.Marshal(h)
	p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeHello, Body: body}, 0)
	if _, err := t.nc.Write(p); err != nil {
		return w, fmt.Errorf("handshake: %w", err)
	}
	var f wire.Frame
	if err := t.r.Next(&f); err != nil {
		if errors.Is(err, wire.ErrFrameTooLarge) && bytes.HasPrefix(t.r.Head(), []byte("HTTP/")) {
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
	t.out.SetMax(w.MaxFrame)
	t.r.SetMax(w.MaxFrame + frameSlack)
	t.avail.Store(int64(w.Credit))
	return w, nil
}

func (t *transport) Start(recv func(*wire.Frame)) { t.recv = recv }

// Send encodes f for the server. PUBLISH and REQUEST wait for credit.
func (t *transport) Send(f *wire.Frame) error {
	return t.SendContext(context.Background(), f)
}

// SendContext is Send for a caller that may give up: waiting for credit
// or for room in the outbox ends with ctx, before f was sent.
func (t *transport) SendContext(ctx context.Context, f *wire.Frame) error {
	defer f.Release()
	mode := wire.Control
	switch f.Type {
	case wire.TypePublish, wire.TypeRequest, wire.TypeSubmit:
		if away := t.away.Load(); away != nil {
			return *away
		}
		mode = wire.Data
		if f.Type == wire.TypeRequest {
			mode = wire.Urgent
		}
		waited := false
		for t.avail.Add(-1) < 0 {
			t.avail.Add(1)
			waited = true
			select {
			case <-t.credit:
			case <-t.closing:
				return t.err()
			case <-ctx.Done():
				return fmt.Errorf("client: waiting for credit: %w", ctx.Err())
			}
		}
		if waited && t.avail.Load() > 0 {
			// One CREDIT wakes one waiter; pass the wake-up on while
			// credit is left, or the other waiters sleep on it.
			select {
			case t.credit <- struct{}{}:
			default:
			}
		}
	case wire.TypeResponse, wire.TypeAsk, wire.TypeAnswer:
		mode = wire.Urgent
	}
	if err := t.out.PutCancel(f, mode, ctx.Done()); err != nil {
		if errors.Is(err, wire.ErrOutboxClosed) {
			return t.err()
		}
		if errors.Is(err, wire.ErrOutboxFull) && ctx.Err() != nil {
			return fmt.Errorf("client: waiting for the server to read: %w", ctx.Err())
		}
		return err
	}
	return nil
}

func (t *transport) err() error {
	select {
	case <-t.closing:
		if t.closeErr != nil {
			return t.closeErr
		}
	default:
	}
	return courier.ErrClosed
}

// Close tells the server and closes the connection.
func (t *transport) Close() error {
	t.out.Put(&wire.Frame{Type: wire.TypeClose, Tag: "client closed"}, wire.Control, 0)
	t.end(courier.ErrClosed)
	<-t.done
	return nil
}

// end starts closing: the write loop flushes and closes the socket.
func (t *transport) end(err error) {
	t.closeOnce.Do(func() {
		t.closeErr = err
		close(t.closing)
		// A write held by a server that does not read ends within a
		// second, and the socket closes.
		t.out.Expire(time.Now().Add(time.Second))
	})
}

func (t *transport) readLoop() {
	defer close(t.done)
	var drain *time.Timer
	defer func() {
		if drain != nil {
			drain.Stop()
		}
		t.end(courier.ErrClosed)
		t.conn.Closed(t.closeErr)
	}()
	for {
		f := wire.NewFrame(0)
		if err := t.r.Next(f); err != nil {
			f.Release()
			if away := t.away.Load(); away != nil {
				t.end(*away) // the end the server announced
			}
			t.end(fmt.Errorf("%w: %v", courier.ErrClosed, err))
			return
		}
		t.seen.Store(true)
		switch f.Type {
		case wire.TypePing:
			f.Type = wire.TypePong
			t.out.Put(f, wire.Control, 0)
			f.Release()
		case wire.TypePong:
			f.Release()
		case wire.TypeCredit:
			t.avail.Add(int64(f.Aux))
			f.Release()
			select {
			case t.credit <- struct{}{}:
			default:
			}
		case wire.TypeClose:
			// The error matches both ErrClosed and the code, such as
			// wire.CodeShutdown.
			err := fmt.Errorf("%w by the server: %w", courier.ErrClosed, &wire.Error{Code: wire.Code(f.Aux), Msg: f.Tag})
			ms := f.Ref
			f.Release()
			if ms == 0 || t.away.Load() != nil {
				t.end(err)
				return
			}
			// The server drains: it takes no new requests, and answers
			// those in flight for ms before it closes. Wait for that
			// (and a heartbeat timeout more), not longer.
			t.away.Store(&err)
			wait := time.Duration(ms)*time.Millisecond + time.Duration(t.welcome.TimeoutMS)*time.Millisecond
			drain = time.AfterFunc(wait, func() { t.end(err) })
		case wire.TypeError:
			if f.Flags&wire.FlagFatal != 0 {
				t.end(&wire.Error{Code: wire.Code(f.Aux), Msg: f.Tag, Fatal: true})
				f.Release()
				return
			}
			t.hand(f)
		default:
			t.hand(f)
		}
	}
}

// hand gives f to the application, which may hold the read loop.
func (t *transport) hand(f *wire.Frame) {
	t.holding.Store(true)
	t.recv(f)
	t.holding.Store(false)
}

// writeLoop writes batches until the connection is to end; a
// [wire.Heartbeat] pings when idle and ends a connection that stayed
// silent for three heartbeats, even while a write is held.
func (t *transport) writeLoop() {
	hb := time.Duration(t.welcome.HeartbeatMS) * time.Millisecond
	timeout := time.Duration(t.welcome.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = 3 * hb
	}
	watch := wire.Heartbeat{
		Out:      t.out,
		Interval: func() time.Duration { return hb },
		Timeout:  func(time.Duration) time.Duration { return timeout },
		Heard:    func() bool { return t.seen.Swap(false) || t.holding.Load() },
		Silent: func(timeout time.Duration) {
			t.end(&wire.Error{Code: wire.CodeHeartbeat, Msg: fmt.Sprintf("nothing from the server for %s", timeout)})
		},
		Done: t.closing,
	}
	defer watch.Start(hb)()
	for {
		select {
		case <-t.out.Ready():
			if _, err := t.out.Flush(); err != nil {
				t.end(fmt.Errorf("%w: %v", courier.ErrClosed, err))
			}
		case <-t.closing:
			if rest := t.out.Close(); len(rest) > 0 {
				t.nc.SetWriteDeadline(time.Now().Add(time.Second))
				t.nc.Write(rest)
			}
			t.nc.Close()
			return
		}
	}
}
