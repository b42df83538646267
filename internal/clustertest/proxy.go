package clustertest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Faults is the state of the faults a [Proxy] applies. One Faults is
// shared by the proxies of a cluster; it is safe for concurrent use.
type Faults struct {
	mu    sync.Mutex // guards the fields below
	cut   map[[2]int]bool
	delay map[int]time.Duration
	loss  map[int]float64
	rng   *rand.Rand
	wake  chan struct{} // closed and replaced when the faults change
}

// NewFaults returns faults with nothing cut, delayed or lost; seed seeds
// the losses.
func NewFaults(seed uint64) *Faults {
	return &Faults{cut: map[[2]int]bool{}, delay: map[int]time.Duration{}, loss: map[int]float64{},
		rng: rand.New(rand.NewPCG(seed, 0x636f7572)), wake: make(chan struct{})}
}

// SetCut replaces the set of cut pairs (node indexes; a pair cuts one
// direction, so give both).
func (f *Faults) SetCut(cut map[[2]int]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut = cut
	close(f.wake)
	f.wake = make(chan struct{})
}

// SetNetem sets the delay and loss of what node i receives and sends
// through its proxy; both 0 clear them.
func (f *Faults) SetNetem(i int, delay time.Duration, loss float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.delay[i], f.loss[i] = delay, loss
}

// blocked reports whether traffic from src to dst is cut, and a channel
// that is closed when that may change. An unknown source (-1) is cut
// when dst is cut from every other node.
func (f *Faults) blocked(src, dst int, nodes int) (bool, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if src >= 0 {
		return f.cut[[2]int{src, dst}], f.wake
	}
	for i := range nodes {
		if i != dst && !f.cut[[2]int{i, dst}] {
			return false, f.wake
		}
	}
	return nodes > 1, f.wake
}

// netemOf returns the delay and whether to drop one packet for traffic
// between src and dst: the delays of both ends add up, as netem on both
// nodes' links would.
func (f *Faults) netemOf(src, dst int) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.delay[dst]
	loss := f.loss[dst]
	if src >= 0 {
		d += f.delay[src]
		loss = 1 - (1-loss)*(1-f.loss[src])
	}
	return d, loss > 0 && f.rng.Float64() < loss
}

// Proxy stands in front of one node's cluster port, TCP and UDP on the
// same port as the node's, and applies [Faults] to what passes: a cut
// pair's open connections stop moving bytes (as TCP does while packets
// are dropped) until the cut heals, its new connections are reset at
// once, its datagrams are dropped; delay holds every chunk and datagram;
// loss drops datagrams and, on TCP, holds a chunk 200 ms more, as a
// retransmission would.
//
// The proxy tells which node a connection comes from by the source port
// of datagrams (a node sends from its cluster port) and, for TCP, by the
// process that owns the connecting socket (Linux /proc); a source it
// cannot tell is treated as cut when the destination is cut from every
// node.
type Proxy struct {
	index  int
	target string
	faults *Faults
	owner  func(peer, local *net.TCPAddr) int // node index of a TCP peer connected to local, or -1
	udpSrc func(peer *net.UDPAddr) int        // node index of a UDP peer, or -1
	nodes  func() int
	// dialUp connects to the target; nil: net.Dial. In netns mode it
	// dials from the node's namespace.
	dialUp func(network, addr string) (net.Conn, error)

	ln  *net.TCPListener
	udp *net.UDPConn

	mu     sync.Mutex // guards conns, flows, closed
	conns  map[net.Conn]struct{}
	flows  map[string]*udpFlow
	closed bool
	wg     sync.WaitGroup
}

// maxFlows bounds the UDP peers a proxy relays for.
const maxFlows = 64

// udpFlow relays one UDP peer's datagrams to the target and back.
type udpFlow struct {
	src  int
	peer *net.UDPAddr
	up   net.Conn
}

// listenProxyAt opens a proxy's TCP and UDP sockets on ip:port.
func listenProxyAt(ip string, port int) (*net.TCPListener, *net.UDPConn, error) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.ParseIP(ip), Port: port})
	if err != nil {
		return nil, nil, err
	}
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip), Port: port})
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	return ln, udp, nil
}

// dial connects to the target.
func (p *Proxy) dial(network string) (net.Conn, error) {
	if p.dialUp != nil {
		return p.dialUp(network, p.target)
	}
	return net.DialTimeout(network, p.target, 5*time.Second)
}

// listenProxy opens a proxy on a free port of 127.0.0.1 with the same
// port free for TCP and UDP.
func listenProxy() (*net.TCPListener, *net.UDPConn, error) {
	for range 50 {
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			return nil, nil, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err == nil {
			return ln, udp, nil
		}
		ln.Close()
	}
	return nil, nil, errors.New("clustertest: no port free for both TCP and UDP")
}

