package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/testutil"
)

// BenchmarkListExchanges lists 10,000 and 100,000 exchanges through the
// HTTP handler (routing, query parsing, merging the live exchanges into
// the sampler's name order, JSON), the way a dashboard or a script polls:
//
//	go test ./internal/admin -run '^$' -bench ListExchanges -benchtime 2s
func BenchmarkListExchanges(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		br := broker.New(broker.Config{Log: quiet})
		for i := range n {
			var spec broker.Spec
			spec.Pattern = "pubsub"
			if _, err := br.Declare(fmt.Sprintf("ex.%06d", (i*7919)%n), spec); err != nil {
				b.Fatal(err)
			}
		}
		srv, err := admin.New(admin.Config{Broker: br, Log: quiet})
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC() // not charge the set-up's garbage to the first listing
		for _, q := range []string{
			"columns=name",
			"columns=name,message_stats.publish_details.rate",
			"columns=name,message_stats.publish&sort=message_stats.publish&sort_reverse=true&page=1&page_size=100",
			"",
		} {
			b.Run(fmt.Sprintf("n=%d/%s", n, q), func(b *testing.B) {
				h := srv.Handler()
				req := httptest.NewRequest("GET", "/api/exchanges?"+q, nil)
				b.ReportAllocs()
				var w testutil.ResponseCounter
				cpu0 := cpuTime()
				for b.Loop() {
					w = testutil.ResponseCounter{}
					h.ServeHTTP(&w, req)
					if w.Code != http.StatusOK {
						b.Fatalf("status %d", w.Code)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/op")
				b.ReportMetric(float64(cpuTime()-cpu0)/1e6/float64(b.N), "cpu-ms/op")
				b.ReportMetric(float64(w.N), "bytes/response")
			})
		}
		srv.Shutdown(context.Background())
		br.Close()
	}
}

// cpuTime is the CPU time of the process (every goroutine, GC included):
// on a busy machine it is a steadier measure than the wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
