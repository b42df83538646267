package main

// The subscriber scenario against NATS and RabbitMQ, for comparison with
// Courier. Same load (one publisher flooding 1 KiB messages, one healthy
// subscriber), same stalled client (a TCP socket with a 4 KiB SO_RCVBUF
// that stops being read once subscribed; unless --silent, it keeps
// writing), same phases and lines. What differs is how the cut is seen:
//
//   - NATS: the stalled client is a raw socket speaking the text
//     protocol (CONNECT, SUB, then a PING every 200 ms and no reads,
//     nothing answered). Cut = its connection gone from /connz on the
//     monitoring port (nats-server -m, NATS_MONITOR_PORT=8222 with
//     peers.sh); the reason comes from /connz?state=closed and the
//     slow_consumers counter of /varz. Without monitoring, our socket's
//     TCP state (a reset) is all there is.
//   - RabbitMQ: a fanout exchange bound to two auto-delete, non-durable
//     queues, one per subscriber, consumed with autoAck (no prefetch
//     limit: the broker pushes as fast as the socket takes them;
//     messages are transient). The stalled consumer is a real amqp091-go
//     connection of its own whose net.Conn stops returning from Read once
//     basic.consume-ok is in: neither the library nor the application
//     reads a byte more, so the broker's writes to it back up in TCP as
//     with the raw clients; the library's heartbeats still go out (with
//     --silent, Write blocks too). Cut = our socket reset or closed (TCP
//     state; RabbitMQ closes with linger 0) or its queue losing its
//     consumer, whichever is seen first; until then the stalled queue's
//     depth is printed every 5 s.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nats-io/nats.go"
)

const (
	peerSubject  = "stallprobe.feed"
	stalledName  = "stallprobe-stalled"
	healthyQueue = "stallprobe.healthy"
	stalledQueue = "stallprobe.stalled"
)

// peer is one broker's side of the scenario.
type peer struct {
	// attach connects the stalled client and returns once it is
	// subscribed; from then on it reads nothing.
	attach func(silent bool) error
	// watch tells whether the stalled client is still connected, and
	// if not, when it was cut if known more precisely than now.
	watch func() (present bool, at time.Time, err error)
	// state is a line on the stalled client for the progress reports.
	state func() string
	// cut describes how the cut was seen and why the broker made it.
	cut func(attached time.Time) string
	// drop closes the stalled client, if the broker did not.
	drop func()
	// stop ends the load and closes everything.
	stop func()
}

// runPeer runs the subscriber scenario on NATS or RabbitMQ: the same
// phases as run, but the cut is watched the broker's way, and if the
// broker does not cut the stalled client within wait, stallprobe closes
// it itself and says so.
func runPeer(url, monitor string, silent bool, phase, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute+wait)
	defer cancel()
	p := newProbe()
	p.enter("before")
	var pr *peer
	var err error
	if strings.HasPrefix(url, "nats://") {
		pr, err = natsPeer(ctx, url, monitor, p)
	} else {
		pr, err = amqpPeer(ctx, url, p)
	}
	if err != nil {
		return err
	}
	defer pr.stop()
	time.Sleep(phase)

	if err := pr.attach(silent); err != nil {
		return err
	}
	attached := time.Now()
	p.enter("during")
	lastReport := attached
	present := true
	var end time.Time
	for time.Since(attached) < wait {
		if present, end, err = pr.watch(); err != nil {
			return err
		}
		if !present {
			break
		}
		if time.Since(lastReport) >= 5*time.Second {
			lastReport = time.Now()
			p.event("stalled client still connected: %s", pr.state())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if end.IsZero() {
		end = time.Now()
	}
	if present {
		fmt.Printf("stalled client NOT cut within %.0fs after it attached (%s); stallprobe closes it\n", wait.Seconds(), pr.state())
		pr.drop()
		p.enter("after")
	} else {
		p.enter("after")
		fmt.Printf("stalled client cut %.2fs after it attached: %s\n", end.Sub(attached).Seconds(), pr.cut(attached))
	}
	time.Sleep(phase)
	pr.stop()
	p.report("healthy subscriber got")
	return nil
}

// tcpWatch polls the TCP state of our end of a connection every 5 ms
// and keeps when it left ESTABLISHED.
type tcpWatch struct {
	mu    sync.Mutex
	at    time.Time
	state string
}

func watchTCP(c net.Conn, done <-chan struct{}) *tcpWatch {
	w := &tcpWatch{state: "ESTABLISHED"}
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if s := tcpState(c); s != "ESTABLISHED" {
				w.mu.Lock()
				w.at, w.state = time.Now(), s
				w.mu.Unlock()
				return
			}
		}
	}()
	return w
}

