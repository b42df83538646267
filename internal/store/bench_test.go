package store

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

const benchRecord = 1 << 10 // 1 KiB payloads, as the benchmarks use

// reportLog adds the log's sync figures to a benchmark's output.
func reportLog(b *testing.B, l *Log, records int) {
	s := l.Stats()
	secs := b.Elapsed().Seconds()
	b.ReportMetric(float64(records)/secs, "records/s")
	b.ReportMetric(float64(s.Syncs)/secs, "syncs/s")
	if s.Syncs > 0 {
		b.ReportMetric(float64(records)/float64(s.Syncs), "records/sync")
		b.ReportMetric(float64(s.SyncAvg().Microseconds())/1000, "sync-ms")
	}
}

// BenchmarkAppendGroupCommit appends 1 KiB records from concurrent
// appenders to a log on the real disk (in the temp dir), with the
// default policy: every append is confirmed only after its fsync.
//
// inflight=1: each appender waits for its confirm before the next append
// (a synchronous publisher). inflight=N: each keeps up to N appends
// unconfirmed (a publisher with confirms in flight, as NATS and RabbitMQ
// clients publish); throughput then depends on batching, not on fsync
// latency.
func BenchmarkAppendGroupCommit(b *testing.B) {
	for _, c := range []struct{ appenders, inflight int }{
		{1, 1}, {16, 1}, {64, 1},
		{1, 256}, {16, 64}, {64, 16}, {16, 256}, {64, 64},
	} {
		b.Run(fmt.Sprintf("appenders=%d/inflight=%d", c.appenders, c.inflight), func(b *testing.B) {
			l, _, err := Open(OSFS{}, b.TempDir(), DefaultOptions())
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			payload := make([]byte, benchRecord)
			for i := range payload {
				payload[i] = byte(i)
			}
			b.SetBytes(benchRecord)
			b.ReportAllocs()
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for a := range c.appenders {
				wg.Go(func() {
					sem := make(chan struct{}, c.inflight)
					for next.Add(1) <= int64(b.N) {
						sem <- struct{}{}
						if _, err := l.Append(uint32(a), 1, payload, func(err error) {
							if err != nil {
								b.Error(err)
							}
							<-sem
						}); err != nil {
							b.Error(err)
							return
						}
					}
					for range c.inflight {
						sem <- struct{}{}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			reportLog(b, l, b.N)
		})
	}
}

// BenchmarkAppendNoWait measures the append path alone: appends are not
// waited for (the log still syncs in the background).
func BenchmarkAppendNoWait(b *testing.B) {
	l, _, err := Open(OSFS{}, b.TempDir(), DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	payload := make([]byte, benchRecord)
	b.SetBytes(benchRecord)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Append(1, 1, payload, nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
	if err := l.Sync(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	reportLog(b, l, b.N)
}

// BenchmarkRead reads random 1 KiB records back by ref (pread + CRC
// check) from 64 MiB of log, from parallel readers; the data is in the
// page cache, as recently written records are.
func BenchmarkRead(b *testing.B) {
	l, _, err := Open(OSFS{}, b.TempDir(), DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	payload := make([]byte, benchRecord)
	refs := make([]Ref, 64<<10)
	for i := range refs {
		if refs[i], err = l.Append(uint32(i), 1, payload, nil); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Sync(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchRecord)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
		buf := make([]byte, benchRecord+recHeaderSize)
		for pb.Next() {
			if _, err := l.Read(refs[rng.IntN(len(refs))], buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkOpen measures restart: Open (recovery) and Replay of a log
// holding COURIER_STORE_OPEN_RECORDS (default 100,000) 1 KiB records,
// with a checkpoint after all of them (restart replays nothing), after
// 90% of them, and with none (replays everything). The page cache is
// warm: this measures the store's work, not the disk's.
func BenchmarkOpen(b *testing.B) {
	total := 100_000
	if s := os.Getenv("COURIER_STORE_OPEN_RECORDS"); s != "" {
		fmt.Sscan(s, &total)
	}
	for _, c := range []struct {
		name      string
		checkAt   int // records before the checkpoint; -1: none
		replaying int
	}{
		{"checkpoint=end", total, 0},
		{"checkpoint=90pct", total * 9 / 10, total - total*9/10},
		{"checkpoint=none", -1, total},
	} {
		b.Run(fmt.Sprintf("records=%d/%s", total, c.name), func(b *testing.B) {
			dir := b.TempDir()
			l, _, err := Open(OSFS{}, dir, DefaultOptions())
			if err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, benchRecord)
			for i := range total {
				if i == c.checkAt {
					if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("state"), nil }); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := l.Append(uint32(i%100), 1, payload, nil); err != nil {
					b.Fatal(err)
				}
			}
			if c.checkAt == total {
				if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("state"), nil }); err != nil {
					b.Fatal(err)
				}
			}
			if err := l.Close(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				l, rec, err := Open(OSFS{}, dir, DefaultOptions())
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				if err := l.Replay(func(Record) error { n++; return nil }); err != nil {
					b.Fatal(err)
				}
				if n != c.replaying || !rec.Clean() {
					b.Fatalf("replayed %d, want %d; %+v", n, c.replaying, rec)
				}
				l.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/restart")
		})
	}
}

// BenchmarkDiskRaw is the disk's raw speed in the same run, for the
// store/raw ratio:
//
//   - direct: 1 MiB O_DIRECT writes, as dd bs=1M oflag=direct;
//   - fdatasync: 1 MiB buffered writes, one fdatasync at the end, as dd
//     bs=1M conv=fdatasync;
//   - sync-4KiB: a 4 KiB write and an fdatasync in a loop: the fsync
//     latency floor that a single synchronous appender pays.
func BenchmarkDiskRaw(b *testing.B) {
	const block = 1 << 20
	buf := alignedBlock(block)
	b.Run("direct-1MiB", func(b *testing.B) {
		f, err := os.OpenFile(filepath.Join(b.TempDir(), "raw"), os.O_CREATE|os.O_WRONLY|syscall.O_DIRECT, 0o644)
		if err != nil {
			b.Skip("no O_DIRECT here:", err)
		}
		defer f.Close()
		b.SetBytes(block)
		for b.Loop() {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fdatasync-1MiB", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		b.SetBytes(block)
		b.ResetTimer()
		for range b.N {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		if err := datasync(f); err != nil { // timed: as dd conv=fdatasync
			b.Fatal(err)
		}
		b.StopTimer()
	})
	b.Run("sync-4KiB", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		start := time.Now()
		for b.Loop() {
			if _, err := f.Write(buf[:4096]); err != nil {
				b.Fatal(err)
			}
			if err := datasync(f); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "syncs/s")
	})
}

// alignedBlock returns n bytes aligned for O_DIRECT.
func alignedBlock(n int) []byte {
	const align = 4096
	b := make([]byte, n+align)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (align - 1))
	if off != 0 {
		off = align - off
	}
	return b[off : off+n]
}

// BenchmarkScrub measures the background check of a log holding
// COURIER_STORE_OPEN_RECORDS (default 100,000) 1 KiB records, all before
// the checkpoint: Open with the check on (it runs after Open returns),
// and one whole pass of the check without a rate limit, the page cache
// warm.
func BenchmarkScrub(b *testing.B) {
	total := 100_000
	if s := os.Getenv("COURIER_STORE_OPEN_RECORDS"); s != "" {
		fmt.Sscan(s, &total)
	}
	dir := b.TempDir()
	l, _, err := Open(OSFS{}, dir, DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, benchRecord)
	for i := range total {
		if _, err := l.Append(uint32(i%100), 1, payload, nil); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("state"), nil }); err != nil {
		b.Fatal(err)
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	opts := DefaultOptions()
	opts.ScrubRate = 1 << 40
	b.Run(fmt.Sprintf("records=%d", total), func(b *testing.B) {
		var open, pass time.Duration
		var bytes int64
		for b.Loop() {
			start := time.Now()
			l, _, err := Open(OSFS{}, dir, opts)
			if err != nil {
				b.Fatal(err)
			}
			open += time.Since(start)
			for l.Stats().Scrub != ScrubDone {
				time.Sleep(time.Millisecond)
			}
			pass += time.Since(start)
			st := l.Stats()
			if st.DamagedRecords != 0 || int64(st.ScrubBytes) != st.ScrubTotal {
				b.Fatalf("stats %+v", st)
			}
			bytes = st.ScrubTotal
			l.Close()
		}
		n := float64(b.N)
		b.ReportMetric(float64(open.Microseconds())/1e3/n, "ms/open")
		b.ReportMetric(float64(pass.Milliseconds())/n, "ms/pass")
		b.ReportMetric(float64(bytes)/1e6/(pass.Seconds()/n), "MB/s")
	})
}
