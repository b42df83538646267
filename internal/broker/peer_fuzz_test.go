package broker

import (
	"testing"

	"github.com/courier-mq/courier/wire"
)

// FuzzFromPeer feeds a node arbitrary node-link frames from a peer: the
// node's links are authenticated, but a peer may be buggy, or of another
// version; nothing it sends may crash the node or grow it without bound.
func FuzzFromPeer(f *testing.F) {
	f.Add(byte(wire.TypeRSub), uint64(1), uint64(0), "x", "", "", []byte(`{"patterns":["a.*","#"]}`))
	f.Add(byte(wire.TypeRUnsub), uint64(0), uint64(0), "x", "", "", []byte(`{"patterns":["a.*"]}`))
	f.Add(byte(wire.TypeRPub), uint64(0), uint64(0), "x", "k.1", "", []byte("body"))
	f.Add(byte(wire.TypeRCtrl), uint64(2), uint64(99), "cx", "", "a/c1.1", []byte(nil))
	f.Add(byte(wire.TypeRSubReq), uint64(3), uint64(0), "cx", "", "b/c1.1", []byte(`{"member":{"id":"a/c2.1"},"patterns":["p"]}`))
	f.Add(byte(wire.TypeRDecide), uint64(3), uint64(0), "cx", "", "", []byte(`{"patterns":["p"]}`))
	f.Add(byte(wire.TypeRMember), uint64(4), uint64(0), "cx", "", "b/c1.1", []byte(`{"patterns":["p"]}`))
	f.Add(byte(wire.TypeRView), uint64(0), uint64(5), "rr", "", "", []byte(`{"epoch":1,"term":2,"leader":"a/c1.1","members":[{"id":"a/c1.1","role":"handler","node":"a","key":1}]}`))
	f.Add(byte(wire.TypeRAttach), uint64(0), uint64(0), "rr", "", "", []byte(`{"members":[{"id":"a/c1.1","role":"handler","node":"a","key":1}],"full":true}`))
	f.Add(byte(wire.TypeRDetach), uint64(0), uint64(0), "rr", "", "a/c1.1", []byte(nil))
	f.Add(byte(wire.TypeRReq), uint64(7), uint64(1000), "b/c1.1\x00a/c3", "", "", []byte("req"))
	f.Add(byte(wire.TypeRViewAck), uint64(0), uint64(5), "rr", "", "", []byte(nil))
	f.Add(byte(wire.TypeResponse), uint64(7), uint64(0), "", "", "", []byte("resp"))
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
	f.Fuzz(func(t *testing.T, typ byte, ref, aux uint64, name, key, tag string, body []byte) {
		fr := wire.NewFrame(wire.Type(typ))
		fr.Ref, fr.Aux, fr.Name, fr.Key, fr.Tag, fr.Body = ref, aux, name, key, tag, body
		if fr.Check() != nil {
			fr.Release()
			return // the link's decoder refuses it before the broker
		}
		b.FromPeer("a", fr)
	})
}
