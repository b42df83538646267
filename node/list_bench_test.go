package node

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// BenchmarkListQueues lists 10,000 and 100,000 queues (task exchanges)
// through the management API's handler, as an operator's script does:
//
//	go test ./node -run '^$' -bench ListQueues -benchtime 2s
func BenchmarkListQueues(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		nd, err := Start(Config{DataDir: b.TempDir(), HTTP: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		for i := range n {
			spec := broker.Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternTasks, Transient: true}}
			if _, err := nd.Broker().Declare(fmt.Sprintf("q.%07d", (i*7919)%n), spec); err != nil {
				b.Fatal(err)
			}
		}
		h := nd.admin.Handler()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/api/queues", nil))
		runtime.GC()
		for _, q := range []string{"columns=name,messages_ready", ""} {
			b.Run(fmt.Sprintf("n=%d/%s", n, q), func(b *testing.B) {
				req := httptest.NewRequest("GET", "/api/queues?"+q, nil)
				b.ReportAllocs()
				var size int
				cpu0 := cpu()
				for b.Loop() {
					var w testutil.ResponseCounter
					h.ServeHTTP(&w, req)
					if w.Code != http.StatusOK {
						b.Fatalf("status %d", w.Code)
					}
					size = w.N
				}
				b.ReportMetric(float64(cpu()-cpu0)/1e6/float64(b.N), "cpu-ms/op")
				b.ReportMetric(float64(size), "bytes/response")
			})
		}
		nd.Close()
	}
}
