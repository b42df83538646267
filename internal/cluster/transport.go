package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// transport is memberlist's Transport over the cluster address: packets
// on its UDP socket (encrypted and authenticated by memberlist itself
// with a key derived from the cluster secret), streams as connections of
// KindMemberlist on its TCP listener, authenticated by the handshake.
// With mutual TLS and no secret, nothing keys the UDP packets: they go
// over authenticated TCP connections of KindGossip instead, one per
// destination, and the UDP socket is not read.
type transport struct {
	f       *Fabric
	udp     *net.UDPConn
	overTCP bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup

	mu       sync.Mutex // guards conns, accepted
	conns    map[string]*packetConn
	accepted map[*Conn]struct{}
}

var _ memberlist.Transport = (*transport)(nil)

// maxPacket bounds a memberlist packet read from UDP.
const maxPacket = 65536

func newTransport(f *Fabric, udp *net.UDPConn, overTCP bool) *transport {
	t := &transport{f: f, udp: udp, overTCP: overTCP,
		packets:  make(chan *memberlist.Packet, 256),
		streams:  make(chan net.Conn, 32),
		done:     make(chan struct{}),
		conns:    make(map[string]*packetConn),
		accepted: make(map[*Conn]struct{}),
	}
	if !overTCP {
		t.wg.Add(1)
		go t.readPackets()
	}
	return t
}

// packetConn carries packets to one address over TCP: each is a u32
// big-endian length and the packet.
type packetConn struct {
	mu sync.Mutex // serialises writes
	c  net.Conn   // nil while dialling
	// pending holds the packets sent while dialling, up to
	// maxPendingPackets (memberlist retransmits a broadcast only a few
	// times: they must not all be lost to a slow handshake).
	pending [][]byte
}

// maxPendingPackets bounds the packets held for a connection being
// dialled; past it they are dropped, as UDP would.
const maxPendingPackets = 128

// writeTCP sends a packet over the TCP connection to addr, dialled in
// the background on first use: the packets sent meanwhile wait for it.
func (t *transport) writeTCP(b []byte, addr string) (time.Time, error) {
	t.mu.Lock()
	select {
	case <-t.done:
		t.mu.Unlock()
		return time.Now(), net.ErrClosed
	default:
	}
	pc := t.conns[addr]
	if pc == nil {
		pc = &packetConn{}
		t.conns[addr] = pc
		t.wg.Add(1)
		go t.dialPackets(addr, pc)
	}
	t.mu.Unlock()
	pc.mu.Lock()
	defer pc.mu.Unlock()
	buf := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	buf = append(buf, b...)
	if pc.c == nil {
		if len(pc.pending) < maxPendingPackets {
			pc.pending = append(pc.pending, buf)
		}
		return time.Now(), nil
	}
	pc.c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := pc.c.Write(buf); err != nil {
		t.dropPackets(addr, pc)
		return time.Now(), err
	}
	return time.Now(), nil
}

func (t *transport) dialPackets(addr string, pc *packetConn) {
	defer t.wg.Done()
	c, err := t.f.dialAddr(addr, KindGossip, t.f.cfg.HandshakeTimeout)
	if err != nil {
		t.f.log.Debug("cluster: gossip connection", "addr", addr, "err", err)
		t.mu.Lock()
		if t.conns[addr] == pc {
			delete(t.conns, addr)
		}
		t.mu.Unlock()
		return
	}
	pc.mu.Lock()
	pc.c = c
	pending := pc.pending
	pc.pending = nil
	c.SetWriteDeadline(time.Now().Add(time.Second))
	for _, buf := range pending {
		if _, err := c.Write(buf); err != nil {
			t.dropPackets(addr, pc)
			break
		}
	}
	pc.mu.Unlock()
	select {
	case <-t.done:
		c.Close()
	default:
	}
}

// dropPackets forgets a broken connection; pc.mu is held.
func (t *transport) dropPackets(addr string, pc *packetConn) {
	pc.c.Close()
	t.mu.Lock()
	if t.conns[addr] == pc {
		delete(t.conns, addr)
	}
	t.mu.Unlock()
}

// gossipIdle is how long a gossip connection may stay silent: memberlist
// probes every node every few seconds at most.
const gossipIdle = time.Minute

