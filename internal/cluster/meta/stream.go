package meta

import (
	"net"
	"sync"

	"github.com/hashicorp/raft"
)

// closingStream is the Raft stream layer with the connections it accepted
// tracked, so that Shutdown can close them before it closes the store.
//
// hashicorp/raft's transport handles a heartbeat in the connection's own
// goroutine (a fast path), not in Raft's loop: one read just before
// Raft.Shutdown may still save a new term after it, which raft treats as
// fatal once the store is closed ("failed to save current term: database
// not open": a panic, seen in a -race run). Shutdown therefore closes
// every accepted connection first, so that no answer of such a handler
// reaches its leader, and only then the store, which takes the writes
// that come after it as no-ops (boltStore.Close).
type closingStream struct {
	raft.StreamLayer
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newClosingStream(s raft.StreamLayer) *closingStream {
	return &closingStream{StreamLayer: s, conns: map[net.Conn]struct{}{}}
}

// Accept returns the next connection, tracked until it closes.
func (s *closingStream) Accept() (net.Conn, error) {
	c, err := s.StreamLayer.Accept()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, s: s}
	s.conns[tc] = struct{}{}
	return tc, nil
}

// closeAccepted closes every accepted connection, and those accepted
// later at once.
func (s *closingStream) closeAccepted() {
	s.mu.Lock()
	s.closed = true
	conns := s.conns
	s.conns = map[net.Conn]struct{}{}
	s.mu.Unlock()
	for c := range conns {
		c.(*trackedConn).Conn.Close()
	}
}

// trackedConn leaves its stream's set when it closes.
type trackedConn struct {
	net.Conn
	s *closingStream
}

func (c *trackedConn) Close() error {
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
	return c.Conn.Close()
}
