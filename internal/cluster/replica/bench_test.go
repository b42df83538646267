package replica

import (
	"context"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
)

// BenchmarkPropose3 measures proposals on 3 in-process hosts, each with
// its own store.Log on disk (fsync on, group commit), over the in-memory
// transport: 1 KiB proposals from 64 concurrent proposers. It reports
// proposals per second and the commit latency (Propose's return) p50
// and p99.
//
//	go test -run XXX -bench Propose3 -benchtime 5000x ./internal/cluster/replica/
func BenchmarkPropose3(b *testing.B) {
	net := NewMemNetwork()
	ids := []uint64{1, 2, 3}
	groups := map[uint64]*Group{}
	dir := b.TempDir()
	for _, id := range ids {
		cfg := Config{ID: id, Transport: net.Transport(id), SnapshotEntries: 1 << 40}
		h, err := NewHost(store.OSFS{}, filepath.Join(dir, strconv.FormatUint(id, 10)), cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = h.Close() })
		if groups[id], err = h.Group(1, ids, &nopSM{}); err != nil {
			b.Fatal(err)
		}
	}
	var lead *Group
	testutil.WaitFor(b, wait, func() bool {
		for id, g := range groups {
			if l, _ := g.Leader(); l == id {
				lead = g
				return true
			}
		}
		return false
	})
	data := make([]byte, 1024)
	const workers = 64
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				if _, err := lead.Propose(context.Background(), data); err != nil {
					b.Error(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/el.Seconds(), "proposals/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

type nopSM struct{}

func (nopSM) Apply(Entry) error         { return nil }
func (nopSM) Snapshot() ([]byte, error) { return nil, nil }
func (nopSM) Restore(data []byte) error { return nil }
