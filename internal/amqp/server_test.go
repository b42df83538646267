package amqp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
)

// wait is the generous bound of every wait in these tests: the machine is
// loaded.
const wait = 30 * time.Second

// startServer serves cfg on 127.0.0.1:0 and returns the server and its
// amqp:// URL with guest's credentials.
func startServer(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return s, "amqp://guest:guest@" + ln.Addr().String() + "/"
}

func dial(t *testing.T, url string) *amqp091.Connection {
	t.Helper()
	c, err := amqp091.Dial(url)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wantCode checks that err is an AMQP error with code.
func wantCode(t *testing.T, err error, code int) *amqp091.Error {
	t.Helper()
	var ae *amqp091.Error
	if !errors.As(err, &ae) || ae.Code != code {
		t.Fatalf("err %v, want AMQP code %d", err, code)
	}
	return ae
}

func TestGuestOnLoopback(t *testing.T) {
	_, url := startServer(t, Config{})
	c := dial(t, url)
	if p := c.Properties["product"]; p != "Courier" {
		t.Fatalf("server product %v", p)
	}
	if c.Major != 0 || c.Minor != 9 {
		t.Fatalf("version %d-%d", c.Major, c.Minor)
	}
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	// The channel number can be opened again, and many channels at once.
	var chs []*amqp091.Channel
	for range 10 {
		ch, err := c.Channel()
		if err != nil {
			t.Fatal(err)
		}
		chs = append(chs, ch)
	}
	for _, ch := range chs {
		if err := ch.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestGuestRefused(t *testing.T) {
	s, url := startServer(t, Config{})
	for _, u := range []string{
		strings.Replace(url, "guest:guest", "guest:wrong", 1),
		strings.Replace(url, "guest:guest", "alice:guest", 1),
	} {
		_, err := amqp091.Dial(u)
		if !errors.Is(err, amqp091.ErrCredentials) {
			var ae *amqp091.Error
			if !errors.As(err, &ae) || ae.Code != AccessRefused {
				t.Fatalf("dial %s: %v, want access refused", u, err)
			}
		}
	}
	// guest is loopback-only, as in RabbitMQ.
	ctx := context.Background()
	if _, e := s.login(ctx, "PLAIN", "guest", "guest", "10.1.2.3:5000"); e == nil || e.Code != AccessRefused || !strings.Contains(e.Text, "localhost") {
		t.Fatalf("guest from 10.1.2.3: %v", e)
	}
	if _, e := s.login(ctx, "PLAIN", "guest", "guest", "[::1]:5000"); e != nil {
		t.Fatalf("guest from ::1: %v", e)
	}
}

func TestUsersPlainAndAMQPlain(t *testing.T) {
	users, err := auth.Open(auth.Config{Dir: t.TempDir(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	full := auth.FullAccess()
	if _, err := users.PutUser("alice", auth.UserChange{Password: "s3cret-passw0rd", Permissions: &full}); err != nil {
		t.Fatal(err)
	}
	_, url := startServer(t, Config{Users: users})
	alice := strings.Replace(url, "guest:guest", "alice:s3cret-passw0rd", 1)
	dial(t, alice).Close()
	c, err := amqp091.DialConfig(alice, amqp091.Config{SASL: []amqp091.Authentication{&amqp091.AMQPlainAuth{Username: "alice", Password: "s3cret-passw0rd"}}})
	if err != nil {
		t.Fatalf("AMQPLAIN: %v", err)
	}
	c.Close()
	// With users, guest is nobody.
	if _, err := amqp091.Dial(url); err == nil {
		t.Fatal("guest logged in on a node with users")
	}
	if _, err := amqp091.Dial(strings.Replace(url, "guest:guest", "alice:wrong-password", 1)); err == nil {
		t.Fatal("wrong password accepted")
	}
}

func TestCredentials(t *testing.T) {
	amqplain := func(t Table) string {
		e := encoder{}
		e.table(t)
		return string(e.b[4:])
	}
	cases := []struct {
		mech, resp, user, pass string
		code                   uint16
	}{
		{"PLAIN", "\x00u\x00p", "u", "p", 0},
		{"PLAIN", "authz\x00u\x00p", "u", "p", 0},
		{"PLAIN", "u\x00p", "", "", AccessRefused},
		{"AMQPLAIN", amqplain(Table{"LOGIN": "u", "PASSWORD": "p"}), "u", "p", 0},
		{"AMQPLAIN", amqplain(Table{"LOGIN": "u"}), "", "", AccessRefused},
		{"AMQPLAIN", "\x05LOGIN", "", "", AccessRefused},
		{"EXTERNAL", "", "", "", CommandInvalid},
	}
	for _, tc := range cases {
		u, p, e := credentials(tc.mech, tc.resp)
		switch {
		case tc.code != 0 && (e == nil || e.Code != tc.code):
			t.Errorf("%s %q: %v, want code %d", tc.mech, tc.resp, e, tc.code)
		case tc.code == 0 && (e != nil || u != tc.user || p != tc.pass):
			t.Errorf("%s %q: %q %q %v", tc.mech, tc.resp, u, p, e)
		}
	}
}

func TestVhostAndTune(t *testing.T) {
	_, url := startServer(t, Config{})
	_, err := amqp091.Dial(strings.TrimSuffix(url, "/") + "/other")
	wantCode(t, err, NotAllowed)
	// "/" spelled %2f, as clients write it, is the one vhost.
	dial(t, strings.TrimSuffix(url, "/")+"/%2f").Close()
	// amqp091-go takes the smaller of its limits and the server's.
	c, err := amqp091.DialConfig(url, amqp091.Config{FrameSize: 8192, ChannelMax: 3, Heartbeat: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Config.FrameSize != 8192 || c.Config.ChannelMax != 3 || c.Config.Heartbeat != 5*time.Second {
		t.Fatalf("tuned %+v", c.Config)
	}
	for range 3 {
		if _, err := c.Channel(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestShutdownForcesClose(t *testing.T) {
	s, url := startServer(t, Config{})
	c := dial(t, url)
	closed := c.NotifyClose(make(chan *amqp091.Error, 1))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	e := testutil.Recv(t, closed, wait)
	if e == nil || e.Code != ConnectionForced {
		t.Fatalf("close %v, want 320", e)
	}
	if n := s.Conns(); n != 0 {
		t.Fatalf("%d connections after shutdown", n)
	}
}

func TestMaxConns(t *testing.T) {
	s, url := startServer(t, Config{MaxConns: 1})
	c := dial(t, url)
	_, err := amqp091.Dial(url)
	wantCode(t, err, NotAllowed)
	c.Close()
	testutil.WaitFor(t, wait, func() bool { return s.Conns() == 0 })
	dial(t, url).Close()
}

func TestTLS(t *testing.T) {
	ca := testutil.NewCA(t)
	_, url := startServer(t, Config{TLS: &tls.Config{Certificates: []tls.Certificate{ca.Server().TLS}, MinVersion: tls.VersionTLS12}})
	url = strings.Replace(url, "amqp://", "amqps://", 1)
	c, err := amqp091.DialTLS(url, &tls.Config{RootCAs: ca.Pool})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Channel(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	// A plain client on the TLS port does not get in.
	if _, err := amqp091.DialConfig(strings.Replace(url, "amqps://", "amqp://", 1), amqp091.Config{Dial: amqp091.DefaultDial(5 * time.Second)}); err == nil {
		t.Fatal("plain client logged in on the TLS port")
	}
}

// TestUnsupportedFailsLoudly checks that methods not built yet close the
// connection with 540 rather than being ignored, and channel.flow as
// RabbitMQ answers it.
func TestUnsupportedFailsLoudly(t *testing.T) {
	_, url := startServer(t, Config{})
	c := dial(t, url)
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Flow(true); err != nil {
		t.Fatalf("flow active=true: %v", err)
	}
	_, err = ch.QueueDeclare("q", true, false, false, false, nil)
	ae := wantCode(t, err, NotImplemented)
	if !strings.Contains(ae.Reason, "queue.declare") {
		t.Fatalf("reason %q", ae.Reason)
	}
	c2 := dial(t, url)
	ch2, err := c2.Channel()
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, ch2.Flow(false), NotImplemented)
}

// rawClient speaks frames to the server with this package's codec, for the
// cases no well-behaved client produces.
type rawClient struct {
	t  *testing.T
	nc net.Conn
	r  *Reader
}

func rawDial(t *testing.T, url string) *rawClient {
	t.Helper()
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "amqp://guest:guest@"), "/")
	nc, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(wait))
	return &rawClient{t: t, nc: nc, r: NewReader(nc)}
}

func (rc *rawClient) write(b []byte) {
	rc.t.Helper()
	if _, err := rc.nc.Write(b); err != nil {
		rc.t.Fatal(err)
	}
}

func (rc *rawClient) method(channel uint16, m Method) {
	rc.t.Helper()
	b, err := AppendMethod(nil, channel, m)
	if err != nil {
		rc.t.Fatal(err)
	}
	rc.write(b)
}

// next reads the next method, skipping heartbeats.
func (rc *rawClient) next() Method {
	rc.t.Helper()
	for {
		f, err := rc.r.ReadFrame()
		if err != nil {
			rc.t.Fatalf("read: %v", err)
		}
		if f.Type == FrameHeartbeat {
			continue
		}
		m, err := DecodeMethod(f.Payload)
		if err != nil {
			rc.t.Fatal(err)
		}
		return m
	}
}

// open runs the handshake as guest with heartbeat hb (seconds) and opens
// channel 1.
func (rc *rawClient) open(hb uint16) {
	rc.t.Helper()
	rc.write(ProtocolHeader)
	if _, ok := rc.next().(*ConnectionStart); !ok {
		rc.t.Fatal("no connection.start")
	}
	rc.method(0, &ConnectionStartOK{Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"})
	tune, ok := rc.next().(*ConnectionTune)
	if !ok {
		rc.t.Fatal("no connection.tune")
	}
	rc.method(0, &ConnectionTuneOK{ChannelMax: tune.ChannelMax, FrameMax: tune.FrameMax, Heartbeat: hb})
	rc.r.SetFrameMax(tune.FrameMax)
	rc.method(0, &ConnectionOpen{VirtualHost: "/"})
	if _, ok := rc.next().(*ConnectionOpenOK); !ok {
		rc.t.Fatal("no connection.open-ok")
	}
	rc.method(1, &ChannelOpen{})
	if _, ok := rc.next().(*ChannelOpenOK); !ok {
		rc.t.Fatal("no channel.open-ok")
	}
}

// wantClose reads until connection.close, checks its code, answers
// close-ok, and checks the server then closes the socket.
func (rc *rawClient) wantClose(code uint16) *ConnectionClose {
	rc.t.Helper()
	for {
		m := rc.next()
		cl, ok := m.(*ConnectionClose)
		if !ok {
			continue
		}
		if cl.ReplyCode != code {
			rc.t.Fatalf("connection.close %d %q, want %d", cl.ReplyCode, cl.ReplyText, code)
		}
		rc.method(0, &ConnectionCloseOK{})
		rc.wantEOF()
		return cl
	}
}

func (rc *rawClient) wantEOF() {
	rc.t.Helper()
	for {
		_, err := rc.r.ReadFrame()
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
			rc.t.Fatalf("want the server to close, got %v", err)
		}
		return
	}
}

func TestProtocolErrors(t *testing.T) {
	_, url := startServer(t, Config{})
	frame := func(typ uint8, ch uint16, payload []byte) []byte {
		b := []byte{typ, byte(ch >> 8), byte(ch), 0, 0, 0, byte(len(payload))}
		return append(append(b, payload...), frameEnd)
	}
	method := func(ch uint16, m Method) []byte {
		b, err := AppendMethod(nil, ch, m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name  string
		send  []byte
		code  uint16
		class uint16
	}{
		{"bad frame end", append(frame(FrameMethod, 1, []byte{0, 20, 0, 40})[:11], 0), FrameError, 0},
		{"unknown frame type", frame(7, 1, nil), FrameError, 0},
		{"frame over frame_max", []byte{FrameBody, 0, 1, 0, 2, 0, 0}, FrameError, 0},
		{"truncated method", frame(FrameMethod, 1, []byte{0, 60, 0, 80, 0}), SyntaxError, ClassBasic},
		{"unknown method", frame(FrameMethod, 1, []byte{0, 60, 0, 99}), CommandInvalid, ClassBasic},
		{"content without publish", frame(FrameBody, 1, []byte("x")), UnexpectedFrame, 0},
		{"method on a closed channel", method(2, &BasicQos{PrefetchCount: 1}), ChannelError, ClassBasic},
		{"second channel.open", method(1, &ChannelOpen{}), ChannelError, ClassChannel},
		{"channel beyond channel_max", method(4000, &ChannelOpen{}), NotAllowed, ClassChannel},
		{"connection method on a channel", method(1, &ConnectionOpen{}), CommandInvalid, ClassConnection},
		{"channel method on channel 0", method(0, &ChannelOpen{}), CommandInvalid, ClassChannel},
		{"tx not built", method(1, &TxSelect{}), NotImplemented, ClassTx},
		{"update-secret", method(0, &ConnectionUpdateSecret{NewSecret: "x"}), NotImplemented, ClassConnection},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A healthy connection beside the bad one lives on.
			good := dial(t, url)
			rc := rawDial(t, url)
			rc.open(0)
			rc.write(tc.send)
			cl := rc.wantClose(tc.code)
			if cl.ClassID != tc.class {
				t.Fatalf("close names class %d, want %d (%q)", cl.ClassID, tc.class, cl.ReplyText)
			}
			if _, err := good.Channel(); err != nil {
				t.Fatalf("the other connection: %v", err)
			}
		})
	}
}

func TestHandshakeErrors(t *testing.T) {
	_, url := startServer(t, Config{HandshakeTimeout: 2 * time.Second})
	t.Run("wrong protocol header", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.write([]byte("AMQP\x01\x01\x00\x0a"))
		got := make([]byte, 8)
		if _, err := io.ReadFull(rc.nc, got); err != nil || !bytes.Equal(got, ProtocolHeader) {
			t.Fatalf("answer %q, %v", got, err)
		}
		rc.wantEOF()
	})
	t.Run("HTTP on the AMQP port", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.write([]byte("GET / HTTP/1.1\r\n\r\n"))
		got := make([]byte, 8)
		if _, err := io.ReadFull(rc.nc, got); err != nil || !bytes.Equal(got, ProtocolHeader) {
			t.Fatalf("answer %q, %v", got, err)
		}
	})
	t.Run("silent client", func(t *testing.T) {
		rc := rawDial(t, url)
		start := time.Now()
		rc.wantEOF() // closed after the 2 s handshake timeout
		if d := time.Since(start); d < time.Second {
			t.Fatalf("closed after %s, before the handshake timeout", d)
		}
	})
	t.Run("unknown mechanism", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.write(ProtocolHeader)
		rc.next()
		rc.method(0, &ConnectionStartOK{Mechanism: "EXTERNAL", Locale: "en_US"})
		rc.wantClose(CommandInvalid)
	})
	t.Run("frame_max below the minimum", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.write(ProtocolHeader)
		rc.next()
		rc.method(0, &ConnectionStartOK{Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"})
		rc.next()
		rc.method(0, &ConnectionTuneOK{FrameMax: 1024})
		rc.wantClose(NotAllowed)
	})
	t.Run("method out of order", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.write(ProtocolHeader)
		rc.next()
		rc.method(0, &ConnectionOpen{VirtualHost: "/"})
		rc.wantClose(CommandInvalid)
	})
	t.Run("client closes during the handshake", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.write(ProtocolHeader)
		rc.next()
		rc.method(0, &ConnectionClose{ReplyCode: ReplySuccess})
		if _, ok := rc.next().(*ConnectionCloseOK); !ok {
			t.Fatal("no close-ok")
		}
		rc.wantEOF()
	})
}

func TestMaxHandshakes(t *testing.T) {
	_, url := startServer(t, Config{MaxHandshakes: 1})
	first := rawDial(t, url) // holds the one handshake place
	first.write(ProtocolHeader)
	first.next()
	rawDial(t, url).wantEOF() // refused at once
	first.method(0, &ConnectionStartOK{Mechanism: "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"})
	tune := first.next().(*ConnectionTune)
	first.method(0, &ConnectionTuneOK{ChannelMax: tune.ChannelMax, FrameMax: tune.FrameMax})
	first.method(0, &ConnectionOpen{VirtualHost: "/"})
	if _, ok := first.next().(*ConnectionOpenOK); !ok {
		t.Fatal("no open-ok")
	}
	dial(t, url).Close() // the place is free again
}

// TestHeartbeats checks that the server sends heartbeats at the agreed
// interval and closes a client silent for two intervals (RabbitMQ's rule).
func TestHeartbeats(t *testing.T) {
	_, url := startServer(t, Config{})
	rc := rawDial(t, url)
	rc.open(1)
	beats := 0
	start := time.Now()
	for {
		f, err := rc.r.ReadFrame()
		if err != nil {
			if !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "reset") {
				t.Fatalf("read: %v", err)
			}
			break
		}
		if f.Type == FrameHeartbeat {
			beats++
		}
	}
	if beats == 0 {
		t.Fatal("no heartbeat from the server")
	}
	// Two intervals of 1 s; the lower bound has 0.5 s of tolerance.
	if d := time.Since(start); d < 1500*time.Millisecond {
		t.Fatalf("closed after %s, before two heartbeat intervals", d)
	}
}

func TestConfigValidate(t *testing.T) {
	if _, err := New(Config{FrameMax: 100}); !errors.Is(err, ErrConfig) {
		t.Fatalf("frame max 100: %v", err)
	}
	if _, err := New(Config{Heartbeat: -time.Second}); !errors.Is(err, ErrConfig) {
		t.Fatalf("negative heartbeat: %v", err)
	}
}