// Addr is the proxy's address, the one the node advertises.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// serve starts the proxy's loops.
func (p *Proxy) serve() {
	p.conns, p.flows = map[net.Conn]struct{}{}, map[string]*udpFlow{}
	p.wg.Add(2)
	go p.acceptLoop()
	go p.udpLoop()
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	for _, f := range p.flows {
		f.up.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.udp.Close()
	p.wg.Wait()
	return nil
}

// track adds c to the open connections; false once the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.AcceptTCP()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

// handle relays one connection once its source is allowed to reach the
// target.
func (p *Proxy) handle(c *net.TCPConn) {
	defer p.wg.Done()
	defer p.untrack(c)
	src := p.owner(c.RemoteAddr().(*net.TCPAddr), c.LocalAddr().(*net.TCPAddr))
	if cut, _ := p.faults.blocked(src, p.index, p.nodes()); cut {
		// Refused at once, as a connect across a blackhole route fails
		// in netns mode: reset, not held.
		c.SetLinger(0)
		return
	}
	up, err := p.dial("tcp")
	if err != nil {
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{}, 2)
	go func() { p.pipe(up, c, src, p.index); done <- struct{}{} }()
	go func() { p.pipe(c, up, p.index, src); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
}

// waitOpen waits until src may reach dst; false if c closed meanwhile.
func (p *Proxy) waitOpen(src, dst int, c net.Conn) bool {
	for {
		cut, wake := p.faults.blocked(src, dst, p.nodes())
		if !cut {
			return true
		}
		select {
		case <-wake:
		case <-time.After(time.Second):
			p.mu.Lock()
			_, open := p.conns[c]
			p.mu.Unlock()
			if !open {
				return false
			}
		}
	}
}

// chunk is bytes read at a time.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies from r to w, holding each chunk for the delay and while
// src is cut from dst.
func (p *Proxy) pipe(w, r net.Conn, src, dst int) {
	ch := make(chan chunk, 64)
	go func() {
		defer close(ch)
		for {
			b := make([]byte, 32<<10)
			n, err := r.Read(b)
			if n > 0 {
				ch <- chunk{b[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		delay, lost := p.faults.netemOf(src, dst)
		if lost {
			delay += 200 * time.Millisecond
		}
		if wait := time.Until(c.at.Add(delay)); wait > 0 {
			time.Sleep(wait)
		}
		if !p.waitOpen(src, dst, w) {
			break
		}
		if _, err := w.Write(c.b); err != nil {
			break
		}
	}
	w.Close()
	r.Close()
	for range ch {
	}
}

// udpLoop relays datagrams to the target through one upstream socket per
// peer, and the answers back.
func (p *Proxy) udpLoop() {
	defer p.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, peer, err := p.udp.ReadFromUDP(buf)
		if err != nil {
			return
		}
		f := p.flow(peer)
		if f == nil {
			continue
		}
		if cut, _ := p.faults.blocked(f.src, p.index, p.nodes()); cut {
			continue
		}
		delay, lost := p.faults.netemOf(f.src, p.index)
		if lost {
			continue
		}
		b := append([]byte(nil), buf[:n]...)
		if delay > 0 {
			time.AfterFunc(delay, func() { f.up.Write(b) })
			continue
		}
		f.up.Write(b)
	}
}

// flow returns the relay of peer, making it if need be.
func (p *Proxy) flow(peer *net.UDPAddr) *udpFlow {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.flows[peer.String()]; ok {
		return f
	}
	if p.closed || len(p.flows) >= maxFlows {
		return nil
	}
	up, err := p.dial("udp")
	if err != nil {
		return nil
	}
	f := &udpFlow{src: p.udpSrc(peer), peer: peer, up: up}
	p.flows[peer.String()] = f
	p.wg.Add(1)
	go p.udpBack(f)
	return f
}

// udpBack relays the target's answers to a peer.
func (p *Proxy) udpBack(f *udpFlow) {
	defer p.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, err := f.up.Read(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// ECONNREFUSED from a target that is down (killed, to be
			// restarted on the same port): the flow lives on.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if cut, _ := p.faults.blocked(p.index, f.src, p.nodes()); cut {
			continue
		}
		if _, lost := p.faults.netemOf(p.index, f.src); lost {
			continue
		}
		p.udp.WriteToUDP(buf[:n], f.peer)
	}
}

// socketInode finds the inode of the TCP socket whose local address is
// local and remote address is remote, from /proc/net/tcp; 0 if none. It
// reads the whole table: [sockInode] asks the kernel first.
func socketInode(local, remote *net.TCPAddr) uint64 {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return 0
	}
	defer f.Close()
	want := [2]string{procAddr(local), procAddr(remote)}
	sc := bufio.NewScanner(io.LimitReader(f, 64<<20))
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || fs[1] != want[0] || fs[2] != want[1] {
			continue
		}
		n, _ := strconv.ParseUint(fs[9], 10, 64)
		return n
	}
	return 0
}

// procAddr writes an IPv4 address as /proc/net/tcp does: the address's
// bytes as a little-endian word, then the port, in hex.
func procAddr(a *net.TCPAddr) string {
	ip := a.IP.To4()
	if ip == nil {
		return ""
	}
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
}

// pidHasSocket reports whether process pid has the socket inode open.
func pidHasSocket(pid int, inode uint64) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	want := fmt.Sprintf("socket:[%d]", inode)
	for _, e := range ents {
		if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == want {
			return true
		}
	}
	return false
}
