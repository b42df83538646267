package cluster

import (
	"errors"
	"fmt"
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
type transport struct {
	f       *Fabric
	udp     *net.UDPConn
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

var _ memberlist.Transport = (*transport)(nil)

// maxPacket bounds a memberlist packet read from UDP.
const maxPacket = 65536

func newTransport(f *Fabric, udp *net.UDPConn) *transport {
	t := &transport{f: f, udp: udp,
		packets: make(chan *memberlist.Packet, 256),
		streams: make(chan net.Conn, 32),
		done:    make(chan struct{}),
	}
	t.wg.Add(1)
	go t.readPackets()
	return t
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
		return nil, 0, fmt.Errorf("cluster: advertise address %q is not an IP address", t.f.advertise)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, 0, err
	}
	return ip, p, nil
}

// WriteTo sends a packet over UDP.
func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
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
	t.once.Do(func() { close(t.done) })
	return nil
}
