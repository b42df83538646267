package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/node"
)

// courierDriver runs scenarios on an embedded node or over TCP against a
// Courier server; the scenario code is the same, only the Conns differ.
type courierDriver struct {
	cfg     *Config
	node    *node.Node // nil for a server
	nodeB   *node.Node // the handlers' node with EmbeddedCross, else nil
	tempDir string     // the embedded node's, removed at close

	mu      sync.Mutex // guards conns, reqConn, rr, pong, ps, asyncErr
	conns   []*courier.Conn
	reqConn *courier.Conn
	rr      *courier.ReqResp
	pong    []byte
	ps      string // the pub-sub exchange's name, once declared
	async   []string
	// lost counts the connections lost (and re-established by the
	// client) during the run, by cause: what was sent to them
	// meanwhile is lost, as pub-sub is at most once.
	lost      int
	lostCause map[string]int
}

var _ driver = (*courierDriver)(nil)

func newCourierDriver(ctx context.Context, cfg *Config) (*courierDriver, error) {
	d := &courierDriver{cfg: cfg}
	if cfg.Target.Kind != KindEmbedded {
		return d, nil
	}
	dir := cfg.DataDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "courier-bench-"); err != nil {
			return nil, fmt.Errorf("bench: embedded node: %w", err)
		}
		d.tempDir = dir
	}
	if cfg.EmbeddedCross {
		if err := d.startPair(ctx, dir); err != nil {
			d.close()
			return nil, err
		}
		return d, nil
	}
	nc := node.Config{Name: "bench", DataDir: dir, Log: cfg.Log, HTTP: cfg.embeddedHTTP}
	if cfg.Users.WS {
		// The WebSocket endpoint needs both listeners.
		nc.Listen = "127.0.0.1:0"
		if nc.HTTP == "" {
			nc.HTTP = "127.0.0.1:0"
		}
	}
	n, err := node.Start(nc)
	if err != nil {
		d.close()
		return nil, fmt.Errorf("bench: embedded node: %w", err)
	}
	d.node = n
	return d, nil
}

// pairTimeout bounds how long two embedded nodes take to form a cluster.
const pairTimeout = 60 * time.Second

// startPair starts two embedded nodes, bench-a and bench-b, as a
// cluster on loopback (each with its data under dir), and waits until
// each lists the other alive with its links up and knows the metadata
// group's leader. The requesters use bench-a, the handlers bench-b.
func (d *courierDriver) startPair(ctx context.Context, dir string) error {
	a, err := node.Start(node.Config{Name: "bench-a", DataDir: filepath.Join(dir, "a"), Log: d.cfg.Log, HTTP: d.cfg.embeddedHTTP,
		Cluster: node.ClusterConfig{Listen: "127.0.0.1:0", BootstrapExpect: 2}})
	if err != nil {
		return fmt.Errorf("bench: embedded node bench-a: %w", err)
	}
	d.node = a
	b, err := node.Start(node.Config{Name: "bench-b", DataDir: filepath.Join(dir, "b"), Log: d.cfg.Log,
		Cluster: node.ClusterConfig{Listen: "127.0.0.1:0", Join: []string{a.ClusterAddr()}, BootstrapExpect: 2}})
	if err != nil {
		return fmt.Errorf("bench: embedded node bench-b: %w", err)
	}
	d.nodeB = b
	ctx, cancel := context.WithTimeout(ctx, pairTimeout)
	defer cancel()
	for !pairFormed(a) || !pairFormed(b) {
		sleepCtx(ctx, 20*time.Millisecond)
		if ctx.Err() != nil {
			return fmt.Errorf("bench: embedded nodes bench-a and bench-b did not form a cluster within %s", pairTimeout)
		}
	}
	return nil
}

// pairFormed reports whether n sees its peer alive with its links up,
// and knows the metadata group's leader.
func pairFormed(n *node.Node) bool {
	f, m := n.Fabric(), n.Meta()
	if f == nil || m == nil || m.Leader() == "" {
		return false
	}
	up := 0
	for _, p := range f.Members() {
		if !p.Self && p.State == "alive" && p.Link.Up {
			up++
		}
	}
	return up == 1
}

// connect opens a Conn to the target: in-process for an embedded node,
// else over TCP.
func (d *courierDriver) connect(ctx context.Context, name string) (*courier.Conn, error) {
	return d.connectTo(ctx, d.cfg.Target.URL, name)
}

