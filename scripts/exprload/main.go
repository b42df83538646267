// Command exprload measures what costly routing expressions do to other
// clients of a node: a well-behaved client requests, one at a time, on a
// round-robin exchange while attacker connections send requests in a loop
// to a fun exchange whose route expression is as costly as the node lets
// it be. It prints the well-behaved client's latency first alone, then
// under attack.
//
//	go run ./scripts/exprload                       # 4 attackers, 30 s
//	go run ./scripts/exprload -duration 10s -attackers 8 -expr '...'
//
// The node runs in this process, on 127.0.0.1, with its default limits.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/node"
)

func main() {
	attackers := flag.Int("attackers", 4, "attacker connections")
	inflight := flag.Int("inflight", 8, "requests each attacker keeps in flight")
	duration := flag.Duration("duration", 30*time.Second, "how long the attack lasts")
	baseline := flag.Duration("baseline", 5*time.Second, "how long the well-behaved client runs alone first")
	expr := flag.String("expr", `headers.all(a, [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28].all(i, a != "x")) ? null : null`, "the attackers' route expression")
	headers := flag.Int("headers", 256, "headers on each attack request")
	flag.Parse()

	dir, err := os.MkdirTemp("", "exprload")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	n, err := node.Start(node.Config{DataDir: dir, Listen: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	dial := func(name string) *courier.Conn {
		c, err := client.Dial(ctx, n.URL(), client.Options{Name: name})
		if err != nil {
			log.Fatal(err)
		}
		return c
	}
	handle := func(name string, opts ...courier.ExchangeOption) {
		ex, err := dial("handler-"+name).ReqResp(ctx, name, opts...)
		if err != nil {
			log.Fatalf("declare %s: %v", name, err)
		}
		if _, err := ex.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
			log.Fatal(err)
		}
	}
	handle("good", courier.RoundRobin)
	handle("evil", courier.RouteExpr(*expr))

	good, err := dial("good").ReqResp(ctx, "good")
	if err != nil {
		log.Fatal(err)
	}
	measure := func(d time.Duration) *hdrhistogram.Histogram {
		h := hdrhistogram.New(1, int64(10*time.Second), 3)
		for end := time.Now().Add(d); time.Now().Before(end); {
			start := time.Now()
			if _, err := good.Request(ctx, courier.Message{Body: []byte("hi")}); err != nil {
				log.Fatalf("the well-behaved request failed: %v", err)
			}
			h.RecordValue(int64(time.Since(start)))
		}
		return h
	}
	report := func(what string, h *hdrhistogram.Histogram) {
		q := func(p float64) time.Duration { return time.Duration(h.ValueAtQuantile(p)) }
		fmt.Printf("%-14s %7d requests  p50 %-10s p99 %-10s p99.9 %-10s max %s\n", what, h.TotalCount(), q(50), q(99), q(99.9), time.Duration(h.Max()))
	}
	report("alone", measure(*baseline))

	hdr := map[string]string{}
	for i := range *headers {
		hdr[fmt.Sprintf("h%03d", i)] = strings.Repeat("v", 16)
	}
	stop := make(chan struct{})
	var sent, limited, failed atomic.Int64
	for i := range *attackers {
		ex, err := dial(fmt.Sprint("attacker-", i)).ReqResp(ctx, "evil")
		if err != nil {
			log.Fatal(err)
		}
		for range *inflight {
			go func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, err := ex.Request(ctx, courier.Message{Header: hdr})
					sent.Add(1)
					switch {
					case err == nil:
					case strings.Contains(err.Error(), "expression limit"):
						limited.Add(1)
					default:
						failed.Add(1)
					}
				}
			}()
		}
	}
	start := time.Now()
	h := measure(*duration)
	report("under attack", h)
	fmt.Printf("attack: %d requests answered in %s (%d stopped by a limit, %d failed otherwise)\n", sent.Load(), time.Since(start).Round(time.Millisecond), limited.Load(), failed.Load())
	close(stop) // the attackers' requests in flight are left to the node's close
}
