package replica

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/courier-mq/courier/internal/cluster"
)

// Fabric is what [FabricTransport] needs of the cluster fabric
// (*cluster.Fabric): authenticated connections of one kind.
type Fabric interface {
	Dial(ctx context.Context, node string, kind cluster.Kind) (net.Conn, error)
	Listener(kind cluster.Kind) net.Listener
}

// Limits of the fabric transport.
const (
	// MaxBatchBytes bounds one batch on the wire: a snapshot (at most a
	// store record) and a few messages.
	MaxBatchBytes = 64 << 20
	// maxBatchMsgs bounds the messages of one batch.
	maxBatchMsgs = 1 << 16
	fabricIdle   = 60 * time.Second // a connection idle this long is closed
	fabricWrite  = 10 * time.Second // a batch must be written within this
	fabricDial   = 5 * time.Second
	fabricRedial = 500 * time.Millisecond // at most one dial per peer per this
	fabricQueue  = 1024                   // batches waiting per peer; more are dropped
)

// FabricTransport carries Raft messages between nodes on connections of
// kind [cluster.KindQueueRaft], one outgoing connection per peer host,
// each with one writer goroutine. A batch on the wire is
//
//	len u32 | n u32 | (group u64 | mlen u32 | raftpb.Message) * n
//
// little-endian, len counting what follows it. A received batch whose
// messages do not all come from the replica of the node that
// authenticated the connection, or are not all addressed to this host,
// is dropped whole.
type FabricTransport struct {
	f      Fabric
	self   uint64
	nodeOf func(id uint64) (string, bool)
	idOf   func(node string) (uint64, bool)
	log    *slog.Logger

	mu    sync.Mutex
	peers map[uint64]*fabricPeer
	recv  func([]Envelope)
	conns map[net.Conn]struct{}
	done  chan struct{}
	wg    sync.WaitGroup
	ln    net.Listener
}

type fabricPeer struct {
	q chan []Envelope
}

// NewFabricTransport returns the transport of the host with replica id
// self over f; nodeOf and idOf map replica ids to node names and back.
// It serves [cluster.KindQueueRaft] connections until Close.
func NewFabricTransport(f Fabric, self uint64, nodeOf func(uint64) (string, bool), idOf func(string) (uint64, bool), log *slog.Logger) *FabricTransport {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	t := &FabricTransport{
		f: f, self: self, nodeOf: nodeOf, idOf: idOf, log: log,
		peers: map[uint64]*fabricPeer{}, conns: map[net.Conn]struct{}{},
		done: make(chan struct{}), ln: f.Listener(cluster.KindQueueRaft),
	}
	t.wg.Add(1)
	go t.accept()
	return t
}

// Listen implements [Transport].
func (t *FabricTransport) Listen(recv func([]Envelope)) {
	t.mu.Lock()
	t.recv = recv
	t.mu.Unlock()
}

// Send implements [Transport]: it queues the batch for the peer's
// writer, or drops it if the writer is that far behind.
func (t *FabricTransport) Send(to uint64, batch []Envelope) {
	t.mu.Lock()
	select {
	case <-t.done:
		t.mu.Unlock()
		return
	default:
	}
	p := t.peers[to]
	if p == nil {
		p = &fabricPeer{q: make(chan []Envelope, fabricQueue)}
		t.peers[to] = p
		t.wg.Add(1)
		go t.write(to, p)
	}
	t.mu.Unlock()
	select {
	case p.q <- batch:
	default:
	}
}

// Close stops the transport: its listener, connections and writers.
func (t *FabricTransport) Close() error {
	t.mu.Lock()
	select {
	case <-t.done:
		t.mu.Unlock()
		return nil
	default:
	}
	close(t.done)
	for c := range t.conns {
		_ = c.Close()
	}
	t.mu.Unlock()
	err := t.ln.Close()
	t.wg.Wait()
	return err
}

// track registers c to be closed by Close; false if closed already.
func (t *FabricTransport) track(c net.Conn, add bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !add {
		delete(t.conns, c)
		return true
	}
	select {
	case <-t.done:
		return false
	default:
	}
	t.conns[c] = struct{}{}
	return true
}

