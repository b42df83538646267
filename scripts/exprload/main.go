// Command exprload measures what costly routing expressions do to other
// clients of a node: a well-behaved client requests, one at a time, on a
// round-robin exchange while attacker connections send requests in a loop
// to a fun exchange whose route expression is as costly as the node lets
// it be. It prints the well-behaved client's latency first alone, then
// under attack.
//
//	go run ./scripts/exprload                       # 4 attackers, 30 s
//	go run ./scripts/exprload -duration 10s -attackers 8 -expr '...'
//	go run ./scripts/exprload -users -good-expr '...' # a costly legitimate expression
//
// With -good-expr the well-behaved client's exchange is a fun exchange
// with that route expression instead, which waits for evaluation slots
// like the attackers'; with -users the node has users, and the attackers
// all log in as one ("evil"), the well-behaved client as another
// ("good"), so that the slots are shared between them fairly.
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
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/node"
)

func main() {
	attackers := flag.Int("attackers", 4, "attacker connections")
	inflight := flag.Int("inflight", 8, "requests each attacker keeps in flight")
	duration := flag.Duration("duration", 30*time.Second, "how long the attack lasts")
	baseline := flag.Duration("baseline", 5*time.Second, "how long the well-behaved client runs alone first")
	expr := flag.String("expr", `headers.all(a, [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28].all(i, a != "x")) ? null : null`, "the attackers' route expression")
	headers := flag.Int("headers", 256, "headers on each attack request")
	goodExpr := flag.String("good-expr", "", "the well-behaved client's route expression (default: a round-robin exchange)")
	users := flag.Bool("users", false, "log the attackers in as one user and the well-behaved client as another")
	flag.Parse()

	dir, err := os.MkdirTemp("", "exprload")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if *users {
		if err := addUsers(dir, "good", "evil"); err != nil {
			log.Fatal(err)
		}
	}
	n, err := node.Start(node.Config{DataDir: dir, Listen: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	dial := func(user, name string) *courier.Conn {
		opts := client.Options{Name: name}
		if *users {
			opts.User, opts.Password = user, user+"-pw"
		}
		c, err := client.Dial(ctx, n.URL(), opts)
		if err != nil {
			log.Fatal(err)
		}
		return c
	}
	handle := func(name string, opts ...courier.ExchangeOption) {
		ex, err := dial(name, "handler-"+name).ReqResp(ctx, name, opts...)
		if err != nil {
			log.Fatalf("declare %s: %v", name, err)
		}
		if _, err := ex.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
			log.Fatal(err)
		}
	}
	if *goodExpr != "" {
		handle("good", courier.RouteExpr(*goodExpr))
	} else {
		handle("good", courier.RoundRobin)
	}
	handle("evil", courier.RouteExpr(*expr))

	good, err := dial("good", "good").ReqResp(ctx, "good")
	if err != nil {
		log.Fatal(err)
	}
	var goodLimited int64
	measure := func(d time.Duration) *hdrhistogram.Histogram {
		h := hdrhistogram.New(1, int64(10*time.Second), 3)
		for end := time.Now().Add(d); time.Now().Before(end); {
			start := time.Now()
			_, err := good.Request(ctx, courier.Message{Body: []byte("hi")})
			switch {
			case err == nil:
			case strings.Contains(err.Error(), "expression limit"):
				goodLimited++
			default:
				log.Fatalf("the well-behaved request failed: %v", err)
			}
			h.RecordValue(int64(time.Since(start)))
		}
		return h
	}
	report := func(what string, h *hdrhistogram.Histogram) {
		q := func(p float64) time.Duration { return time.Duration(h.ValueAtQuantile(p)) }
		fmt.Printf("%-14s %7d requests  p50 %-10s p99 %-10s p99.9 %-10s max %-10s %d stopped by a limit\n", what, h.TotalCount(), q(50), q(99), q(99.9), time.Duration(h.Max()), goodLimited)
		goodLimited = 0
	}
	report("alone", measure(*baseline))

	hdr := map[string]string{}
	for i := range *headers {
		hdr[fmt.Sprintf("h%03d", i)] = strings.Repeat("v", 16)
	}
	stop := make(chan struct{})
	var sent, limited, failed atomic.Int64
	for i := range *attackers {
		ex, err := dial("evil", fmt.Sprint("attacker-", i)).ReqResp(ctx, "evil")
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

// addUsers creates, in the users file of dir, users with full access and
// the password name + "-pw".
func addUsers(dir string, names ...string) error {
	st, err := auth.Open(auth.Config{Dir: dir, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	for _, name := range names {
		p := auth.FullAccess()
		if _, err := st.PutUser(name, auth.UserChange{Password: name + "-pw", Permissions: &p}); err != nil {
			return fmt.Errorf("user %s: %w", name, err)
		}
	}
	return nil
}
