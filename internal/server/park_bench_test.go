package server_test

import (
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/server"
	"github.com/courier-mq/courier/node"
)

// BenchmarkSequentialRequest: what the waiter of an idle connection
// costs the request path, where every request finds the requester's and
// the handler's connections idle: one request at a time from a Go
// client to a Go handler over TCP, with the waiters ("park") and with
// the read loops waiting in their reads ("read"). Run the two in turn,
// several times:
//
//	go test -run '^$' -bench SequentialRequest -count 5 ./internal/server/
//
// It reports the process's CPU time a request too (cpu-ns/op).
func BenchmarkSequentialRequest(b *testing.B) {
	for _, park := range []bool{true, false} {
		name := "read"
		if park {
			name = "park"
		}
		b.Run(name, func(b *testing.B) {
			server.SetPark(park)
			defer server.SetPark(true)
			n, err := node.Start(node.Config{DataDir: b.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			defer n.Close()
			ctx := context.Background()
			h, err := client.Dial(ctx, n.URL(), client.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			ex, err := h.ReqResp(ctx, "bench", courier.RoundRobin)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ex.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
				b.Fatal(err)
			}
			r, err := client.Dial(ctx, n.URL(), client.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			rx, err := r.ReqResp(ctx, "bench")
			if err != nil {
				b.Fatal(err)
			}
			body := []byte("0123456789abcdef")
			start := cpuTime()
			ops := 0
			for b.Loop() {
				if _, err := rx.Request(ctx, courier.Message{Body: body}); err != nil {
					b.Fatal(err)
				}
				ops++
			}
			// The process's CPU time (user and system, server and
			// clients) a request: less at the mercy of other work on a
			// shared machine than the time a request takes.
			b.ReportMetric(float64(cpuTime()-start)/float64(ops), "cpu-ns/op")
		})
	}
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
