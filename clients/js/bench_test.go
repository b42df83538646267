package js

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/node"
)

// TestRate measures request-response rates against one server with a
// Go handler over TCP: the JavaScript client from Node.js over
// WebSocket, the Go client over WebSocket and over TCP, each
// sequential and with 100 requests in flight, for 3 s each. It is a
// measurement, not a check: it runs only with COURIER_JS_BENCH=1.
//
//	COURIER_JS_BENCH=1 go test -run TestRate -v ./clients/js/
func TestRate(t *testing.T) {
	if os.Getenv("COURIER_JS_BENCH") == "" {
		t.Skip("a measurement: set COURIER_JS_BENCH=1")
	}
	bin, flags := nodeCommand(t)
	n, err := node.Start(node.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	ctx := context.Background()
	hc, err := client.Dial(ctx, n.URL(), client.Options{Name: "handler"})
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	ex, err := hc.ReqResp(ctx, "bench.echo", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
		t.Fatal(err)
	}
	wsURL := "ws://" + n.HTTPAddr().String() + "/ws"
	const secs = 3

	args := append(flags, "bench/reqresp.js", wsURL, "bench.echo", "3", "100")
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	var js struct{ Sequential, Parallel float64 }
	if err := json.Unmarshal(out, &js); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	goRate := func(url string, inflight int) float64 {
		c, err := client.Dial(ctx, url, client.Options{Name: "bench"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		e, err := c.ReqResp(ctx, "bench.echo", courier.RoundRobin)
		if err != nil {
			t.Fatal(err)
		}
		var count atomic.Int64
		start := time.Now()
		end := start.Add(secs * time.Second)
		var wg sync.WaitGroup
		for range inflight {
			wg.Go(func() {
				for time.Now().Before(end) {
					if _, err := e.Request(ctx, courier.Message{Body: make([]byte, 16)}); err != nil {
						t.Error(err)
						return
					}
					count.Add(1)
				}
			})
		}
		wg.Wait()
		return float64(count.Load()) / time.Since(start).Seconds()
	}
	t.Logf("request-response, 16-byte bodies, a Go handler over TCP, %d s each (req/s):", secs)
	t.Logf("%-34s %12s %12s", "requester", "sequential", "parallel 100")
	t.Logf("%-34s %12.0f %12.0f", "JavaScript (Node.js) over WebSocket", js.Sequential, js.Parallel)
	t.Logf("%-34s %12.0f %12.0f", "Go client over WebSocket", goRate(wsURL, 1), goRate(wsURL, 100))
	t.Logf("%-34s %12.0f %12.0f", "Go client over TCP", goRate(n.URL(), 1), goRate(n.URL(), 100))
}
