package wsnet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/courier-mq/courier/wire"
)

// list is a [messages] source of fixed messages.
type list struct {
	msgs []msg
	next int
}

type msg struct {
	typ websocket.MessageType
	p   []byte
}

func (l *list) Reader(context.Context) (websocket.MessageType, io.Reader, error) {
	if l.next == len(l.msgs) {
		return 0, nil, io.EOF
	}
	m := l.msgs[l.next]
	l.next++
	// One byte at a time: the Conn must not depend on how reads fall.
	return m.typ, &oneByte{bytes.NewReader(m.p)}, nil
}

type oneByte struct{ r *bytes.Reader }

func (o *oneByte) Read(p []byte) (int, error) { return o.r.Read(p[:min(len(p), 1)]) }

// oneFrame reports whether p is exactly one well-formed frame.
func oneFrame(p []byte) bool {
	if len(p) < 4 || int(binary.BigEndian.Uint32(p)) != len(p)-4 {
		return false
	}
	var f wire.Frame
	return wire.Decode(p[4:], &f) == nil
}

// splitMessages turns fuzz input into messages: each a type byte (odd:
// text), a length byte, then that many bytes.
func splitMessages(data []byte) []msg {
	var out []msg
	for len(data) >= 2 {
		typ := websocket.MessageBinary
		if data[0]&1 == 1 {
			typ = websocket.MessageText
		}
		n := min(int(data[1]), len(data)-2)
		out = append(out, msg{typ, data[2 : 2+n]})
		data = data[2+n:]
	}
	return out
}

// FuzzRead: whatever messages arrive, the frame reader on a Conn
// yields frames only from binary messages that hold exactly one whole
// frame each, in order, and then an error that is the stream's end, a
// malformed frame or one too large.
func FuzzRead(f *testing.F) {
	ping, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypePing, Ref: 1}, 0)
	hello, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeHello, Body: []byte(`{"versions":[1]}`)}, 0)
	seed := func(ms ...msg) []byte {
		var b []byte
		for _, m := range ms {
			t := byte(0)
			if m.typ == websocket.MessageText {
				t = 1
			}
			b = append(append(b, t, byte(len(m.p))), m.p...)
		}
		return b
	}
	f.Add(seed(msg{websocket.MessageBinary, ping}, msg{websocket.MessageBinary, hello}))
	f.Add(seed(msg{websocket.MessageBinary, append(append([]byte{}, ping...), ping...)}))
	f.Add(seed(msg{websocket.MessageText, ping}))
	f.Add(seed(msg{websocket.MessageBinary, ping[:3]}, msg{websocket.MessageBinary, ping}))
	f.Add(seed(msg{websocket.MessageBinary, ping[:len(ping)-1]}))
	f.Add(seed(msg{websocket.MessageBinary, []byte{0xff, 0xff, 0xff, 0xff}}))
	f.Add(seed(msg{websocket.MessageBinary, []byte{0, 0, 0, 0}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		ms := splitMessages(data)
		c := &Conn{src: &list{msgs: ms}}
		r := wire.NewReader(c, 200)
		n := 0
		for {
			var fr wire.Frame
			err := r.Next(&fr)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, wire.ErrMalformed) && !errors.Is(err, wire.ErrFrameTooLarge) {
					t.Fatalf("error %v", err)
				}
				return
			}
			if n >= len(ms) || ms[n].typ != websocket.MessageBinary || !oneFrame(ms[n].p) {
				t.Fatalf("frame %d (%s) decoded from a message that is not one frame", n, fr.Type)
			}
			n++
		}
	})
}

// pair returns a server-side Conn and the client's WebSocket.
func pair(t *testing.T, coalesce bool) (*Conn, *websocket.Conn) {
	t.Helper()
	got := make(chan *Conn, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hw := &keepRaw{ResponseWriter: w, coalesce: coalesce}
		ws, err := websocket.Accept(hw, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		c := NewConn(ws, hw.raw, 1<<20)
		c.ReadsThrough(hw.br)
		got <- c
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cws, _, err := websocket.Dial(ctx, "ws"+srv.URL[len("http"):], nil)
	if err != nil {
		t.Fatal(err)
	}
	cws.SetReadLimit(-1)
	t.Cleanup(func() { cws.CloseNow() })
	c := <-got
	t.Cleanup(func() { c.Close() })
	return c, cws
}

type keepRaw struct {
	http.ResponseWriter
	raw      net.Conn
	br       *bufio.Reader
	coalesce bool
}

func (k *keepRaw) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(k.ResponseWriter).Hijack()
	if err == nil {
		k.br = brw.Reader
	}
	if err != nil || !k.coalesce {
		k.raw = nc
		return nc, brw, err
	}
	co := NewCoalescer(nc)
	k.raw = co
	return co, bufio.NewReadWriter(brw.Reader, bufio.NewWriterSize(co, 4096)), nil
}

// TestWriteOneFramePerMessage: frames written in pieces of any size,
// cut inside their prefix or body, several in one write, arrive one per
// message, whole and in order.
func TestWriteOneFramePerMessage(t *testing.T) {
	t.Run("direct", func(t *testing.T) { testWriteOneFramePerMessage(t, false) })
	t.Run("coalesced", func(t *testing.T) { testWriteOneFramePerMessage(t, true) })
}

func testWriteOneFramePerMessage(t *testing.T, coalesce bool) {
	c, cws := pair(t, coalesce)
	rng := rand.New(rand.NewPCG(1, 2))
	var stream []byte
	var want [][]byte
	for i := range 300 {
		body := make([]byte, rng.IntN(3000))
		for j := range body {
			body[j] = byte(i + j)
		}
		p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeMessage, Attach: uint32(i + 1), Body: body}, 0)
		stream = append(stream, p...)
		want = append(want, p)
	}
	go func() {
		for rest := stream; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(7000))
			if _, err := c.Write(rest[:n]); err != nil {
				t.Error(err)
				return
			}
			rest = rest[n:]
		}
	}()
	for i, w := range want {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		typ, p, err := cws.Read(ctx)
		cancel()
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if typ != websocket.MessageBinary || !bytes.Equal(p, w) {
			t.Fatalf("message %d: %v of %d bytes, want frame of %d", i, typ, len(p), len(w))
		}
	}
}