// readTCP reads the packets of an accepted gossip connection.
func (t *transport) readTCP(c *Conn) {
	defer t.wg.Done()
	defer func() {
		c.Close()
		t.mu.Lock()
		delete(t.accepted, c)
		t.mu.Unlock()
	}()
	from, _ := net.ResolveTCPAddr("tcp", c.peerAddr)
	var fromAddr net.Addr = from
	if from == nil {
		fromAddr = c.RemoteAddr()
	}
	var n [4]byte
	for {
		c.SetReadDeadline(time.Now().Add(gossipIdle))
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(n[:])
		if size == 0 || size > maxPacket {
			t.f.warn.log(t.f.log, "cluster: bad gossip packet: connection cut", "node", c.peer, "size", size)
			return
		}
		buf := make([]byte, size)
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		p := &memberlist.Packet{Buf: buf, From: fromAddr, Timestamp: time.Now()}
		select {
		case t.packets <- p:
		case <-t.done:
			return
		default:
		}
	}
}

// acceptPackets serves an accepted gossip connection.
func (t *transport) acceptPackets(c *Conn) {
	if !t.overTCP {
		c.Close()
		return
	}
	t.mu.Lock()
	select {
	case <-t.done:
		t.mu.Unlock()
		c.Close()
		return
	default:
	}
	t.accepted[c] = struct{}{}
	t.wg.Add(1)
	t.mu.Unlock()
	go t.readTCP(c)
}

// readPackets hands UDP packets to memberlist; when it is behind, they
// are dropped, as the network would.
func (t *transport) readPackets() {
	defer t.wg.Done()
	buf := make([]byte, maxPacket)
	for {
		n, from, err := t.udp.ReadFrom(buf)
		ts := time.Now()
		if err != nil {
			select {
			case <-t.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.f.log.Warn("cluster: UDP read failed", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if n < 1 {
			continue
		}
		p := &memberlist.Packet{Buf: append([]byte(nil), buf[:n]...), From: from, Timestamp: ts}
		select {
		case t.packets <- p:
		case <-t.done:
			return
		default:
		}
	}
}

// FinalAdvertiseAddr returns the advertised cluster address.
func (t *transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	host, port, err := net.SplitHostPort(t.f.advertise)
	if err != nil {
		return nil, 0, err
	}
	ip := net.ParseIP(host)
	if ip == nil {
		// A host name: memberlist wants an IP; the others still dial the
		// name given (it is the gossiped cluster address).
		ia, err := net.ResolveIPAddr("ip", host)
		if err != nil {
			return nil, 0, fmt.Errorf("cluster: advertise address %q: %w", t.f.advertise, err)
		}
		ip = ia.IP
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, 0, err
	}
	return ip, p, nil
}

// WriteTo sends a packet over UDP (or TCP, see transport).
func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.overTCP {
		return t.writeTCP(b, addr)
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return time.Time{}, err
	}
	t.udp.SetWriteDeadline(time.Now().Add(time.Second))
	_, err = t.udp.WriteTo(b, ua)
	return time.Now(), err
}

// PacketCh returns the packets received.
func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout opens an authenticated memberlist stream.
func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.f.dialAddr(addr, KindMemberlist, timeout)
}

// StreamCh returns the memberlist streams accepted.
func (t *transport) StreamCh() <-chan net.Conn { return t.streams }

// accept hands memberlist a stream, or closes it when memberlist is
// behind.
func (t *transport) accept(c net.Conn) {
	select {
	case t.streams <- c:
	case <-t.done:
		c.Close()
	default:
		c.Close()
	}
}

// Shutdown stops reading packets; the fabric closes the sockets.
func (t *transport) Shutdown() error {
	t.once.Do(func() {
		t.mu.Lock()
		close(t.done)
		pcs := make([]*packetConn, 0, len(t.conns))
		for addr, pc := range t.conns {
			pcs = append(pcs, pc)
			delete(t.conns, addr)
		}
		for c := range t.accepted {
			c.Close()
		}
		t.mu.Unlock()
		for _, pc := range pcs {
			pc.mu.Lock()
			if pc.c != nil {
				pc.c.Close()
			}
			pc.mu.Unlock()
		}
	})
	return nil
}
