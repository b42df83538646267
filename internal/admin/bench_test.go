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
	"github.com/courier-mq/courier/internal/queue"
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

// brokerQueues shows a broker's queues to the API the way the node does,
// for benchmarks: refs are the queues' blocks of counters.
type brokerQueues struct{ b *broker.Broker }

type countersRef queue.Counters

func (r *countersRef) Counters() admin.QueueInfo {
	s := (*queue.Counters)(r).Summary()
	return admin.QueueInfo{MessagesReady: uint64(s.Ready + s.Delayed), MessagesUnacked: uint64(s.Unacked),
		Consumers: int(s.Consumers), Memory: uint64(s.Resident), Publish: s.Published, Deliver: s.Delivered, Ack: s.Acked}
}

func (s brokerQueues) QueueVersion() uint64 { return s.b.QueueVersion() }

func (s brokerQueues) AppendQueueRefs(dst []admin.NamedQueueRef) []admin.NamedQueueRef {
	s.b.RangeQueues(func(q *queue.Queue, _ bool) bool {
		dst = append(dst, admin.NamedQueueRef{Name: q.Name(), Ref: (*countersRef)(q.Counters())})
		return true
	})
	return dst
}

func (s brokerQueues) AppendQueues(dst []admin.QueueInfo) []admin.QueueInfo {
	s.b.RangeQueues(func(q *queue.Queue, _ bool) bool {
		info := (*countersRef)(q.Counters()).Counters()
		info.Name = q.Name()
		dst = append(dst, info)
		return true
	})
	return dst
}

func (s brokerQueues) Queue(string) (admin.QueueInfo, bool) { return admin.QueueInfo{}, false }

func (s brokerQueues) CreateQueue(string, admin.QueueSpec) (admin.QueueInfo, bool, error) {
	return admin.QueueInfo{}, false, admin.ErrNoQueues
}

func (s brokerQueues) DeleteQueue(string) error { return admin.ErrNoQueues }

func (s brokerQueues) PurgeQueue(string) (uint64, error) { return 0, admin.ErrNoQueues }

// BenchmarkSample runs the sampler's pass over 10,000 and 100,000 task
// exchanges and their queues, none created or deleted between samples
// (the steady state): what the sampler costs the node every second.
//
//	go test ./internal/admin -run '^$' -bench Sample
func BenchmarkSample(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			br := broker.New(broker.Config{Log: quiet})
			defer br.Close()
			for i := range n {
				var spec broker.Spec
				spec.Pattern = "tasks"
				spec.Transient = true
				if _, err := br.Declare(fmt.Sprintf("q.%07d", (i*7919)%n), spec); err != nil {
					b.Fatal(err)
				}
			}
			srv, err := admin.New(admin.Config{Broker: br, Queues: brokerQueues{br}, Log: quiet, SampleInterval: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Shutdown(context.Background())
			srv.Sample()
			runtime.GC()
			cpu0 := cpuTime()
			for b.Loop() {
				srv.Sample()
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/1e6/float64(b.N), "cpu-ms/op")
		})
	}
}