// changed returns when the state left ESTABLISHED (zero if not yet) and
// the state then.
func (w *tcpWatch) changed() (time.Time, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at, w.state
}

// describe says what became of the socket, relative to attached.
func (w *tcpWatch) describe(attached time.Time) string {
	at, s := w.changed()
	if at.IsZero() {
		return "our socket still ESTABLISHED"
	}
	return fmt.Sprintf("our socket went %s at +%.2fs", s, at.Sub(attached).Seconds())
}

// smallBufDial dials addr with a 4 KiB receive buffer, as the Courier
// stalled client does.
func smallBufDial(addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		rc.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		return err
	}}
	return d.Dial("tcp", addr)
}

// pinger writes msg every 200 ms until the write fails or done closes.
func pinger(c net.Conn, msg []byte, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-time.After(200 * time.Millisecond):
		}
		if _, err := c.Write(msg); err != nil {
			return
		}
	}
}

// natsPeer floods peerSubject from one nats.go connection to a healthy
// subscriber on another.
func natsPeer(ctx context.Context, url, monitor string, p *probe) (*peer, error) {
	var dropped atomic.Int64
	opts := func(name string) []nats.Option {
		return []nats.Option{
			nats.Name(name),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				if errors.Is(err, nats.ErrSlowConsumer) {
					// Once per burst: the client counts the drops.
					if dropped.Add(1) == 1 {
						p.event("%s: %v (client-side pending limit; messages dropped)", name, err)
					}
					return
				}
				p.event("%s: %v", name, err)
			}),
			nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
				if err != nil { // nil: closed by stallprobe
					p.event("%s disconnected: %v", name, err)
				}
			}),
			nats.ReconnectHandler(func(*nats.Conn) { p.event("%s reconnected", name) }),
		}
	}
	pc, err := nats.Connect(url, opts("stallprobe-publisher")...)
	if err != nil {
		return nil, err
	}
	sc, err := nats.Connect(url, opts("stallprobe-subscriber")...)
	if err != nil {
		pc.Close()
		return nil, err
	}
	sub, err := sc.Subscribe(peerSubject, func(*nats.Msg) { p.op(0) })
	if err != nil {
		return nil, err
	}
	if err := sc.Flush(); err != nil {
		return nil, err
	}
	var monitorOK bool
	var slowBefore int64
	if v, err := natsVarz(monitor); err == nil {
		monitorOK, slowBefore = true, v.SlowConsumers
		fmt.Printf("nats-server %s, write_deadline %v, max_pending %d bytes (monitoring on %s)\n",
			v.Version, time.Duration(v.WriteDeadline), v.MaxPending, monitor)
	} else {
		fmt.Printf("no NATS monitoring at %s (%v): the cut is seen only when our socket is reset\n", monitor, err)
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
			if err := pc.Publish(peerSubject, body); err != nil {
				p.event("publish: %v", err)
				time.Sleep(10 * time.Millisecond)
				continue
			}
			p.pub(time.Since(start))
		}
	})

	var stalled net.Conn
	var stalledPort int
	var tw *tcpWatch
	stalledDone := make(chan struct{})
	var closeOnce sync.Once
	closeStalled := func() {
		closeOnce.Do(func() {
			close(stalledDone)
			if stalled != nil {
				stalled.Close()
			}
		})
	}
	pr := &peer{drop: closeStalled}
	pr.attach = func(silent bool) error {
		addr := strings.TrimPrefix(url, "nats://")
		if i := strings.LastIndex(addr, "@"); i >= 0 {
			addr = addr[i+1:]
		}
		c, err := smallBufDial(addr)
		if err != nil {
			return err
		}
		stalled = c
		stalledPort = c.LocalAddr().(*net.TCPAddr).Port
		r := bufio.NewReader(c)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
			return fmt.Errorf("stalled client: expected INFO, got %q: %v", line, err)
		}
		// The PING's PONG says the SUB is in place.
		if _, err := fmt.Fprintf(c, "CONNECT {\"verbose\":false,\"pedantic\":false,\"name\":%q}\r\nSUB %s 1\r\nPING\r\n",
			stalledName, peerSubject); err != nil {
			return err
		}
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return fmt.Errorf("stalled client: %w", err)
			}
			if strings.HasPrefix(line, "-ERR") {
				return fmt.Errorf("stalled client: %s", strings.TrimSpace(line))
			}
			if line == "PONG\r\n" {
				break
			}
		}
		c.SetDeadline(time.Time{})
		tw = watchTCP(c, stalledDone)
		if !silent {
			go pinger(c, []byte("PING\r\n"), stalledDone)
		}
		return nil
	}
	var state string
	pr.watch = func() (bool, time.Time, error) {
		if !monitorOK {
			at, tcp := tw.changed()
			state = "TCP " + tcp
			return at.IsZero(), at, nil
		}
		list, err := natsConnz(monitor, "open")
		if err != nil {
			return false, time.Time{}, err
		}
		for _, c := range list {
			if c.Port == stalledPort {
				state = fmt.Sprintf("pending_bytes %d, out_msgs %d, TCP %s", c.PendingBytes, c.OutMsgs, tcpState(stalled))
				return true, time.Time{}, nil
			}
		}
		return false, time.Time{}, nil
	}
	pr.state = func() string { return state }
	pr.cut = func(attached time.Time) string {
		if !monitorOK {
			return "seen by " + tw.describe(attached)
		}
		time.Sleep(500 * time.Millisecond) // for the socket's state to follow
		via := "seen gone from /connz (" + tw.describe(attached) + ")"
		reason := "reason not in /connz?state=closed"
		if list, err := natsConnz(monitor, "closed"); err == nil {
			for _, c := range list {
				if c.Port == stalledPort {
					reason = fmt.Sprintf("reason %q after %d messages out", c.Reason, c.OutMsgs)
				}
			}
		}
		if v, err := natsVarz(monitor); err == nil {
			reason += fmt.Sprintf(", /varz slow_consumers +%d", v.SlowConsumers-slowBefore)
		}
		return via + "; " + reason
	}
	var once sync.Once
	pr.stop = func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			closeStalled()
			pend, _, _ := sub.Pending()
			if n := dropped.Load(); n > 0 {
				fmt.Printf("healthy subscriber: %d slow-consumer reports from the nats.go client, %d messages dropped by it\n", n, mustDropped(sub))
			}
			fmt.Printf("healthy subscriber: %d messages still pending in the client at the end\n", pend)
			pc.Close()
			sc.Close()
		})
	}
	return pr, nil
}

