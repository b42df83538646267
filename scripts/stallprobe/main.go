// Command stallprobe measures what a client that stops reading costs
// everyone else, against a running server: how long until the server
// cuts it, and the rates and latencies of well-behaved clients before,
// during and after.
//
//	go run ./cmd/courier server &
//	go run ./scripts/stallprobe --scenario subscriber
//	go run ./scripts/stallprobe --scenario handler
//
// subscriber: a publisher floods a pub-sub exchange with 1 KiB messages
// to a healthy subscriber; then a client attaches as a subscriber and
// never reads again. handler: one connection requests from a healthy
// echo exchange, one request at a time, while 64 of its goroutines
// flood an exchange whose only handler never reads. With --silent the
// stalled client sends nothing either (the heartbeat timeout applies);
// without, it keeps sending PINGs (only the slow-consumer timeout
// applies).
//
// The subscriber scenario also runs against NATS and RabbitMQ, for
// comparison (see peers.go):
//
//	scripts/peers.sh start   # NATS_MONITOR_PORT=8222 for /connz
//	go run ./scripts/stallprobe --target nats://127.0.0.1:4222
//	go run ./scripts/stallprobe --target amqp://guest:guest@127.0.0.1:5672/
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/wire"
)

func main() {
	url := flag.String("url", "courier://127.0.0.1:7400", "server URL")
	target := flag.String("target", "", "server URL, overriding --url; nats://... or amqp://... runs the subscriber scenario on that broker")
	monitor := flag.String("monitor", "http://127.0.0.1:8222", "NATS monitoring base URL (/connz, /varz)")
	wait := flag.Duration("wait", 2*time.Minute, "NATS, RabbitMQ: how long to wait for the broker to cut the stalled client")
	api := flag.String("http", "http://127.0.0.1:7480", "management API base URL")
	scenario := flag.String("scenario", "subscriber", "subscriber or handler")
	silent := flag.Bool("silent", false, "the stalled client sends nothing at all")
	phase := flag.Duration("phase", 3*time.Second, "how long to measure before the stall and after the cut")
	flag.Parse()
	var err error
	if *target != "" {
		*url = *target
	}
	switch {
	case strings.HasPrefix(*url, "nats://"), strings.HasPrefix(*url, "amqp://"):
		if *scenario != "subscriber" {
			err = fmt.Errorf("scenario %q runs on Courier only", *scenario)
			break
		}
		err = runPeer(*url, *monitor, *silent, *phase, *wait)
	default:
		err = run(*url, *api, *scenario, *silent, *phase)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stallprobe:", err)
		os.Exit(1)
	}
}

// probe counts what the well-behaved clients get done, by phase.
type probe struct {
	mu      sync.Mutex
	phase   string
	ops     map[string]int64           // by phase
	lat     map[string][]time.Duration // by phase
	started map[string]time.Time
	ended   map[string]time.Time
	pubs    map[string]int64         // the publisher's calls, by phase
	pubMax  map[string]time.Duration // its longest call, by phase
}

func newProbe() *probe {
	return &probe{ops: map[string]int64{}, lat: map[string][]time.Duration{}, started: map[string]time.Time{}, ended: map[string]time.Time{},
		pubs: map[string]int64{}, pubMax: map[string]time.Duration{}}
}

func (p *probe) enter(phase string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.phase != "" {
		p.ended[p.phase] = now
	}
	p.phase = phase
	p.started[phase] = now
}

func (p *probe) op(lat time.Duration) {
	p.mu.Lock()
	p.ops[p.phase]++
	if lat > 0 {
		p.lat[p.phase] = append(p.lat[p.phase], lat)
	}
	p.mu.Unlock()
}

// pub counts one publish call that took d (the publisher in the
// subscriber scenario).
func (p *probe) pub(d time.Duration) {
	p.mu.Lock()
	p.pubs[p.phase]++
	p.pubMax[p.phase] = max(p.pubMax[p.phase], d)
	p.mu.Unlock()
}

// since is how long the current phase has lasted, and its name.
func (p *probe) since() (string, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.phase, time.Since(p.started[p.phase])
}

// event prints a line stamped with the phase and the time into it.
func (p *probe) event(format string, args ...any) {
	ph, d := p.since()
	fmt.Printf("[%s +%.1fs] %s\n", ph, d.Seconds(), fmt.Sprintf(format, args...))
}

