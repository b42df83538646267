//go:build linux

package clustertest

import (
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

// echoServer echoes TCP and UDP on one port of 127.0.0.1.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, udp, err := listenProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); udp.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := udp.ReadFromUDP(buf)
			if err != nil {
				return
			}
			udp.WriteToUDP(buf[:n], from)
		}
	}()
	return ln.Addr().String()
}

// testProxy is node 1's proxy in a 2-node world where every peer is
// node 0.
func testProxy(t *testing.T) (*Proxy, *Faults) {
	t.Helper()
	f := NewFaults(1)
	ln, udp, err := listenProxy()
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{index: 1, target: echoServer(t), faults: f, ln: ln, udp: udp,
		owner: func(_, _ *net.TCPAddr) int { return 0 }, udpSrc: func(*net.UDPAddr) int { return 0 }, nodes: func() int { return 2 }}
	p.serve()
	t.Cleanup(func() { p.Close() })
	return p, f
}

// roundTrip writes msg and reads it back within d.
func roundTrip(c net.Conn, msg string, d time.Duration) error {
	c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return err
}

func TestProxyTCPCutHoldsBytesUntilHealed(t *testing.T) {
	p, f := testProxy(t)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, "before", wait); err != nil {
		t.Fatal(err)
	}
	f.SetCut(map[[2]int]bool{{0, 1}: true, {1, 0}: true})
	if err := roundTrip(c, "during", 300*time.Millisecond); err == nil {
		t.Fatal("bytes crossed a cut")
	}
	f.SetCut(map[[2]int]bool{})
	// The bytes held during the cut arrive, in order, then new ones.
	c.SetDeadline(time.Now().Add(wait))
	buf := make([]byte, len("during"))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "during" {
		t.Fatalf("held bytes: %q, %v", buf, err)
	}
	if err := roundTrip(c, "after", wait); err != nil {
		t.Fatal(err)
	}
}

func TestProxyTCPDelay(t *testing.T) {
	p, f := testProxy(t)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const delay = 50 * time.Millisecond
	f.SetNetem(1, delay, 0)
	start := time.Now()
	if err := roundTrip(c, "ping", wait); err != nil {
		t.Fatal(err)
	}
	// Both directions pass node 1's proxy, each delayed.
	if rtt := time.Since(start); rtt < 2*delay {
		t.Fatalf("round trip %v under 2×%v of delay", rtt, delay)
	}
}

func TestProxyUDP(t *testing.T) {
	p, f := testProxy(t)
	c, err := net.Dial("udp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, "gossip", wait); err != nil {
		t.Fatal(err)
	}
	f.SetNetem(1, 0, 1) // lose everything
	if err := roundTrip(c, "lost", 300*time.Millisecond); err == nil {
		t.Fatal("a datagram crossed 100% loss")
	}
	f.SetNetem(1, 0, 0)
	f.SetCut(map[[2]int]bool{{0, 1}: true, {1, 0}: true})
	if err := roundTrip(c, "cut", 300*time.Millisecond); err == nil {
		t.Fatal("a datagram crossed a cut")
	}
	f.SetCut(map[[2]int]bool{})
	if err := roundTrip(c, "healed", wait); err != nil {
		t.Fatal(err)
	}
}

func TestProxyUnknownSourceCutOnlyWhenIsolated(t *testing.T) {
	f := NewFaults(1)
	f.SetCut(map[[2]int]bool{{0, 2}: true, {2, 0}: true})
	if cut, _ := f.blocked(-1, 2, 3); cut {
		t.Fatal("unknown source cut although node 1 reaches node 2")
	}
	f.SetCut(map[[2]int]bool{{0, 2}: true, {1, 2}: true})
	if cut, _ := f.blocked(-1, 2, 3); !cut {
		t.Fatal("unknown source reaches an isolated node")
	}
}

func TestSocketOwner(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp")
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	inode := socketInode(c.LocalAddr().(*net.TCPAddr), ln.Addr().(*net.TCPAddr))
	if inode == 0 || !pidHasSocket(os.Getpid(), inode) {
		t.Fatalf("the dialing socket (inode %d) not found as this process's", inode)
	}
	if pidHasSocket(1, inode) {
		t.Fatal("init owns the test's socket")
	}
}

// TestSockInodeWithoutProcScan: the proxies find a connecting socket's
// inode with one sock_diag lookup, the same inode /proc/net/tcp lists,
// without reading /proc/net/tcp (a walk of the kernel's whole TCP table,
// about 30 ms here, that put the loaded test process behind its
// connections); and ownerOf finds the node process that holds it.
func TestSockInodeWithoutProcScan(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local, remote := c.LocalAddr().(*net.TCPAddr), ln.Addr().(*net.TCPAddr)
	before := procScans.Load()
	for range 20 {
		inode := sockInode(local, remote)
		if inode == 0 || !pidHasSocket(os.Getpid(), inode) {
			t.Fatalf("sockInode found inode %d, not the dialing socket of this process", inode)
		}
		if want := socketInode(local, remote); want != 0 && inode != want {
			t.Fatalf("sockInode %d, /proc/net/tcp %d", inode, want)
		}
	}
	if n := procScans.Load() - before; n != 0 {
		t.Fatalf("%d of 20 lookups read /proc/net/tcp", n)
	}
	if _, err := diagInode(&net.TCPAddr{IP: local.IP, Port: 1}, remote); err == nil {
		t.Fatal("sock_diag found a socket from port 1, which does not exist")
	}
}

// TestProxyUDPSurvivesTargetRestart stops the target's UDP socket (as a
// kill does) and opens it again on the same port: the relay carries on.
func TestProxyUDPSurvivesTargetRestart(t *testing.T) {
	ln, udp, err := listenProxy()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	target := udp.LocalAddr().(*net.UDPAddr)
	echo := func(u *net.UDPConn) {
		buf := make([]byte, 2048)
		for {
			n, from, err := u.ReadFromUDP(buf)
			if err != nil {
				return
			}
			u.WriteToUDP(buf[:n], from)
		}
	}
	go echo(udp)
	f := NewFaults(1)
	pl, pu, err := listenProxy()
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{index: 1, target: target.String(), faults: f, ln: pl, udp: pu,
		owner: func(_, _ *net.TCPAddr) int { return 0 }, udpSrc: func(*net.UDPAddr) int { return 0 }, nodes: func() int { return 2 }}
	p.serve()
	defer p.Close()
	c, err := net.Dial("udp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, "one", wait); err != nil {
		t.Fatal(err)
	}
	udp.Close()
	// The target is down: this datagram is refused there.
	roundTrip(c, "down", 200*time.Millisecond)
	udp, err = net.ListenUDP("udp", target)
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	go echo(udp)
	testutil.WaitForf(t, wait, func() bool { return roundTrip(c, "back", 200*time.Millisecond) == nil },
		"datagrams relayed after the target came back")
}
