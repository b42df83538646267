package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"
)

// httpMethods start the requests an HTTP client sends first.
var httpMethods = [][]byte{
	[]byte("GET "), []byte("HEAD "), []byte("POST "), []byte("PUT "), []byte("DELETE "),
	[]byte("OPTIONS "), []byte("PATCH "), []byte("CONNECT "), []byte("TRACE "), []byte("PRI * HTTP/2"),
}

// looksHTTP reports whether the first bytes a client sent are an HTTP
// request: someone pointed a browser, curl or a management command at
// the client port.
func looksHTTP(head []byte) bool {
	for _, m := range httpMethods {
		n := min(len(m), len(head))
		if n >= 4 && bytes.Equal(head[:n], m[:n]) {
			return true
		}
	}
	return false
}

// wrongPortReason tells an HTTP client where the management API is.
func (s *Server) wrongPortReason() string {
	where := "on the server's --http address (default http://127.0.0.1:7480)"
	if s.cfg.ManagementURL != nil {
		if u := s.cfg.ManagementURL(); u != "" {
			where = "at " + u
		}
	}
	return "this is Courier's client port, which speaks the Courier protocol (courier:// URLs), not HTTP; the management API and dashboard are " + where
}

// answerHTTP answers an HTTP request on the client port with 400 and a
// JSON body in the management API's error shape, then closes nc. It
// half-closes and reads what the client still sends (a bounded amount,
// for a bounded time) first, so that the answer is not lost to a reset.
func answerHTTP(nc net.Conn, reason string) {
	body, _ := json.Marshal(map[string]string{"error": "wrong_port", "reason": reason})
	resp := fmt.Sprintf("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	nc.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(nc, resp); err != nil {
		return
	}
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(nc, 64<<10))
}
