// Command connmem measures what an idle connected client costs a
// running server: it reads the server's RSS (/proc/PID/status), heap in
// use, goroutine stacks and goroutine count (its pprof endpoints, after
// a forced GC), opens --conns connections, each subscribed to one of 20
// pub-sub exchanges, lets them settle, reads the same again and prints
// the difference per connection.
//
//	courier server --data d --listen 127.0.0.1:17500 --http 127.0.0.1:17580 --amqp off --heartbeat 30s &
//	go run ./scripts/connmem --pid $! --http 127.0.0.1:17580 --url ws://127.0.0.1:17580/ws --conns 10000 --heartbeat 30s
//	go run ./scripts/connmem --pid $! --http 127.0.0.1:17580 --url courier://127.0.0.1:17500 --conns 10000 --heartbeat 30s
//
// Run the two against fresh servers: memory a server took stays with
// its process. The clients run in this process, so the server's figures
// are its own; on a loaded machine some may miss their heartbeats and
// reconnect, which the output reports.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
)

// figures are one reading of the server.
type figures struct {
	rssKB      int
	heap       int // bytes in use
	stack      int // bytes of goroutine stacks
	goroutines int
}

func main() {
	n := flag.Int("conns", 2000, "connections to open")
	url := flag.String("url", "", "the server's client URL: ws://host:port/ws or courier://host:port")
	httpAddr := flag.String("http", "127.0.0.1:7480", "the server's management address (for pprof)")
	pid := flag.Int("pid", 0, "the server's process id (for its RSS)")
	settle := flag.Duration("settle", 3*time.Second, "wait after the last connection before reading")
	heartbeat := flag.Duration("heartbeat", 0, "heartbeat interval the clients ask for (0: the server's); with thousands of clients in one process on a loaded machine, a long one (and the server's --heartbeat) keeps them from missing heartbeats")
	flag.Parse()
	if *url == "" || *pid == 0 {
		log.Fatal("connmem: give --url and --pid")
	}
	ctx := context.Background()
	before, err := read(*httpAddr, *pid)
	if err != nil {
		log.Fatal(err)
	}
	var reconnects atomic.Int64
	conns, err := open(ctx, *url, *n, *heartbeat, &reconnects)
	if err != nil {
		log.Fatal(err)
	}
	time.Sleep(*settle)
	after, err := read(*httpAddr, *pid)
	if err != nil {
		log.Fatal(err)
	}
	per := func(a, b int) float64 { return float64(a-b) / float64(*n) / 1024 }
	fmt.Printf("%s, %d connections (%d reconnected meanwhile)\n", *url, *n, reconnects.Load())
	fmt.Printf("before: RSS %d KB, heap %d KB, stacks %d KB, %d goroutines\n", before.rssKB, before.heap>>10, before.stack>>10, before.goroutines)
	fmt.Printf("after:  RSS %d KB, heap %d KB, stacks %d KB, %d goroutines\n", after.rssKB, after.heap>>10, after.stack>>10, after.goroutines)
	fmt.Printf("per connection: RSS %.1f KB, heap %.1f KB, stacks %.1f KB, %.2f goroutines\n",
		per(after.rssKB*1024, before.rssKB*1024), per(after.heap, before.heap), per(after.stack, before.stack),
		float64(after.goroutines-before.goroutines)/float64(*n))
	for _, c := range conns {
		c.Close()
	}
}

// open opens n connections, each subscribed, 16 at a time.
func open(ctx context.Context, url string, n int, heartbeat time.Duration, reconnects *atomic.Int64) ([]*courier.Conn, error) {
	conns := make([]*courier.Conn, n)
	errs := make([]error, n)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := client.Dial(ctx, url, client.Options{
				Name: fmt.Sprint("connmem-", i), Log: quiet, Heartbeat: heartbeat,
				OnConnEvent: func(e courier.ConnEvent) {
					if e.Kind == courier.ConnDisconnected {
						reconnects.Add(1)
					}
				},
			})
			if err != nil {
				errs[i] = err
				return
			}
			conns[i] = c
			ps, err := c.PubSub(ctx, fmt.Sprintf("connmem.%d", i%20))
			if err == nil {
				_, err = ps.Subscribe(ctx, "msg", func(*courier.Delivery) {})
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
	}
	return conns, nil
}

// read reads the server's figures, after two forced GCs.
func read(httpAddr string, pid int) (figures, error) {
	var f figures
	for range 2 {
		if _, err := get(httpAddr, "/debug/pprof/heap?gc=1"); err != nil {
			return f, err
		}
	}
	heap, err := get(httpAddr, "/debug/pprof/heap?debug=1")
	if err != nil {
		return f, err
	}
	gs, err := get(httpAddr, "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return f, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return f, err
	}
	f.rssKB = find(`VmRSS:\s+(\d+) kB`, status)
	f.heap = find(`# HeapInuse = (\d+)`, heap)
	f.stack = find(`# Stack = (\d+)`, heap)
	f.goroutines = find(`goroutine profile: total (\d+)`, gs)
	return f, nil
}

func get(httpAddr, path string) ([]byte, error) {
	resp, err := http.Get("http://" + httpAddr + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// find returns the number the first group of re matches in p, or -1.
func find(re string, p []byte) int {
	m := regexp.MustCompile(re).FindSubmatch(p)
	if m == nil {
		return -1
	}
	v, _ := strconv.Atoi(string(m[1]))
	return v
}