// write is the writer of peer to: it dials on demand and writes batches.
func (t *FabricTransport) write(to uint64, p *fabricPeer) {
	defer t.wg.Done()
	var c net.Conn
	var bw *bufio.Writer
	var lastDial time.Time
	var buf []byte
	defer func() {
		if c != nil {
			t.track(c, false)
			_ = c.Close()
		}
	}()
	for {
		var batch []Envelope
		select {
		case <-t.done:
			return
		case batch = <-p.q:
		}
		if c == nil {
			if time.Since(lastDial) < fabricRedial {
				continue // lost: Raft resends
			}
			lastDial = time.Now()
			node, ok := t.nodeOf(to)
			if !ok {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), fabricDial)
			nc, err := t.f.Dial(ctx, node, cluster.KindQueueRaft)
			cancel()
			if err != nil {
				t.log.Debug("replica: dial", "node", node, "err", err)
				continue
			}
			if !t.track(nc, true) {
				_ = nc.Close()
				return
			}
			c, bw = nc, bufio.NewWriterSize(nc, 64<<10)
		}
		var err error
		buf, err = encodeBatch(buf[:0], batch)
		if err == nil {
			_ = c.SetWriteDeadline(time.Now().Add(fabricWrite))
			if _, err = bw.Write(buf); err == nil && len(p.q) == 0 {
				err = bw.Flush()
			}
		}
		if err != nil {
			t.log.Debug("replica: write", "to", to, "err", err)
			t.track(c, false)
			_ = c.Close()
			c = nil
		}
	}
}

func (t *FabricTransport) accept() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		if !t.track(c, true) {
			_ = c.Close()
			return
		}
		t.wg.Add(1)
		go t.read(c)
	}
}

// read takes batches from an accepted connection.
func (t *FabricTransport) read(c net.Conn) {
	defer t.wg.Done()
	defer func() {
		t.track(c, false)
		_ = c.Close()
	}()
	pc, ok := c.(interface{ Peer() string })
	if !ok {
		return
	}
	from, ok := t.idOf(pc.Peer())
	if !ok {
		return
	}
	br := bufio.NewReaderSize(c, 64<<10)
	var hdr [4]byte
	for {
		_ = c.SetReadDeadline(time.Now().Add(fabricIdle))
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		n := binary.LittleEndian.Uint32(hdr[:])
		if n > MaxBatchBytes {
			t.log.Warn("replica: batch too large; closing", "peer", pc.Peer(), "bytes", n)
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(br, body); err != nil {
			return
		}
		batch, err := decodeBatch(body)
		if err != nil {
			t.log.Warn("replica: bad batch; closing", "peer", pc.Peer(), "err", err)
			return
		}
		if !t.authentic(batch, from) {
			t.log.Warn("replica: batch with forged sender or recipient; dropped", "peer", pc.Peer())
			continue
		}
		t.mu.Lock()
		recv := t.recv
		t.mu.Unlock()
		if recv != nil {
			recv(batch)
		}
	}
}

// authentic reports whether every message is from the replica of the
// connection's node and to this host.
func (t *FabricTransport) authentic(batch []Envelope, from uint64) bool {
	for _, e := range batch {
		if e.Msg.GetFrom() != from || e.Msg.GetTo() != t.self {
			return false
		}
	}
	return true
}

// encodeBatch appends batch's wire form, length prefix included, to b.
func encodeBatch(b []byte, batch []Envelope) ([]byte, error) {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(batch)))
	for _, e := range batch {
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Group))
		at := len(b)
		b = append(b, 0, 0, 0, 0)
		var err error
		b, err = proto.MarshalOptions{}.MarshalAppend(b, e.Msg)
		if err != nil {
			return b[:start], fmt.Errorf("replica: encode message: %w", err)
		}
		binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	}
	size := len(b) - start - 4
	if size > MaxBatchBytes {
		return b[:start], fmt.Errorf("replica: batch of %d bytes: %w", size, ErrTooLarge)
	}
	binary.LittleEndian.PutUint32(b[start:], uint32(size))
	return b, nil
}

// decodeBatch decodes a batch's body (after the length prefix). Its
// work and memory are bounded by len(b).
func decodeBatch(b []byte) ([]Envelope, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: batch of %d bytes", ErrCorrupt, len(b))
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if n > maxBatchMsgs || uint64(n) > uint64(len(b))/12 {
		return nil, fmt.Errorf("%w: %d messages in %d bytes", ErrCorrupt, n, len(b))
	}
	out := make([]Envelope, 0, n)
	for i := uint32(0); i < n; i++ {
		if len(b) < 12 {
			return nil, fmt.Errorf("%w: short message header", ErrCorrupt)
		}
		group := GroupID(binary.LittleEndian.Uint64(b))
		size := binary.LittleEndian.Uint32(b[8:])
		b = b[12:]
		if uint64(size) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: message of %d bytes, %d left", ErrCorrupt, size, len(b))
		}
		m := &pb.Message{}
		if err := proto.Unmarshal(b[:size], m); err != nil {
			return nil, fmt.Errorf("%w: message: %w", ErrCorrupt, err)
		}
		b = b[size:]
		out = append(out, Envelope{Group: group, Msg: m})
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(b))
	}
	return out, nil
}