func (p *probe) report(what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ended[p.phase] = time.Now()
	for _, ph := range []string{"before", "during", "after"} {
		d := p.ended[ph].Sub(p.started[ph])
		line := fmt.Sprintf("%-6s %6.1fs  %s %9.0f/s", ph, d.Seconds(), what, float64(p.ops[ph])/d.Seconds())
		if l := p.lat[ph]; len(l) > 0 {
			slices.Sort(l)
			line += fmt.Sprintf("  latency p50 %v p99 %v max %v", l[len(l)/2].Round(time.Microsecond),
				l[len(l)*99/100].Round(time.Microsecond), l[len(l)-1].Round(time.Microsecond))
		}
		fmt.Println(line)
	}
	for _, ph := range []string{"before", "during", "after"} {
		if n := p.pubs[ph]; n > 0 {
			d := p.ended[ph].Sub(p.started[ph])
			fmt.Printf("%-6s %6.1fs  publisher sent %9.0f/s  longest publish call %v\n", ph, d.Seconds(),
				float64(n)/d.Seconds(), p.pubMax[ph].Round(time.Microsecond))
		}
	}
}

func run(url, api, scenario string, silent bool, phase time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := newProbe()
	p.enter("before")
	var exchange string
	var stop func()
	var err error
	switch scenario {
	case "subscriber":
		exchange = "stallprobe.feed"
		stop, err = subscriberLoad(ctx, url, exchange, p)
	case "handler":
		exchange = "stallprobe.stuck"
		stop, err = handlerLoad(ctx, url, exchange, p)
	default:
		return fmt.Errorf("unknown scenario %q", scenario)
	}
	if err != nil {
		return err
	}
	defer stop()
	time.Sleep(phase)

	role := uint64(wire.RoleSubscriber)
	spec := wire.AttachSpec{Patterns: []string{"#"}}
	if scenario == "handler" {
		role, spec = wire.RoleHandler, wire.AttachSpec{}
	}
	nc, err := stalled(url, "stallprobe-stalled", exchange, role, spec, silent)
	if err != nil {
		return err
	}
	defer nc.Close()
	attached := time.Now()
	p.enter("during")
	var firstBlocked time.Time
	for {
		if time.Since(attached) > 2*time.Minute {
			return fmt.Errorf("the stalled client was not cut within 2 minutes")
		}
		pending, blocked, present, err := sendState(api, "stallprobe-stalled")
		if err != nil {
			return err
		}
		if !present {
			break
		}
		if blocked > 0 && firstBlocked.IsZero() {
			firstBlocked = time.Now().Add(-blocked)
			fmt.Printf("server's write to the stalled client blocked %.1fs after it attached (%d bytes more pending)\n",
				firstBlocked.Sub(attached).Seconds(), pending)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cut := time.Now()
	p.enter("after")
	fmt.Printf("stalled client cut %.2fs after it attached", cut.Sub(attached).Seconds())
	if !firstBlocked.IsZero() {
		fmt.Printf(", %.2fs after the server's write to it blocked", cut.Sub(firstBlocked).Seconds())
	}
	fmt.Println()
	time.Sleep(phase)
	stop()
	p.report(map[string]string{"subscriber": "healthy subscriber got", "handler": "healthy requests"}[scenario])
	return nil
}

// subscriberLoad floods exchange from a publisher to a healthy
// subscriber, counting the subscriber's deliveries.
func subscriberLoad(ctx context.Context, url, exchange string, p *probe) (func(), error) {
	pc, err := client.Dial(ctx, url, client.Options{Name: "stallprobe-publisher"})
	if err != nil {
		return nil, err
	}
	sc, err := client.Dial(ctx, url, client.Options{Name: "stallprobe-subscriber"})
	if err != nil {
		return nil, err
	}
	sx, err := sc.PubSub(ctx, exchange)
	if err != nil {
		return nil, err
	}
	if _, err := sx.Subscribe(ctx, "#", func(*courier.Delivery) { p.op(0) }); err != nil {
		return nil, err
	}
	px, err := pc.PubSub(ctx, exchange)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		body := make([]byte, 1024)
		for {
			select {
			case <-done:
				return
			default:
			}
			start := time.Now()
			if err := px.Publish(ctx, "k", body); err != nil {
				return
			}
			p.pub(time.Since(start))
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(done); wg.Wait(); pc.Close(); sc.Close() })
	}, nil
}

