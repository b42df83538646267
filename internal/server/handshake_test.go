package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// Connections still in their handshake have caps of their own, node-wide
// and per source address, and do not count against max_connections: a
// client that opens sockets and never logs in cannot lock users out.

// dialFrom opens a TCP connection to n from the loopback address src
// (127.0.0.0/8 is all loopback on Linux: each address is a distinct
// source for the server). It is closed when the test ends.
func dialFrom(t *testing.T, n *node.Node, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", n.Addr().String())
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// fatalCodes reads the first frame of each connection in the background
// and sends the code of each fatal ERROR received; connections that get
// nothing (held in their handshake) send nothing.
func fatalCodes(conns []net.Conn) <-chan wire.Code {
	codes := make(chan wire.Code, len(conns))
	for _, c := range conns {
		go func() {
			var f wire.Frame
			if wire.NewReader(c, 1<<16).Next(&f) == nil && f.Type == wire.TypeError && f.Flags&wire.FlagFatal != 0 {
				codes <- wire.Code(f.Aux)
			}
		}()
	}
	return codes
}

// expectCodes receives n codes, each want, and then checks that no other
// is waiting.
func expectCodes(t *testing.T, codes <-chan wire.Code, n int, want wire.Code) {
	t.Helper()
	for i := range n {
		if code := testutil.Recv(t, codes, 10*time.Second); code != want {
			t.Fatalf("refusal %d has code %s, want %s", i, code, want)
		}
	}
	select {
	case code := <-codes:
		t.Fatalf("more connections refused than the limit explains (code %s)", code)
	default:
	}
}

// TestSilentSocketsDoNotLockOut: a source that opens more sockets than
// the per-address handshake cap and never sends HELLO gets the extra ones
// refused at once with code 28; the ones it holds do not count against
// max_connections, so clients from elsewhere still log in and work, up
// to max_connections (past which a HELLO is refused with code 21).
func TestSilentSocketsDoNotLockOut(t *testing.T) {
	const perAddr, extra = 8, 5
	n := startNodeWith(t, func(c *node.Config) {
		c.Limits.MaxConns = 2
		c.Limits.MaxHandshakes = 100
		c.Limits.MaxHandshakesPerAddr = perAddr
		c.Limits.HandshakeTimeout = time.Minute // the silent ones hold their place
	})
	var silent []net.Conn
	for range perAddr + extra {
		silent = append(silent, dialFrom(t, n, "127.0.0.2"))
	}
	expectCodes(t, fatalCodes(silent), extra, wire.CodeHandshakeLimit)

	// max_connections is 2, and the attacker holds 8 sockets: a
	// requester and a handler still log in, and work.
	ex := echoService(t, n, "lockout")
	stillServes(t, ex)
	// Past max_connections, a HELLO is refused.
	_, err := client.Dial(testutil.Context(t, 10*time.Second), n.URL(), client.Options{})
	mustCode(t, err, wire.CodeTooManyConns)
	stillServes(t, ex)
}

// TestHandshakeLimitNodeWide: past max_handshakes, from any address, a
// new connection is refused at once with code 28; logged-in clients keep
// working, and once the silent sockets go new clients log in again.
func TestHandshakeLimitNodeWide(t *testing.T) {
	const max, perAddr = 12, 5
	n := startNodeWith(t, func(c *node.Config) {
		c.Limits.MaxHandshakes = max
		c.Limits.MaxHandshakesPerAddr = perAddr
		c.Limits.HandshakeTimeout = time.Minute
	})
	ex := echoService(t, n, "nodewide")
	var silent []net.Conn
	for i := range max {
		silent = append(silent, dialFrom(t, n, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}[i/perAddr]))
	}
	codes := fatalCodes(silent)
	over := dialFrom(t, n, "127.0.0.5")
	expectCodes(t, fatalCodes([]net.Conn{over}), 1, wire.CodeHandshakeLimit)
	stillServes(t, ex)
	select {
	case code := <-codes:
		t.Fatalf("a connection within the caps was refused with code %s", code)
	default:
	}
	for _, c := range silent {
		c.Close()
	}
	testutil.WaitForf(t, 10*time.Second, canConnect(n, client.Options{}), "no connection accepted once the silent sockets closed")
	stillServes(t, ex)
}

// helloFrame is an encoded HELLO of an anonymous client.
func helloFrame(t *testing.T) []byte {
	t.Helper()
	body, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, Name: "flood"})
	p, err := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeHello, Body: body}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// msgCounter is a slog.Handler that counts the records of each message.
type msgCounter struct {
	mu sync.Mutex // guards n
	n  map[string]int
}

func (h *msgCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *msgCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *msgCounter) WithGroup(string) slog.Handler            { return h }
func (h *msgCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.n[r.Message]++
	h.mu.Unlock()
	return nil
}

func (h *msgCounter) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[msg]
}

// TestFailedLoginLogIsRateLimited: a burst of wrong passwords from one
// address is logged once (the rest of the period goes into one summary
// line at its end), and the right password still logs in.
func TestFailedLoginLogIsRateLimited(t *testing.T) {
	const guesses = 10
	logs := &msgCounter{n: make(map[string]int)}
	n := startNodeWith(t, func(c *node.Config) {
		c.Log = slog.New(logs)
		c.AdminUser, c.AdminPassword = "admin", "right"
		// The guesses queue for one password check at a time, and with
		// -race on a loaded machine each takes up to a second: the
		// default 5 s to log in refused some with code 28 (busy), which
		// is right but not what this test is about.
		c.Limits.HandshakeTimeout = time.Minute
	})
	var wg sync.WaitGroup
	errs := make(chan error, guesses)
	for i := range guesses {
		wg.Go(func() {
			_, err := client.Dial(testutil.Context(t, 30*time.Second), n.URL(), client.Options{User: "admin", Password: fmt.Sprint("guess", i)})
			errs <- err
		})
	}
	wg.Wait()
	for range guesses {
		var we *wire.Error
		if err := <-errs; !errors.As(err, &we) || we.Code != wire.CodeUnauthorized {
			t.Fatalf("a wrong password: %v, want code %s", err, wire.CodeUnauthorized)
		}
	}
	if got := logs.count("authentication failed"); got != 1 {
		t.Fatalf("%d wrong passwords from one address logged %d lines, want 1", guesses, got)
	}
	c := dial(t, n, client.Options{User: "admin", Password: "right"})
	if _, err := c.Exchanges(testutil.Context(t, 10*time.Second)); err != nil {
		t.Fatalf("the right password after the guesses: %v", err)
	}
}