func mustDropped(s *nats.Subscription) int {
	n, _ := s.Dropped()
	return n
}

type natsConn struct {
	Port         int    `json:"port"`
	Name         string `json:"name"`
	PendingBytes int64  `json:"pending_bytes"`
	OutMsgs      int64  `json:"out_msgs"`
	Reason       string `json:"reason"`
}

func natsConnz(monitor, state string) ([]natsConn, error) {
	var z struct {
		Connections []natsConn `json:"connections"`
	}
	err := getJSON(monitor+"/connz?limit=4096&state="+state, &z)
	return z.Connections, err
}

type natsVarzInfo struct {
	Version       string `json:"version"`
	SlowConsumers int64  `json:"slow_consumers"`
	WriteDeadline int64  `json:"write_deadline"` // ns
	MaxPending    int64  `json:"max_pending"`
}

func natsVarz(monitor string) (natsVarzInfo, error) {
	var v natsVarzInfo
	err := getJSON(monitor+"/varz", &v)
	return v, err
}

func getJSON(url string, v any) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %.200s", url, resp.Status, body)
	}
	return json.Unmarshal(body, v)
}

// gatedConn is the stalled AMQP consumer's socket: once stopReads is
// set, Read never returns again (until release closes), so nothing more
// is read from the socket; with stopWrites, Write does the same.
type gatedConn struct {
	net.Conn
	stopReads, stopWrites atomic.Bool
	release               chan struct{}
}