// TestReadTimeoutLeavesWrites: a read deadline ends the read with a
// timeout and the Conn can still write (the HELLO timeout's ERROR).
func TestReadTimeoutLeavesWrites(t *testing.T) {
	c, cws := pair(t, true)
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := c.Read(make([]byte, 10))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read: %v, want a timeout", err)
	}
	ping, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypePing, Ref: 9}, 0)
	if _, err := c.Write(ping); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, p, err := cws.Read(ctx); err != nil || !bytes.Equal(p, ping) {
		t.Fatalf("after the timeout: % x, %v", p, err)
	}
}

// TestCoalescerKeepsNoBufferIdle: a batch's buffer goes back to the
// pool once it is written, so an idle connection keeps none; what was
// gathered reaches the socket in one write, whole.
func TestCoalescerKeepsNoBufferIdle(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	got := make(chan []byte, 1)
	go func() {
		p := make([]byte, 64)
		n, _ := b.Read(p)
		got <- p[:n]
	}()
	co := NewCoalescer(a)
	co.hold()
	co.Write([]byte("one "))
	co.Write([]byte("two"))
	if err := co.release(); err != nil {
		t.Fatal(err)
	}
	if p := <-got; string(p) != "one two" {
		t.Fatalf("the socket got %q in its first write, want the whole batch", p)
	}
	if co.buf != nil {
		t.Fatalf("an idle Coalescer keeps a buffer of %d bytes", cap(co.buf))
	}
}

// TestAnswerPingWhenBackedUp: with the socket's send queue backed up (a
// peer that reads nothing), a ping is answered once a second at most;
// with it empty, every ping is.
func TestAnswerPingWhenBackedUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close() // never read
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	co := NewCoalescer(nc)
	if unsent(nc) < 0 {
		t.Skip("the send queue cannot be read on this system")
	}
	for range 3 {
		if !co.AnswerPing(context.Background(), nil) {
			t.Fatal("a ping not answered with the send queue empty")
		}
	}
	// Fill the send queue: the peer reads nothing.
	chunk := make([]byte, 64<<10)
	for unsent(nc) < pongRoom {
		nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		nc.Write(chunk)
	}
	co.lastPong.Store(0)
	if !co.AnswerPing(context.Background(), nil) {
		t.Fatal("the first ping of a second not answered")
	}
	if co.AnswerPing(context.Background(), nil) {
		t.Fatal("a second ping within the second answered with the send queue backed up")
	}
	co.lastPong.Store(time.Now().Add(-pongEvery).UnixNano())
	if !co.AnswerPing(context.Background(), nil) {
		t.Fatal("no ping answered after a second")
	}
}

// TestPendingCountsBuffered: Pending counts the bytes a Read hands out
// without the socket: a message the library's buffered reader took in
// along with the one before it. With none, the next Read waits for the
// socket.
func TestPendingCountsBuffered(t *testing.T) {
	c, cws := pair(t, true)
	if n := c.Pending(); n != 0 {
		t.Fatalf("a fresh connection: Pending %d, want 0", n)
	}
	a, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypePing, Ref: 1}, 0)
	b, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypePing, Ref: 2, Body: []byte("second")}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, p := range [][]byte{a, b} {
		if err := cws.Write(ctx, websocket.MessageBinary, p); err != nil {
			t.Fatal(err)
		}
	}
	// Both messages in the socket (2 bytes of header and 4 of mask
	// each): the buffered reader takes them in with one read.
	want := len(a) + len(b) + 12
	deadline := time.Now().Add(20 * time.Second)
	for wire.Unread(c.Socket()) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes reached the socket, want %d", wire.Unread(c.Socket()), want)
		}
		time.Sleep(time.Millisecond)
	}
	got := make([]byte, len(a))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, a) {
		t.Fatalf("first frame: % x, %v", got, err)
	}
	if n := c.Pending(); n != len(b)+6 {
		t.Fatalf("after the first frame: Pending %d, want %d (the second message)", n, len(b)+6)
	}
	got = make([]byte, len(b))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("second frame: % x, %v", got, err)
	}
	if n := c.Pending(); n != 0 {
		t.Fatalf("after both: Pending %d, want 0", n)
	}
}
