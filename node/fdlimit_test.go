package node

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestFitFDs: caps that fit in the descriptor limit stay; caps that do
// not are lowered to fit, with the reserve kept.
func TestFitFDs(t *testing.T) {
	d := DefaultConfig().Limits
	if l, lowered := fitFDs(1<<20, d, true); lowered || l != d {
		t.Fatalf("a limit of 2^20 lowered the defaults to %+v", l)
	}
	l, lowered := fitFDs(400, d, true)
	if !lowered {
		t.Fatal("a limit of 400 kept the defaults")
	}
	if sum := l.MaxConns + l.MaxHandshakes + l.MaxHTTPConns; uint64(sum)+fdReserve(400) > 400 {
		t.Fatalf("caps %+v take %d descriptors of 400, and the reserve %d", l, sum, fdReserve(400))
	}
	// One address cannot take every handshake (it took them all: the
	// per-address cap was lowered to the node's, 39).
	if l.MaxHTTPConns < 4 || l.MaxHandshakes < 8 || l.MaxConns < 200 || l.MaxHandshakesPerAddr > max(1, l.MaxHandshakes/16) {
		t.Fatalf("caps for 400 descriptors: %+v", l)
	}
	if l2, _ := fitFDs(400, d, false); l2.MaxConns <= l.MaxConns || l2.MaxHTTPConns != d.MaxHTTPConns {
		t.Fatalf("without a management listener its share should go to clients: %+v", l2)
	}
	if l, _ := fitFDs(10, d, true); l.MaxConns < 1 || l.MaxHandshakes < 1 || l.MaxHTTPConns < 1 {
		t.Fatalf("a tiny limit leaves a cap at zero: %+v", l)
	}
}

// TestHTTPConnCap: slow HTTP connections beyond the management
// listener's cap wait in the backlog, taking nothing of the process,
// and the client listener goes on: a client logs in. The cap holds, and
// a waiting connection is served once a place frees.
func TestHTTPConnCap(t *testing.T) {
	const max = 4
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0",
		AdminUser: "admin", AdminPassword: "adminpw", Limits: Limits{MaxHTTPConns: max}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	slow := func() net.Conn {
		c, err := net.DialTimeout("tcp", n.HTTPAddr().String(), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprint(c, "GET /api/overview HTTP/1.1\r\nHost: x\r\n") // and never the end of the header
		return c
	}
	capHolds := func() bool {
		if got := n.admin.Conns(); got > max {
			t.Fatalf("%d HTTP connections open, the cap is %d", got, max)
		}
		return n.admin.Conns() == max
	}
	var first []net.Conn
	for range max {
		first = append(first, slow())
	}
	testutil.WaitForf(t, 10*time.Second, capHolds, "the first %d slow connections were not accepted", max)

	// Next in the backlog: a full request, then more slow ones.
	waiting, err := net.DialTimeout("tcp", n.HTTPAddr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer waiting.Close()
	req, _ := http.NewRequest(http.MethodGet, "http://x/api/whoami", nil)
	req.SetBasicAuth("admin", "adminpw")
	if err := req.Write(waiting); err != nil {
		t.Fatal(err)
	}
	for range 3 * max {
		slow()
	}

	ctx := testutil.Context(t, 10*time.Second)
	c, err := client.Dial(ctx, n.URL(), client.Options{User: "admin", Password: "adminpw"})
	if err != nil {
		t.Fatalf("a client could not log in while the management listener is full: %v", err)
	}
	defer c.Close()
	if _, err := c.Exchanges(ctx); err != nil {
		t.Fatal(err)
	}
	capHolds()

	first[0].Close()
	waiting.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(waiting), req)
	if err != nil {
		t.Fatalf("the waiting request was not served once a place freed: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("whoami: %s", resp.Status)
	}
	capHolds()
}

// TestUnauthenticatedSlowBodyIsClosed: a request refused for want of
// credentials ends its connection once answered, without waiting for
// the rest of a body sent slowly, so that it cannot hold a place of the
// management listener.
func TestUnauthenticatedSlowBodyIsClosed(t *testing.T) {
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, HTTP: "127.0.0.1:0", AdminUser: "admin", AdminPassword: "adminpw"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	for _, auth := range []string{"", "Authorization: Basic YWRtaW46d3Jvbmc=\r\n"} { // none; admin:wrong
		c, err := net.DialTimeout("tcp", n.HTTPAddr().String(), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "PUT /api/exchanges/x HTTP/1.1\r\nHost: x\r\n%sContent-Length: 1000\r\n\r\n{\"type\":", auth)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		r := bufio.NewReader(c)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("answer %s, want 401", resp.Status)
		}
		if b, err := r.ReadByte(); err != io.EOF {
			t.Fatalf("after the refusal: %q, %v; want the end of the connection", b, err)
		}
	}
}
