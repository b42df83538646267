package node

import (
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"

	"github.com/courier-mq/courier"
)

// benchPingPong starts a node with one handler answering pong on its own
// connection (and so its own goroutine, as an independent service would
// be) and returns the requester's exchange.
func benchPingPong(b *testing.B) *courier.ReqResp {
	n, err := Start(Config{DataDir: b.TempDir(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	ctx := context.Background()
	h := n.Connect()
	hx, err := h.ReqResp(ctx, "ping", courier.RoundRobin)
	if err != nil {
		b.Fatal(err)
	}
	pong := []byte("pong")
	if _, err := hx.Handle(ctx, func(r *courier.Request) { r.Reply(pong) }); err != nil {
		b.Fatal(err)
	}
	ex, err := n.Connect().ReqResp(ctx, "ping")
	if err != nil {
		b.Fatal(err)
	}
	return ex
}

// BenchmarkRequestSequential measures embedded request-response cycles
// from one requester goroutine.
func BenchmarkRequestSequential(b *testing.B) {
	ex := benchPingPong(b)
	ctx := context.Background()
	msg := courier.Message{Body: []byte("ping")}
	b.ReportAllocs()
	start := cpu()
	for b.Loop() {
		if _, err := ex.Request(ctx, msg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	b.ReportMetric(float64(cpu()-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkRequestParallel10 measures cycles with 10 requester goroutines
// sharing one handler.
func BenchmarkRequestParallel10(b *testing.B) {
	ex := benchPingPong(b)
	ctx := context.Background()
	msg := courier.Message{Body: []byte("ping")}
	b.ReportAllocs()
	start := cpu()
	b.SetParallelism(5) // × GOMAXPROCS 2 = 10 goroutines
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := ex.Request(ctx, msg); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	b.ReportMetric(float64(cpu()-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkFloorSequential is the ceiling of any design that hands each
// request to a handler goroutine and its answer back: the same shape as
// BenchmarkRequestSequential with nothing but an unbuffered channel each
// way. Run it beside the broker's benchmarks (scripts/bench-embedded.sh
// does): on a shared machine only figures from one run compare.
func BenchmarkFloorSequential(b *testing.B) {
	req, resp := make(chan int), make(chan int)
	go func() {
		for v := range req {
			resp <- v
		}
	}()
	defer close(req)
	start := cpu()
	for i := 0; b.Loop(); i++ {
		req <- i
		<-resp
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	b.ReportMetric(float64(cpu()-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkFloorParallel10 is BenchmarkFloorSequential for 10 requester
// goroutines sharing one handler goroutine, each waiting on a channel of
// its own, as BenchmarkRequestParallel10's requesters do.
func BenchmarkFloorParallel10(b *testing.B) {
	req := make(chan chan int, 64)
	go func() {
		for c := range req {
			c <- 1
		}
	}()
	defer close(req)
	start := cpu()
	b.SetParallelism(5) // × GOMAXPROCS 2 = 10 goroutines
	b.RunParallel(func(pb *testing.PB) {
		c := make(chan int, 1)
		for pb.Next() {
			req <- c
			<-c
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	b.ReportMetric(float64(cpu()-start)/float64(b.N), "cpu-ns/op")
}

// cpu returns the process's CPU time (user and system) in ns: on a shared
// machine it is steadier than wall time.
func cpu() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