// connectUser opens a simulated user's Conn: over WebSocket with
// Users.WS (even to an embedded node), else as connect does.
func (d *courierDriver) connectUser(ctx context.Context, name string) (*courier.Conn, error) {
	if !d.cfg.Users.WS {
		return d.connect(ctx, name)
	}
	u, err := d.wsURL()
	if err != nil {
		return nil, err
	}
	c, err := client.Dial(ctx, u, client.Options{Name: name, Log: d.cfg.Log})
	if err != nil {
		return nil, fmt.Errorf("bench: connect to %s: %w", redact(u), err)
	}
	return d.track(c, name), nil
}

// wsURL is the WebSocket endpoint users dial: Users.WSURL, else the
// embedded node's, else the target's host on the HTTP listener's
// default port, 7480.
func (d *courierDriver) wsURL() (string, error) {
	switch {
	case d.cfg.Users.WSURL != "":
		return d.cfg.Users.WSURL, nil
	case d.node != nil:
		if d.node.HTTPAddr() == nil {
			return "", fmt.Errorf("bench: the embedded node has no HTTP listener for WebSocket")
		}
		return "ws://" + d.node.HTTPAddr().String() + "/ws", nil
	}
	u, err := url.Parse(d.cfg.Target.URL)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("bench: no WebSocket URL for target %s: give one (--ws-url)", redact(d.cfg.Target.URL))
	}
	return "ws://" + net.JoinHostPort(u.Hostname(), "7480") + "/ws", nil
}

// handlerNode is the url connectTo takes for the second embedded node.
const handlerNode = "embedded:bench-b"

// connectTo opens a Conn to the server at url (another node of the
// target's cluster); in-process for an embedded node, whatever url.
func (d *courierDriver) connectTo(ctx context.Context, url, name string) (*courier.Conn, error) {
	var c *courier.Conn
	if d.nodeB != nil && url == handlerNode {
		c = d.nodeB.Connect()
	} else if d.node != nil {
		c = d.node.Connect()
	} else {
		var err error
		c, err = client.Dial(ctx, url, client.Options{Name: name, Log: d.cfg.Log})
		if err != nil {
			return nil, fmt.Errorf("bench: connect to %s: %w", redact(url), err)
		}
	}
	return d.track(c, name), nil
}

// track counts c's asynchronous errors and lost connections for the
// report, and closes it with the driver.
func (d *courierDriver) track(c *courier.Conn, name string) *courier.Conn {
	c.OnError(func(err error) {
		d.mu.Lock()
		if len(d.async) < 10 {
			d.async = append(d.async, fmt.Sprintf("%s: %v", name, err))
		}
		d.mu.Unlock()
	})
	c.OnConnEvent(func(ev courier.ConnEvent) {
		if ev.Kind != courier.ConnDisconnected {
			return
		}
		d.mu.Lock()
		d.lost++
		if d.lostCause == nil {
			d.lostCause = make(map[string]int)
		}
		if len(d.lostCause) < 10 {
			d.lostCause[lostCause(ev.Err)]++
		}
		d.mu.Unlock()
	})
	d.mu.Lock()
	d.conns = append(d.conns, c)
	d.mu.Unlock()
	return c
}

func (d *courierDriver) serve(ctx context.Context, n int, pong []byte) error {
	name := names("reqresp")
	for i := range n {
		url := d.cfg.handlerURL()
		if d.nodeB != nil {
			url = handlerNode
		}
		hc, err := d.connectTo(ctx, url, fmt.Sprintf("bench-handler-%d", i))
		if err != nil {
			return err
		}
		rr, err := hc.ReqResp(ctx, name, courier.RoundRobin)
		if err != nil {
			return fmt.Errorf("bench: declare %s: %w", name, err)
		}
		// The handler runs on its attachment's goroutine, one request at
		// a time, and answers at once.
		if _, err := rr.Handle(ctx, func(r *courier.Request) { r.Reply(pong) }); err != nil {
			return fmt.Errorf("bench: attach handler: %w", err)
		}
	}
	// One connection for all requesters.
	rc, err := d.connect(ctx, "bench-requesters")
	if err != nil {
		return err
	}
	rrq, err := rc.ReqResp(ctx, name, courier.RoundRobin)
	if err != nil {
		return fmt.Errorf("bench: open %s: %w", name, err)
	}
	d.mu.Lock()
	d.reqConn, d.rr, d.pong = rc, rrq, pong
	d.mu.Unlock()
	return nil
}

