package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/courier-mq/courier/internal/wsnet"
)

// dialWebSocket opens a WebSocket to addr at list's path (ws:// or
// wss://) and returns it as a net.Conn that carries one frame per
// message (see docs/protocol.md, "WebSocket").
func dialWebSocket(ctx context.Context, list URLs, addr string, cfg *tls.Config) (net.Conn, error) {
	scheme := "ws"
	if list.TLS || cfg != nil {
		scheme = "wss"
	}
	u := url.URL{Scheme: scheme, Host: addr, Path: list.WSPath}
	var mu sync.Mutex
	var raw net.Conn
	keep := func(nc net.Conn) {
		mu.Lock()
		raw = nc
		mu.Unlock()
	}
	var d net.Dialer
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			nc, err := d.DialContext(ctx, network, a)
			if err == nil {
				if tc, ok := nc.(*net.TCPConn); ok {
					tc.SetNoDelay(true)
				}
				nc = wsnet.NewCoalescer(nc)
				keep(nc)
			}
			return nc, err
		},
		DialTLSContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			nc, err := d.DialContext(ctx, network, a)
			if err != nil {
				return nil, err
			}
			host, _, _ := net.SplitHostPort(a)
			tc, err := handshakeTLS(ctx, nc, host, cfg)
			if err != nil {
				return nil, err
			}
			co := wsnet.NewCoalescer(tc)
			keep(co)
			return co, nil
		},
		ForceAttemptHTTP2: false,
	}
	defer tr.CloseIdleConnections()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultDialTimeout)
		defer cancel()
	}
	ws, _, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{
		HTTPClient:   &http.Client{Transport: tr, Timeout: 0},
		Subprotocols: []string{wsnet.Subprotocol},
	})
	if err != nil {
		return nil, fmt.Errorf("WebSocket: %w", err)
	}
	mu.Lock()
	nc := raw
	mu.Unlock()
	if nc == nil {
		ws.CloseNow()
		return nil, fmt.Errorf("WebSocket: no connection under it")
	}
	nc.SetDeadline(time.Time{})
	// No limit of the WebSocket's own: the frame reader bounds each
	// frame from its length prefix, and wsnet each message by its frame.
	return wsnet.NewConn(ws, nc, -1), nil
}