// handlerLoad has one connection request from a healthy echo exchange,
// one request at a time, timing each; and flood exchange from 64 of its
// goroutines, each giving up after 250 ms and sending another.
func handlerLoad(ctx context.Context, url, exchange string, p *probe) (func(), error) {
	hc, err := client.Dial(ctx, url, client.Options{Name: "stallprobe-echo"})
	if err != nil {
		return nil, err
	}
	echo, err := hc.ReqResp(ctx, "stallprobe.echo", courier.RoundRobin)
	if err != nil {
		return nil, err
	}
	if _, err := echo.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
		return nil, err
	}
	rc, err := client.Dial(ctx, url, client.Options{Name: "stallprobe-requester"})
	if err != nil {
		return nil, err
	}
	fast, err := rc.ReqResp(ctx, "stallprobe.echo")
	if err != nil {
		return nil, err
	}
	stuck, err := rc.ReqResp(ctx, exchange, courier.RoundRobin)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var flooding atomic.Bool
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			start := time.Now()
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := fast.Request(rctx, courier.Message{Body: []byte("ping")})
			cancel()
			if err != nil {
				fmt.Println("healthy request failed:", err)
				continue
			}
			p.op(time.Since(start))
		}
	})
	for range 64 {
		wg.Go(func() {
			body := make([]byte, 32<<10)
			for {
				select {
				case <-done:
					return
				default:
				}
				if !flooding.Load() {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				rctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
				_, err := stuck.Request(rctx, courier.Message{Body: body})
				cancel()
				if errors.Is(err, courier.ErrNoHandler) {
					// The stalled handler was cut: the flood is over, and
					// "after" measures the requester alone again.
					return
				}
				if err != nil {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	// The flood starts with the stalled handler (nothing to request
	// from before it).
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if ex := stuckHasHandler(ctx, rc, exchange); ex {
				flooding.Store(true)
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(done); wg.Wait(); rc.Close(); hc.Close() })
	}, nil
}

func stuckHasHandler(ctx context.Context, c *courier.Conn, exchange string) bool {
	list, err := c.Exchanges(ctx)
	if err != nil {
		return false
	}
	for _, e := range list {
		if e.Name == exchange && len(e.Members) > 0 {
			return true
		}
	}
	return false
}

// stalled connects a client with a small receive buffer, attaches it,
// and from then on reads nothing; unless silent, it sends a PING every
// 200 ms.
func stalled(url, name, exchange string, role uint64, spec wire.AttachSpec, silent bool) (net.Conn, error) {
	addr, _, err := client.ParseURL(url)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		rc.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return err
	}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	r := wire.NewReader(nc, 1<<22)
	send := func(f *wire.Frame) error {
		p, err := wire.AppendFrame(nil, f, 0)
		if err == nil {
			_, err = nc.Write(p)
		}
		return err
	}
	hello, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, Name: name})
	body, _ := json.Marshal(spec)
	if err := send(&wire.Frame{Type: wire.TypeHello, Body: hello}); err != nil {
		return nil, err
	}
	if err := send(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: exchange, Aux: role, Body: body}); err != nil {
		return nil, err
	}
	for {
		var f wire.Frame
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if err := r.Next(&f); err != nil {
			return nil, fmt.Errorf("stalled client: %w", err)
		}
		if f.Type == wire.TypeOK {
			break
		}
		if f.Type == wire.TypeError {
			return nil, fmt.Errorf("stalled client: attach: %s", f.Tag)
		}
	}
	if !silent {
		go func() {
			ping, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypePing, Ref: 1}, 0)
			for {
				time.Sleep(200 * time.Millisecond)
				if _, err := nc.Write(ping); err != nil {
					return
				}
			}
		}()
	}
	return nc, nil
}

// sendState reads the named connection's send queue from the API.
func sendState(api, name string) (pending int64, blocked time.Duration, present bool, err error) {
	resp, err := http.Get(api + "/api/connections?columns=name,send_pending,send_blocked_ms")
	if err != nil {
		return 0, 0, false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, false, err
	}
	var list []struct {
		Name    string `json:"name"`
		Pending int64  `json:"send_pending"`
		Blocked int64  `json:"send_blocked_ms"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return 0, 0, false, fmt.Errorf("/api/connections: %w: %.200s", err, body)
	}
	for _, c := range list {
		if c.Name == name {
			return c.Pending, time.Duration(c.Blocked) * time.Millisecond, true, nil
		}
	}
	return 0, 0, false, nil
}