func (g *gatedConn) Read(b []byte) (int, error) {
	if g.stopReads.Load() {
		<-g.release
		return 0, net.ErrClosed
	}
	return g.Conn.Read(b)
}

func (g *gatedConn) Write(b []byte) (int, error) {
	if g.stopWrites.Load() {
		<-g.release
		return 0, net.ErrClosed
	}
	return g.Conn.Write(b)
}

// amqpPeer floods a fanout exchange from one amqp091 connection; a
// healthy consumer reads its own queue on another.
func amqpPeer(ctx context.Context, url string, p *probe) (*peer, error) {
	connect := func(name string, cfg amqp.Config) (*amqp.Connection, error) {
		cfg.Properties = amqp.NewConnectionProperties()
		cfg.Properties.SetClientConnectionName(name)
		if cfg.Heartbeat == 0 {
			cfg.Heartbeat = 10 * time.Second
		}
		c, err := amqp.DialConfig(url, cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		blocked := c.NotifyBlocked(make(chan amqp.Blocking, 16))
		go func() {
			for b := range blocked {
				if b.Active {
					p.event("%s blocked by the broker: %s", name, b.Reason)
				} else {
					p.event("%s unblocked", name)
				}
			}
		}()
		if name != stalledName { // stallprobe closes its socket under it
			closed := c.NotifyClose(make(chan *amqp.Error, 1))
			go func() {
				if err := <-closed; err != nil {
					p.event("%s closed: %v", name, err)
				}
			}()
		}
		return c, nil
	}
	// The monitor connection declares, inspects and deletes.
	mc, err := connect("stallprobe-monitor", amqp.Config{})
	if err != nil {
		return nil, err
	}
	mch, err := mc.Channel()
	if err != nil {
		return nil, err
	}
	mch.QueueDelete(healthyQueue, false, false, false)
	mch.QueueDelete(stalledQueue, false, false, false)
	if err := mch.ExchangeDeclare(peerSubject, "fanout", false, true, false, false, nil); err != nil {
		return nil, err
	}
	declare := func(q string) error {
		if _, err := mch.QueueDeclare(q, false, true, false, false, nil); err != nil {
			return err
		}
		return mch.QueueBind(q, "", peerSubject, false, nil)
	}
	if err := declare(healthyQueue); err != nil {
		return nil, err
	}
	sc, err := connect("stallprobe-subscriber", amqp.Config{})
	if err != nil {
		return nil, err
	}
	sch, err := sc.Channel()
	if err != nil {
		return nil, err
	}
	deliveries, err := sch.Consume(healthyQueue, "", true, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	go func() {
		for range deliveries {
			p.op(0)
		}
	}()
	pc, err := connect("stallprobe-publisher", amqp.Config{})
	if err != nil {
		return nil, err
	}
	pch, err := pc.Channel()
	if err != nil {
		return nil, err
	}
	fmt.Printf("rabbitmq-server %v\n", mc.Properties["version"])

	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		msg := amqp.Publishing{Body: make([]byte, 1024)}
		for {
			select {
			case <-done:
				return
			default:
			}
			start := time.Now()
			if err := pch.PublishWithContext(ctx, peerSubject, "k", false, false, msg); err != nil {
				p.event("publish: %v", err)
				return
			}
			p.pub(time.Since(start))
		}
	})

	var gate *gatedConn
	var stalledConn *amqp.Connection
	var tw *tcpWatch
	stalledDone := make(chan struct{})
	var closeOnce sync.Once
	closeStalled := func() {
		closeOnce.Do(func() {
			close(stalledDone)
			if gate != nil {
				close(gate.release)
				gate.Conn.Close()
			}
		})
	}
	// queueState reads a queue's depth and consumers; a queue that is
	// gone (auto-deleted) reads as found == false.
	queueState := func(name string) (q amqp.Queue, found bool, err error) {
		q, err = mch.QueueDeclarePassive(name, false, true, false, false, nil)
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			mch, err = mc.Channel() // the failed declare closed the channel
			return q, false, err
		}
		return q, err == nil, err
	}
	pr := &peer{drop: closeStalled}
	pr.attach = func(silent bool) error {
		if err := declare(stalledQueue); err != nil {
			return err
		}
		c, err := connect(stalledName, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
			nc, err := smallBufDial(addr)
			if err != nil {
				return nil, err
			}
			gate = &gatedConn{Conn: nc, release: make(chan struct{})}
			return gate, nil
		}})
		if err != nil {
			return err
		}
		stalledConn = c
		ch, err := c.Channel()
		if err != nil {
			return err
		}
		if _, err := ch.Consume(stalledQueue, "", true, false, false, false, nil); err != nil {
			return err
		}
		gate.stopReads.Store(true)
		if silent {
			gate.stopWrites.Store(true)
		}
		tw = watchTCP(gate.Conn, stalledDone)
		return nil
	}
	var via string
	var lastQueueCheck time.Time
	pr.watch = func() (bool, time.Time, error) {
		if at, tcp := tw.changed(); !at.IsZero() {
			via = "seen by our socket going " + tcp
			return false, at, nil
		}
		// A queue.declare is a round trip to a busy broker: not too often.
		if time.Since(lastQueueCheck) < 250*time.Millisecond {
			return true, time.Time{}, nil
		}
		lastQueueCheck = time.Now()
		q, found, err := queueState(stalledQueue)
		if err != nil {
			return false, time.Time{}, err
		}
		if !found || q.Consumers == 0 {
			via = "seen by the stalled queue losing its consumer"
			return false, time.Time{}, nil
		}
		return true, time.Time{}, nil
	}
	pr.state = func() string {
		q, _, _ := queueState(stalledQueue)
		h, _, _ := queueState(healthyQueue)
		return fmt.Sprintf("stalled queue %d ready, %d consumer(s); healthy queue %d ready; TCP %s",
			q.Messages, q.Consumers, h.Messages, tcpState(gate.Conn))
	}
	pr.cut = func(attached time.Time) string {
		s := via + " (" + tw.describe(attached) + ")"
		if q, found, err := queueState(stalledQueue); err == nil {
			if found {
				s += fmt.Sprintf("; stalled queue now %d ready, %d consumer(s)", q.Messages, q.Consumers)
			} else {
				s += "; stalled queue auto-deleted"
			}
		}
		if stalledConn.IsClosed() {
			s += "; the client library saw the connection close"
		}
		return s
	}
	var once sync.Once
	pr.stop = func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			closeStalled()
			if h, found, err := queueState(healthyQueue); err == nil && found {
				fmt.Printf("healthy queue: %d messages still ready at the end\n", h.Messages)
			}
			pc.Close()
			sc.Close()
			mch.QueueDelete(healthyQueue, false, false, false)
			mch.QueueDelete(stalledQueue, false, false, false)
			mch.ExchangeDelete(peerSubject, false, false)
			mc.Close()
		})
	}
	return pr, nil
}