type courierRequester struct {
	rr   *courier.ReqResp
	pong []byte
}

func (d *courierDriver) requester(ctx context.Context) (requester, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rr == nil {
		return nil, errors.New("bench: requester before serve")
	}
	return &courierRequester{rr: d.rr, pong: d.pong}, nil
}

func (r *courierRequester) request(ctx context.Context, body []byte) error {
	resp, err := r.rr.Request(ctx, courier.Message{Body: body})
	if err != nil {
		return err
	}
	if !bytes.Equal(resp.Body, r.pong) {
		return fmt.Errorf("bench: unexpected response %.20q", resp.Body)
	}
	return nil
}

func (r *courierRequester) close() error { return nil }

func (d *courierDriver) subscribe(ctx context.Context, n int, fn func(int, []byte)) error {
	name := names("pubsub")
	// The first declares the exchange; the rest attach in parallel.
	err := forEach(ctx, n, func(i int) error {
		c, err := d.connectTo(ctx, d.cfg.subscriberURL(i), fmt.Sprintf("bench-sub-%d", i))
		if err != nil {
			return err
		}
		ps, err := c.PubSub(ctx, name)
		if err != nil {
			return fmt.Errorf("bench: declare %s: %w", name, err)
		}
		if _, err := ps.Subscribe(ctx, "bench", func(m *courier.Delivery) { fn(i, m.Body) }); err != nil {
			return fmt.Errorf("bench: subscribe: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.ps = name
	d.mu.Unlock()
	return nil
}

type courierPublisher struct {
	ps *courier.PubSub
}

func (d *courierDriver) publisher(ctx context.Context) (publisher, error) {
	d.mu.Lock()
	name := d.ps
	d.mu.Unlock()
	if name == "" {
		name = names("pubsub")
	}
	c, err := d.connect(ctx, "bench-publisher")
	if err != nil {
		return nil, err
	}
	ps, err := c.PubSub(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("bench: declare %s: %w", name, err)
	}
	return &courierPublisher{ps: ps}, nil
}

func (p *courierPublisher) publish(ctx context.Context, body []byte) error {
	return p.ps.Publish(ctx, "bench", body)
}

// flush waits for a routed round trip, under a key no subscriber
// matches: the broker handles one connection's frames in order, so
// everything published before has been routed when it returns.
func (p *courierPublisher) flush(ctx context.Context) error {
	return p.ps.PublishSync(ctx, courier.Message{Key: "bench.flush"})
}

// courierUser is a simulated user: a Conn with the request-response
// exchange of serve and the users' pub-sub exchange, subscribed to the
// key "user.<i>".
type courierUser struct {
	c    *courier.Conn
	rr   *courier.ReqResp
	ps   *courier.PubSub
	pong []byte
}

var _ userDriver = (*courierDriver)(nil)

func (d *courierDriver) user(ctx context.Context, i int, keys []string, fn func([]byte)) (userConn, error) {
	d.mu.Lock()
	pong := d.pong
	d.mu.Unlock()
	c, err := d.connectUser(ctx, fmt.Sprintf("bench-user-%d", i))
	if err != nil {
		return nil, err
	}
	u := &courierUser{c: c, pong: pong}
	if u.rr, err = c.ReqResp(ctx, names("reqresp"), courier.RoundRobin); err != nil {
		return nil, fmt.Errorf("bench: user %d: %w", i, err)
	}
	if u.ps, err = c.PubSub(ctx, names("users")); err != nil {
		return nil, fmt.Errorf("bench: user %d: %w", i, err)
	}
	if _, err := u.ps.Subscribe(ctx, keys[0], func(m *courier.Delivery) { fn(m.Body) }, courier.Patterns(keys[1:]...)); err != nil {
		return nil, fmt.Errorf("bench: user %d: subscribe: %w", i, err)
	}
	return u, nil
}

// userKey is the routing key (or subject) of user i's messages.
func userKey(i int) string { return "user." + strconv.Itoa(i) }

func (u *courierUser) request(ctx context.Context, body []byte) error {
	return (&courierRequester{rr: u.rr, pong: u.pong}).request(ctx, body)
}

func (u *courierUser) publish(ctx context.Context, key string, body []byte) error {
	return u.ps.Publish(ctx, key, body)
}

func (u *courierUser) close() error { return u.c.Close() }

var _ queueDriver = (*courierDriver)(nil)

// declareQueue declares a durable task exchange: its queue is the
// queue.
func (d *courierDriver) declareQueue(ctx context.Context, name string) error {
	c, err := d.admin(ctx)
	if err != nil {
		return err
	}
	_, err = c.Tasks(ctx, name)
	return err
}

// admin returns the connection that declares, inspects and deletes the
// queues: the first one opened.
func (d *courierDriver) admin(ctx context.Context) (*courier.Conn, error) {
	d.mu.Lock()
	var c *courier.Conn
	if len(d.conns) > 0 {
		c = d.conns[0]
	}
	d.mu.Unlock()
	if c != nil {
		return c, nil
	}
	return d.connect(ctx, "bench-admin")
}

// courierProducer submits with Tasks.SubmitAsync: the confirm comes once
// the task is durable (group commit).
type courierProducer struct {
	c *courier.Conn
	t *courier.Tasks
}

func (d *courierDriver) producer(ctx context.Context, name string) (producer, error) {
	c, err := d.connect(ctx, "bench-producer")
	if err != nil {
		return nil, err
	}
	t, err := c.Tasks(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("bench: open %s: %w", name, err)
	}
	return courierProducer{c, t}, nil
}

func (p courierProducer) close() error { return p.c.Close() }

func (p courierProducer) submit(ctx context.Context, body []byte, done func(error)) error {
	return p.t.SubmitAsync(ctx, courier.Task{Body: body}, func(_ courier.TaskID, err error) { done(err) })
}

// courierJob is a task handed to the scenario, deferred: it is acked when
// the scenario says so.
type courierJob struct{ j *courier.Job }

func (j courierJob) body() []byte { return j.j.Body }
func (j courierJob) ack() error   { return j.j.Ack() }

func (d *courierDriver) consume(ctx context.Context, name string, prefetch int, fn func(delivery)) error {
	c, err := d.connect(ctx, "bench-worker")
	if err != nil {
		return err
	}
	t, err := c.Tasks(ctx, name)
	if err != nil {
		return fmt.Errorf("bench: open %s: %w", name, err)
	}
	_, err = t.Work(ctx, func(j *courier.Job) error {
		j.Defer()
		fn(courierJob{j})
		return nil
	}, courier.Prefetch(prefetch))
	if err != nil {
		return fmt.Errorf("bench: attach worker: %w", err)
	}
	return nil
}

// depth is the task queue's messages: ready, unacked and delayed.
func (d *courierDriver) depth(ctx context.Context, name string) (int64, error) {
	c, err := d.admin(ctx)
	if err != nil {
		return 0, err
	}
	list, err := c.Exchanges(ctx)
	if err != nil {
		return 0, err
	}
	for _, e := range list {
		if e.Name == name && e.Queue != nil {
			return e.Queue.Messages, nil
		}
	}
	return 0, fmt.Errorf("bench: no queue %s", name)
}

func (d *courierDriver) deleteQueue(ctx context.Context, name string) error {
	c, err := d.admin(ctx)
	if err != nil {
		return err
	}
	return c.DeleteQueue(ctx, name)
}

func (d *courierDriver) notes() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, e := range d.async {
		out = append(out, "asynchronous error: "+e)
	}
	if d.lost > 0 {
		causes := slices.Sorted(maps.Keys(d.lostCause))
		for i, c := range causes {
			causes[i] = fmt.Sprintf("%d× %s", d.lostCause[c], c)
		}
		out = append(out, fmt.Sprintf("%d connections lost and re-established by the client during the run (what was sent to them meanwhile is lost): %s",
			d.lost, strings.Join(causes, "; ")))
	}
	return out
}

// lostCause is the part of a connection's loss cause that names it, without
// the addresses that make each one different.
func lostCause(err error) string {
	if err == nil {
		return "unknown"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && strings.Contains(s, "127.0.0.1") {
		s = s[i+2:]
	}
	return s
}

func (d *courierDriver) close() error {
	d.mu.Lock()
	conns := d.conns
	d.conns = nil
	d.mu.Unlock()
	// Leave no exchanges behind on a server.
	if len(conns) > 0 && d.node == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		for _, name := range []string{names("reqresp"), names("pubsub"), names("users")} {
			conns[0].DeleteExchange(ctx, name)
		}
		cancel()
	}
	for _, c := range conns {
		c.Close()
	}
	if d.nodeB != nil {
		d.nodeB.Close()
	}
	if d.node != nil {
		d.node.Close()
	}
	if d.tempDir != "" {
		os.RemoveAll(d.tempDir)
	}
	return nil
}
