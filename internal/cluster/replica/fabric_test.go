package replica

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/courier-mq/courier/internal/cluster"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
)

var fabricSecret = []byte("0123456789abcdef0123456789abcdef")

// startFabrics starts n fabrics on 127.0.0.1:0, named n1..nn, joined,
// and waits until each can dial every other on KindQueueRaft.
func startFabrics(t *testing.T, n int) []*cluster.Fabric {
	t.Helper()
	var fs []*cluster.Fabric
	for i := 1; i <= n; i++ {
		var join []string
		if len(fs) > 0 {
			join = []string{fs[0].Addr().String()}
		}
		f, err := cluster.New(cluster.Config{
			Name: fmt.Sprintf("n%d", i), Listen: "127.0.0.1:0", Join: join,
			Secret: fabricSecret, HandshakeTimeout: 10 * time.Second,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		fs = append(fs, f)
	}
	testutil.WaitForf(t, wait, func() bool {
		for _, f := range fs {
			if len(f.Members()) != n {
				return false
			}
		}
		return true
	}, "%d fabrics see each other", n)
	return fs
}

func nodeOf(id uint64) (string, bool) { return fmt.Sprintf("n%d", id), id > 0 }

func idOf(node string) (uint64, bool) {
	var id uint64
	_, err := fmt.Sscanf(node, "n%d", &id)
	return id, err == nil && id > 0
}

// TestFabricTransport runs a 3-replica group over the cluster fabric.
func TestFabricTransport(t *testing.T) {
	fabs := startFabrics(t, 3)
	ids := []uint64{1, 2, 3}
	groups := map[uint64]*Group{}
	sms := map[uint64]*listSM{}
	for i, id := range ids {
		tr := NewFabricTransport(fabs[i], id, nodeOf, idOf, nil)
		t.Cleanup(func() { _ = tr.Close() })
		cfg := testConfig()
		cfg.ID, cfg.Transport = id, tr
		h, err := NewHost(store.NewMemFS(), "/data", cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		sms[id] = &listSM{}
		if groups[id], err = h.Group(testGroup, ids, sms[id]); err != nil {
			t.Fatal(err)
		}
	}
	want := items("f", 20)
	for _, s := range want {
		ok := testutil.Eventually(wait, func() bool {
			for _, g := range groups {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := g.Propose(ctx, []byte(s))
				cancel()
				if err == nil {
					return true
				}
			}
			return false
		})
		if !ok {
			t.Fatalf("%q not committed", s)
		}
	}
	for id, sm := range sms {
		testutil.WaitForf(t, wait, func() bool { return slices.Equal(sm.list(), want) }, "replica %d", id)
	}
}

// TestFabricForgedSender: a node that sends messages in another
// replica's name, or to another host, has its batch dropped.
func TestFabricForgedSender(t *testing.T) {
	fabs := startFabrics(t, 2)
	tr := NewFabricTransport(fabs[0], 1, nodeOf, idOf, nil)
	t.Cleanup(func() { _ = tr.Close() })
	var mu sync.Mutex
	var got []uint64
	tr.Listen(func(batch []Envelope) {
		mu.Lock()
		for _, e := range batch {
			got = append(got, e.Msg.GetFrom())
		}
		mu.Unlock()
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := fabs[1].Dial(ctx, "n1", cluster.KindQueueRaft)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := func(from, to uint64) Envelope {
		typ := pb.MsgHeartbeat
		return Envelope{Group: 1, Msg: &pb.Message{Type: &typ, From: u64(from), To: u64(to)}}
	}
	for _, b := range [][]Envelope{
		{msg(3, 1)},            // forged sender: n2 is replica 2
		{msg(2, 1), msg(3, 1)}, // one forged message spoils the batch
		{msg(2, 4)},            // not for this host
		{msg(2, 1)},            // genuine
	} {
		buf, err := encodeBatch(nil, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitForf(t, wait, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0
	}, "the genuine batch arrives")
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []uint64{2}) {
		t.Fatalf("received from %v, want only the genuine [2]", got)
	}
}

// TestFabricOversizedBatch: a batch announced larger than the limit
// closes the connection before anything is allocated for it.
func TestFabricOversizedBatch(t *testing.T) {
	fabs := startFabrics(t, 2)
	tr := NewFabricTransport(fabs[0], 1, nodeOf, idOf, nil)
	t.Cleanup(func() { _ = tr.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := fabs[1].Dial(ctx, "n1", cluster.KindQueueRaft)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte{0xFF, 0xFF, 0xFF, 0xFF}); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	var b [1]byte
	if _, err := c.Read(b[:]); err == nil {
		t.Fatal("the connection stayed open")
	}
}

// FuzzDecodeBatch feeds arbitrary bytes, as a hostile peer sends them,
// to the batch decoder.
func FuzzDecodeBatch(f *testing.F) {
	typ := pb.MsgApp
	b, err := encodeBatch(nil, []Envelope{{Group: 3, Msg: &pb.Message{
		Type: &typ, From: u64(1), To: u64(2), Term: u64(4), Index: u64(9),
		Entries: []*pb.Entry{{Term: u64(4), Index: u64(10), Data: []byte("x")}},
	}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b[4:])
	f.Add([]byte{0, 0, 0, 0})
	f.Add(bytes.Repeat([]byte{0xFF}, 16))
	f.Fuzz(func(t *testing.T, b []byte) {
		batch, err := decodeBatch(b)
		if err != nil {
			return
		}
		again, err := encodeBatch(nil, batch)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := decodeBatch(again[4:]); err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
	})
}

// TestFabricQuiet: over the cluster fabric, 20 idle groups fall quiet
// (the hosts' heartbeats cross it as group 0), and when the node that
// leads most of them dies, fabric and all, the two others elect new
// leaders for every group.
func TestFabricQuiet(t *testing.T) {
	fabs := startFabrics(t, 3)
	ids := []uint64{1, 2, 3}
	const n = 20
	hosts := map[uint64]*Host{}
	trs := map[uint64]*FabricTransport{}
	groups := map[GroupID]map[uint64]*Group{}
	for gid := GroupID(1); gid <= n; gid++ {
		groups[gid] = map[uint64]*Group{}
	}
	for i, id := range ids {
		tr := NewFabricTransport(fabs[i], id, nodeOf, idOf, nil)
		t.Cleanup(func() { _ = tr.Close() })
		cfg := quietConfig()
		cfg.ID, cfg.Transport = id, tr
		h, err := NewHost(store.NewMemFS(), "/data", cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		hosts[id], trs[id] = h, tr
		for gid := GroupID(1); gid <= n; gid++ {
			if groups[gid][id], err = h.Group(gid, ids, nopSM{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	led := func(alive []uint64) map[GroupID]uint64 {
		out := map[GroupID]uint64{}
		for gid, reps := range groups {
			var lead uint64
			for _, id := range alive {
				l, _ := reps[id].Leader()
				if l == 0 || (lead != 0 && l != lead) || !slices.Contains(alive, l) {
					return nil
				}
				lead = l
			}
			out[gid] = lead
		}
		return out
	}
	var leaders map[GroupID]uint64
	testutil.WaitForf(t, wait, func() bool {
		if leaders = led(ids); leaders == nil {
			return false
		}
		for _, h := range hosts {
			if h.QuietStats().Awake != 0 {
				return false
			}
		}
		return true
	}, "%d groups led and quiet over the fabric", n)
	count := map[uint64]int{}
	for _, l := range leaders {
		count[l]++
	}
	dead := uint64(1)
	for id, c := range count {
		if c > count[dead] {
			dead = id
		}
	}
	var alive []uint64
	for _, id := range ids {
		if id != dead {
			alive = append(alive, id)
		}
	}
	_ = hosts[dead].Close()
	_ = trs[dead].Close()
	_ = fabs[dead-1].Close()
	testutil.WaitForf(t, wait, func() bool { return led(alive) != nil }, "every group elects a leader on %v", alive)
}
