package broker

import (
	"testing"

	"github.com/courier-mq/courier/wire"
)

// FuzzFromPeer feeds a node arbitrary node-link frames from a peer: the
// node's links are authenticated, but a peer may be buggy, or of another
// version; nothing it sends may crash the node or grow it without bound.
func FuzzFromPeer(f *testing.F) {
	f.Add(byte(wire.TypeRSub), uint32(0), uint64(1), uint64(0), "x", "", "", []byte(`{"patterns":["a.*","#"]}`))
	f.Add(byte(wire.TypeRUnsub), uint32(0), uint64(0), uint64(0), "x", "", "", []byte(`{"patterns":["a.*"]}`))
	f.Add(byte(wire.TypeRPub), uint32(0), uint64(0), uint64(0), "x", "k.1", "", []byte("body"))
	f.Add(byte(wire.TypeRCtrl), uint32(0), uint64(2), uint64(99), "cx", "", "a/c1.1", []byte(nil))
	f.Add(byte(wire.TypeRSubReq), uint32(0), uint64(3), uint64(0), "cx", "", "b/c1.1", []byte(`{"member":{"id":"a/c2.1"},"patterns":["p"]}`))
	f.Add(byte(wire.TypeRDecide), uint32(0), uint64(3), uint64(0), "cx", "", "", []byte(`{"patterns":["p"]}`))
	f.Add(byte(wire.TypeRMember), uint32(0), uint64(4), uint64(0), "cx", "", "b/c1.1", []byte(`{"patterns":["p"]}`))
	f.Add(byte(wire.TypeRView), uint32(0), uint64(0), uint64(5), "rr", "", "", []byte(`{"epoch":1,"term":2,"leader":"a/c1.1","members":[{"id":"a/c1.1","role":"handler","node":"a","key":1}]}`))
	f.Add(byte(wire.TypeRAttach), uint32(0), uint64(0), uint64(0), "rr", "", "", []byte(`{"members":[{"id":"a/c1.1","role":"handler","node":"a","key":1}],"full":true}`))
	f.Add(byte(wire.TypeRDetach), uint32(0), uint64(0), uint64(0), "rr", "", "a/c1.1", []byte(nil))
	f.Add(byte(wire.TypeRReq), uint32(0), uint64(7), uint64(1000), "b/c1.1\x00a/c3", "", "", []byte("req"))
	f.Add(byte(wire.TypeRViewAck), uint32(0), uint64(0), uint64(5), "rr", "", "", []byte(nil))
	f.Add(byte(wire.TypeResponse), uint32(0), uint64(7), uint64(0), "", "", "", []byte("resp"))
	// Forwarded workers (forward_worker.go): an ATTACH from the worker's
	// node, settles, a stand-in's id, and TASK and EVENT for a worker
	// this node does not have.
	f.Add(byte(wire.TypeAttach), uint32(1), uint64(9), uint64(wire.RoleWorker), "x", "", "", []byte(`{"prefetch":4}`))
	f.Add(byte(wire.TypeAttach), uint32(1<<31|1), uint64(9), uint64(wire.RoleWorker), "x", "", "", []byte(nil))
	f.Add(byte(wire.TypeAttach), uint32(2), uint64(9), uint64(wire.RoleHandler), "rr", "", "", []byte(nil))
	f.Add(byte(wire.TypeAck), uint32(1), uint64(3), uint64(0), "", "", "", []byte(nil))
	f.Add(byte(wire.TypeNack), uint32(1), uint64(3), uint64(1), "", "", "x", []byte(nil))
	f.Add(byte(wire.TypeProgress), uint32(1), uint64(3), uint64(50), "", "", "half", []byte(nil))
	f.Add(byte(wire.TypeDetach), uint32(1<<31|1), uint64(0), uint64(0), "", "", "", []byte(nil))
	f.Add(byte(wire.TypeTask), uint32(1), uint64(3), uint64(0), "", "k", "", []byte("task"))
	f.Add(byte(wire.TypeEvent), uint32(1), uint64(0), uint64(wire.EventDetached), "x", "", "gone", []byte(nil))
	m := newMesh(f, "a", "b")
	b := m.brokers["b"]
	for _, d := range []struct {
		name string
		cfg  wire.ExchangeConfig
	}{
		{"x", wire.ExchangeConfig{Pattern: wire.PatternPubSub}},
		{"cx", wire.ExchangeConfig{Pattern: wire.PatternPubSub, Controlled: true}},
		{"rr", wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: Leader}},
	} {
		for _, br := range m.brokers {
			if _, err := br.Declare(d.name, Spec{ExchangeConfig: d.cfg}); err != nil {
				f.Fatal(err)
			}
		}
	}
	f.Fuzz(func(t *testing.T, typ byte, attach uint32, ref, aux uint64, name, key, tag string, body []byte) {
		fr := wire.NewFrame(wire.Type(typ))
		fr.Attach, fr.Ref, fr.Aux, fr.Name, fr.Key, fr.Tag, fr.Body = attach, ref, aux, name, key, tag, body
		if fr.Check() != nil {
			fr.Release()
			return // the link's decoder refuses it before the broker
		}
		b.FromPeer("a", fr)
	})
}
