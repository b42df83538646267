package cluster

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier/wire"
)

// counter is a LinkHandler that counts frames.
type counter struct{ n atomic.Int64 }

func (c *counter) FromPeer(string, *wire.Frame) { c.n.Add(1) }
func (c *counter) PeerUp(string)                {}
func (c *counter) PeerDown(string)              {}

// BenchmarkSend: frames of 100-byte bodies over a data link between two
// fabrics of one process, with the cluster secret (TLS), until the peer
// has received them all.
func BenchmarkSend(b *testing.B) {
	a, _ := startFabric(b, "a", nil, nil)
	c, _ := startFabric(b, "b", []string{a.Advertise()}, nil)
	recv := &counter{}
	c.SetHandler(recv)
	waitFor(b, 20*time.Second, "a and b up", func() bool { return allUp(a, "a", "b") && allUp(c, "a", "b") })
	fr := &wire.Frame{Type: wire.TypePublish, Name: "bench", Key: "k.1", Body: make([]byte, 100)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for {
			err := a.Send("b", fr)
			if err == nil {
				break
			}
			if !errors.Is(err, ErrLinkFull) {
				b.Fatal(err)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	waitFor(b, time.Minute, "all received", func() bool { return recv.n.Load() == int64(b.N) })
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
}
