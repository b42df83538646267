package courier

import (
	"errors"
	"testing"

	"github.com/courier-mq/courier/wire"
)

// recvTransport hands the test the Conn's receive function.
type recvTransport struct{ recv func(*wire.Frame) }

func (t *recvTransport) Start(recv func(*wire.Frame)) { t.recv = recv }
func (t *recvTransport) Send(f *wire.Frame) error     { f.Release(); return nil }
func (t *recvTransport) Close() error                 { return nil }

// An ERROR for a call that gave up (a PublishSync or a request whose
// context ended before the broker answered) is reported once, as it
// came, and its frame released once. Before, the call lookup released
// it, the report read the released frame (code 0, no message) and
// released it again: the pool then gave one frame to two readers, and
// a client under faults delivered a message twice and sent the broker a
// MESSAGE (found by the fault tests, cluster-partition seed 21, and by
// the race detector there).
func TestLateErrorReleasedOnce(t *testing.T) {
	tr := &recvTransport{}
	c := NewConn(tr, ConnOptions{ID: "n1/c1"})
	var got []error
	c.OnError(func(err error) { got = append(got, err) })
	f := wire.NewFrame(wire.TypeError)
	f.Ref, f.Aux, f.Tag = 42, uint64(wire.CodeNotFound), "exchange \"x\" not found"
	tr.recv(f)
	var we *wire.Error
	if len(got) != 1 || !errors.As(got[0], &we) || we.Code != wire.CodeNotFound || we.Msg != "exchange \"x\" not found" {
		t.Fatalf("reported %v, want the late error as it came", got)
	}
}
