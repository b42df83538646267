package cluster

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// serveBytes runs the listener's handshake on input, the bytes a peer
// sends before it half-closes, and returns its error and how long it
// took. half false: the peer stays silent after input instead.
func serveBytes(t testing.TB, sec *security, input []byte, timeout time.Duration, half bool) (time.Duration, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	go func() {
		client.Write(input)
		if half {
			client.(*net.TCPConn).CloseWrite()
		}
	}()
	go io.Copy(io.Discard, client)
	start := time.Now()
	_, err = sec.serverHandshake(server, func(k Kind) bool { return k <= KindLinkData }, hello{Name: "srv", Addr: "127.0.0.1:1"}, timeout)
	return time.Since(start), err
}

func plainPreamble(kind Kind, mode byte) []byte {
	return append([]byte(magic), hsVersion, byte(kind), mode)
}

func helloBytes(b []byte) []byte {
	return append([]byte{byte(len(b) >> 8), byte(len(b))}, b...)
}

func FuzzHandshake(f *testing.F) {
	pre := plainPreamble(KindLinkControl, 0)
	f.Add([]byte{})
	f.Add([]byte("COURCL"))
	f.Add(pre)
	f.Add(append(pre, helloBytes([]byte(`{"name":"x","addr":"127.0.0.1:2"}`))...))
	f.Add(append(pre, helloBytes([]byte(`{"name":""}`))...))
	f.Add(append(pre, 0xff, 0xff))
	f.Add(append(pre, helloBytes([]byte(`{"name":"x","unknown":1}`))...))
	f.Add(plainPreamble(KindLinkData, secSecret))
	f.Add(plainPreamble(99, 0))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	secret, err := newSecurity(testSecret, "", "", "")
	if err != nil {
		f.Fatal(err)
	}
	plain := &security{}
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, sec := range []*security{plain, secret} {
			in := in
			if sec == secret && len(in) >= preambleLen && bytes.HasPrefix(in, []byte(magic)) {
				// Reach the TLS handshake too.
				in = append(plainPreamble(Kind(in[len(magic)+1]), secSecret), in[preambleLen:]...)
			}
			const timeout = 500 * time.Millisecond
			took, err := serveBytes(t, sec, in, timeout, true)
			if took > timeout+2*time.Second {
				t.Fatalf("the handshake took %s, bound %s", took, timeout)
			}
			if sec == secret && err == nil {
				t.Fatalf("fuzzed bytes passed the secret's handshake: %q", in)
			}
			if err != nil && !errors.Is(err, ErrHandshake) && !errors.Is(err, ErrAuth) {
				t.Fatalf("error %v is neither ErrHandshake nor ErrAuth", err)
			}
		}
	})
}

// TestHandshakeBounded: a peer that sends nothing, or trickles a hello
// it never ends, is cut at the handshake timeout; one that announces an
// oversized hello is cut at once.
func TestHandshakeBounded(t *testing.T) {
	plain := &security{}
	const timeout = 300 * time.Millisecond
	for name, in := range map[string][]byte{
		"silent":        nil,
		"half preamble": []byte("COUR"),
		"half hello":    append(plainPreamble(KindLinkData, 0), helloBytes([]byte(`{"name":"x"}`))[:6]...),
	} {
		took, err := serveBytes(t, plain, in, timeout, false)
		if !errors.Is(err, ErrHandshake) {
			t.Errorf("%s: %v, want ErrHandshake", name, err)
		}
		if took < timeout || took > timeout+5*time.Second {
			t.Errorf("%s: cut after %s, want the timeout %s (tolerance +5s on a loaded machine)", name, took, timeout)
		}
	}
	took, err := serveBytes(t, plain, append(plainPreamble(KindLinkData, 0), 0xff, 0xff), 10*time.Second, false)
	if !errors.Is(err, ErrHandshake) || took > 5*time.Second {
		t.Errorf("oversized hello: %v after %s", err, took)
	}
}

// TestHandshakeMITM: a relay that terminates TLS on both sides cannot
// pass the secret's proof, even knowing everything but the secret.
func TestHandshakeMITM(t *testing.T) {
	sec, err := newSecurity(testSecret, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	// The man in the middle runs its own TLS with each side; it relays
	// the hellos unchanged. Its keying material differs on each side.
	mitmSec, _ := newSecurity([]byte("the attacker's own secret, long!"), "", "", "")
	c1, s1 := net.Pipe() // client <-> mitm
	c2, s2 := net.Pipe() // mitm <-> server
	defer c1.Close()
	defer s2.Close()
	srvErr := make(chan error, 1)
	go func() {
		_, err := sec.serverHandshake(s2, func(Kind) bool { return true }, hello{Name: "srv"}, 5*time.Second)
		srvErr <- err
	}()
	go func() {
		// mitm: accept the client's TLS as server, dial the server as
		// client, relay the plaintext.
		defer s1.Close()
		defer c2.Close()
		var pre [preambleLen]byte
		io.ReadFull(s1, pre[:])
		c2.Write(pre[:])
		var ans [2]byte
		io.ReadFull(c2, ans[:])
		s1.Write(ans[:])
		tlsS := tlsServer(s1, mitmSec)
		tlsC := tlsClient(c2, mitmSec)
		if tlsS.Handshake() != nil || tlsC.Handshake() != nil {
			return
		}
		go io.Copy(tlsC, tlsS)
		io.Copy(tlsS, tlsC)
	}()
	_, err = sec.clientHandshake(c1, KindLinkData, hello{Name: "cli"}, 5*time.Second)
	if !errors.Is(err, ErrAuth) {
		t.Errorf("client through a relay: %v, want ErrAuth", err)
	}
	if err := <-srvErr; !errors.Is(err, ErrAuth) {
		t.Errorf("server through a relay: %v, want ErrAuth", err)
	}
}

func tlsServer(c net.Conn, s *security) *tls.Conn { return tls.Server(c, s.server) }
func tlsClient(c net.Conn, s *security) *tls.Conn { return tls.Client(c, s.client) }
