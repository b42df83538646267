package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/courier-mq/courier/internal/wsnet"
)

// The transports a connection may come by, as [ConnInfo.Protocol] names
// them.
const (
	ProtoTCP       = "tcp"
	ProtoWebSocket = "websocket"
)

// WebSocketPath is where the management listener serves the WebSocket
// access layer.
const WebSocketPath = "/ws"

// WebSocketHandler returns the HTTP handler of the WebSocket access
// layer (docs/protocol.md, "WebSocket"): it upgrades a request to a
// WebSocket and serves the Courier protocol on it, one frame per binary
// message, with the same connection engine, handshake, authentication,
// limits and error codes as the TCP listener. The handler returns once
// the connection is upgraded, and the connection is served on a
// goroutine of its own: net/http's state for the request (its buffers,
// the request and its headers) is let go rather than kept for the
// connection's life.
//
// origins are the browser origins allowed besides the listener's own
// (same-origin) one: host patterns such as "chat.example.com" or
// "*.example.com", or with a scheme, "https://chat.example.com",
// matched with path.Match. A request with another Origin is refused
// with 403 before the upgrade. A request without Origin (not a
// browser) is let in: a browser always sends one.
func (s *Server) WebSocketHandler(origins []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		down := s.shutdown
		s.mu.Unlock()
		if down {
			http.Error(w, "the server is shutting down", http.StatusServiceUnavailable)
			return
		}
		hw := &hijackWriter{ResponseWriter: w}
		// co is the upgraded connection, set before its first read. The
		// callback holds it alone: hw holds net/http's state for the
		// request, which must go once the handler returns.
		var co *wsnet.Coalescer
		ws, err := websocket.Accept(hw, r, &websocket.AcceptOptions{
			Subprotocols:   []string{wsnet.Subprotocol},
			OriginPatterns: origins,
			// A ping is answered only when its pong need not wait: the
			// library writes pongs from the read loop.
			OnPingReceived: func(ctx context.Context, p []byte) bool { return co != nil && co.AnswerPing(ctx, p) },
		})
		if err != nil {
			// Accept has answered the request (403 for a refused
			// origin, 426 for a request that is no upgrade).
			s.logHandshakeFailed(r.RemoteAddr, errors.Join(errors.New("WebSocket upgrade refused"), err))
			return
		}
		if hw.raw == nil {
			ws.CloseNow()
			return
		}
		co = hw.raw
		// net/http may have left its deadlines on the connection.
		hw.raw.SetDeadline(time.Time{})
		nc := wsnet.NewConn(ws, hw.raw, int64(s.cfg.MaxFrame)+5)
		nc.ReadsThrough(hw.br)
		if c := s.admit(nc, ProtoWebSocket); c != nil {
			go s.run(c)
		}
	})
}

// hijackWriter keeps the connection that Hijack hands over, for its
// deadlines, and lets the listener hand back the place the connection
// took in its count of HTTP connections (see [Releaser]).
type hijackWriter struct {
	http.ResponseWriter
	raw *wsnet.Coalescer
	br  *bufio.Reader // what the library reads raw through
}

// Releaser is a connection that counts against a limit of the HTTP
// listener it came from; Release takes it out of the count, for good,
// when it stops being an HTTP connection.
type Releaser interface {
	Release()
}

// Hijack hijacks the connection as the ResponseWriter does.
func (h *hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	release(nc)
	// The WebSocket writes through a Coalescer, so that the frames of
	// one batch of the write loop reach the socket in one write.
	co := wsnet.NewCoalescer(nc)
	h.raw = co
	h.br = smallReader(brw.Reader)
	return co, bufio.NewReadWriter(h.br, bufio.NewWriterSize(co, wsWriteBuffer)), nil
}

// The buffers the WebSocket library keeps for the connection's life. The
// Coalescer gathers what is written, so the library's write buffer only
// needs to hold a control frame (at most 127 bytes from a server) in one
// piece; larger messages pass through it. Reads of a frame's body larger
// than the read buffer go straight into the engine's reader, which
// adapts to the traffic; the read buffer takes the headers and small
// frames, several at a time.
const (
	wsReadBuffer  = 1 << 10
	wsWriteBuffer = 256
)

// smallReader returns a reader of wsReadBuffer bytes holding what br,
// net/http's reader of 4 KiB, has buffered beyond the request (a client
// may send its first frames right behind it). The library reads the
// connection through it from then on.
func smallReader(br *bufio.Reader) *bufio.Reader {
	n := br.Buffered()
	ahead, _ := br.Peek(n)
	r := bufio.NewReaderSize(bytes.NewReader(bytes.Clone(ahead)), max(wsReadBuffer, n))
	r.Peek(n) // into the buffer: the library takes it from there
	return r
}

// release finds the Releaser under nc (through TLS and other wrappers
// that name the connection they wrap) and releases it.
func release(nc net.Conn) {
	for range 8 {
		if r, ok := nc.(Releaser); ok {
			r.Release()
			return
		}
		u, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			return
		}
		nc = u.NetConn()
	}
}

// Unwrap returns the ResponseWriter under h (for http.ResponseController).
func (h *hijackWriter) Unwrap() http.ResponseWriter { return h.ResponseWriter }
