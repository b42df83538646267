package node

import (
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/courier-mq/courier/wire"
)

// TestClusterDeclarePipelined: on a node of a 3-node cluster, a client
// sends many DECLAREs, each followed at once by an ATTACH of the same
// exchange and a PUBLISH to it, without waiting for any answer. The
// declares wait for the metadata group off the read loop, and each
// ATTACH and PUBLISH still finds its exchange (docs/protocol.md §1).
func TestClusterDeclarePipelined(t *testing.T) {
	nodes := startCluster3(t)
	nc, err := net.Dial("tcp", nodes[1].Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := wire.NewReader(nc, 1<<20)
	send := func(f *wire.Frame) {
		t.Helper()
		p, err := wire.AppendFrame(nil, f, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	next := func() *wire.Frame {
		t.Helper()
		for {
			nc.SetReadDeadline(time.Now().Add(30 * time.Second))
			var f wire.Frame
			if err := r.Next(&f); err != nil {
				t.Fatalf("read: %v", err)
			}
			switch f.Type {
			case wire.TypePing, wire.TypeCredit, wire.TypeEvent, wire.TypeMessage:
				continue
			}
			return &f
		}
	}
	hello, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, Name: "pipelined"})
	send(&wire.Frame{Type: wire.TypeHello, Body: hello})
	if f := next(); f.Type != wire.TypeWelcome {
		t.Fatalf("want WELCOME, got %+v", f)
	}
	const k = 20
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternPubSub})
	for i := range k {
		name := fmt.Sprintf("pipelined.%d", i)
		send(&wire.Frame{Type: wire.TypeDeclare, Ref: uint64(3*i + 1), Name: name, Body: cfg})
		send(&wire.Frame{Type: wire.TypeAttach, Ref: uint64(3*i + 2), Attach: uint32(i + 1), Name: name, Aux: wire.RoleSubscriber, Body: []byte(`{"patterns":["#"]}`)})
		send(&wire.Frame{Type: wire.TypePublish, Ref: uint64(3*i + 3), Name: name, Key: "k", Flags: wire.FlagReply})
	}
	for range 3 * k {
		f := next()
		if f.Type != wire.TypeOK {
			t.Fatalf("answer to ref %d: %s %d %q", f.Ref, f.Type, f.Aux, f.Tag)
		}
	}
}
