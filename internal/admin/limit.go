package admin

import (
	"net"
	"sync"
	"sync/atomic"
)

// DefaultMaxConns is the default cap on the management listener's open
// connections.
const DefaultMaxConns = 256

// maxHeaderBytes bounds a request's header on the management listener
// (net/http's default is 1 MiB per connection).
const maxHeaderBytes = 64 << 10

// limitListener accepts at most cap(sem) connections at a time: past
// that, Accept waits for one to close before it takes the next from the
// kernel's backlog, so that connections beyond the cap cost no file
// descriptor of the process (golang.org/x/net/netutil.LimitListener
// does the same).
type limitListener struct {
	net.Listener
	sem    chan struct{}
	done   chan struct{} // closed by Close: Accept stops waiting
	once   sync.Once
	active *atomic.Int64
}

func newLimitListener(ln net.Listener, n int, active *atomic.Int64) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, max(1, n)), done: make(chan struct{}), active: active}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	l.active.Add(1)
	return &limitConn{Conn: c, l: l}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its place back when closed, once.
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.Release()
	return err
}

// Release gives the connection's place back while it stays open: it
// was upgraded to a WebSocket, which the client listener's limits
// count instead.
func (c *limitConn) Release() {
	c.once.Do(func() {
		c.l.active.Add(-1)
		<-c.l.sem
	})
}

// NetConn returns the connection under c, so that what looks through
// wrappers at the socket (the bytes waiting in its queues, see
// wire.Unread) finds it under a WebSocket too.
func (c *limitConn) NetConn() net.Conn { return c.Conn }
