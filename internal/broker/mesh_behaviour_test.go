package broker

import (
	"sync/atomic"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/behaviour"
	"github.com/courier-mq/courier/wire"
)

// meshTransport is a courier.Conn's transport to one node of a mesh.
// DECLARE and DELETE go to every node, the others first, as the
// metadata group will replicate them; the rest go to the node's session.
type meshTransport struct {
	rm     *rrMesh
	node   string
	s      *Session
	admins map[string]*Session // the other nodes' sessions for replication
	recv   func(*wire.Frame)
	closed atomic.Bool
}

var (
	_ courier.Transport    = (*meshTransport)(nil)
	_ courier.FuncDeclarer = (*meshTransport)(nil)
)

func (rm *rrMesh) conn(t *testing.T, node string) *courier.Conn {
	tr := &meshTransport{rm: rm, node: node, admins: map[string]*Session{}}
	tr.s = rm.brokers[node].Open(tr, "behaviour")
	for _, n := range rm.names {
		if n != node {
			tr.admins[n] = rm.brokers[n].Open(dropSink{}, "replication")
		}
	}
	c := courier.NewConn(tr, courier.ConnOptions{ID: tr.s.ID()})
	t.Cleanup(func() { c.Close() })
	return c
}

func (t *meshTransport) Start(recv func(*wire.Frame)) { t.recv = recv }

func (t *meshTransport) Deliver(f *wire.Frame) {
	if t.closed.Load() {
		f.Release()
		return
	}
	t.recv(f)
}

func (t *meshTransport) Send(f *wire.Frame) error {
	if t.closed.Load() {
		f.Release()
		return courier.ErrClosed
	}
	if f.Type == wire.TypeDeclare || f.Type == wire.TypeDelete {
		for _, a := range t.admins {
			a.Handle(f.Clone())
		}
	}
	t.s.Handle(f)
	return nil
}

func (t *meshTransport) DeclareFuncs(name string, spec courier.ExchangeSpec) (wire.ExchangeInfo, error) {
	for _, a := range t.admins {
		a.DeclareFuncs(name, spec)
	}
	return t.s.DeclareFuncs(name, spec)
}

func (t *meshTransport) Close() error {
	if !t.closed.Swap(true) {
		t.s.Close()
		for _, a := range t.admins {
			a.Close()
		}
	}
	return nil
}

// The behaviour suite's request-response parts, unchanged, against three
// nodes: each connection goes to the next node in turn, so requesters
// and handlers of one test are spread over the nodes. (Pub-sub and task
// queues across nodes are not part of this step.)
func TestMeshBehaviour(t *testing.T) {
	rm := newRRMesh(t, "a", "b", "c")
	var next atomic.Uint64
	behaviour.RunReqResp(t, func(t *testing.T) *courier.Conn {
		return rm.conn(t, rm.names[next.Add(1)%3])
	})
}
