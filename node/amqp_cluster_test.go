package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/testutil"
)

// startAMQPCluster3 starts three clustered nodes a, b and c, each with
// an AMQP listener, waits until every node is live, and returns them
// with their guest URLs.
func startAMQPCluster3(t *testing.T) ([]*Node, []string) {
	t.Helper()
	start := func(name string, join ...string) *Node {
		n, err := Start(Config{
			Name: name, DataDir: t.TempDir(), Log: testLog(),
			Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", AMQP: "127.0.0.1:0",
			Cluster: ClusterConfig{Listen: "127.0.0.1:0", Join: join, Secret: clusterSecret},
		})
		if err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	a := start("a")
	nodes := []*Node{a, start("b", a.ClusterAddr()), start("c", a.ClusterAddr())}
	waitUntil(t, 30*time.Second, "the metadata group has three servers", func() bool {
		s, err := a.Meta().Servers()
		return err == nil && len(s) == 3
	})
	waitUntil(t, 30*time.Second, "every broker links to the two others, three live nodes", func() bool {
		for _, n := range nodes {
			if len(n.Broker().PeerNodes()) != 2 {
				return false
			}
		}
		live := 0
		for _, l := range a.Meta().Nodes() {
			if !l.Expired {
				live++
			}
		}
		return live == 3
	})
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = strings.Replace(n.AMQPURL(), "amqp://", "amqp://guest:guest@", 1) + "/"
	}
	return nodes, urls
}

// amqpRetry dials url and runs fn on a new channel, again on a new
// connection while fn fails for want of the cluster's metadata quorum or
// a queue leader (541 with Courier's "unavailable" text: a loaded
// machine loses leaders, and a program retries that as RabbitMQ's do a
// 541), up to 120 s; it returns the connection and channel fn succeeded
// on (an exclusive queue stays theirs).
func amqpRetry(t *testing.T, url string, fn func(*amqp091.Channel) error) (*amqp091.Connection, *amqp091.Channel) {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		c, ch := amqpChannel(t, url)
		err := fn(ch)
		if err == nil {
			return c, ch
		}
		var ae *amqp091.Error
		retry := errors.As(err, &ae) && ae.Code == amqp.InternalError &&
			(strings.Contains(ae.Reason, "quorum") || strings.Contains(ae.Reason, "catalog") ||
				strings.Contains(ae.Reason, "leader") || strings.Contains(ae.Reason, "unavailable"))
		if !retry || time.Now().After(deadline) {
			t.Fatal(err)
		}
		t.Logf("%v; again", err)
		c.Close()
		time.Sleep(100 * time.Millisecond)
	}
}

func declareQueue(t *testing.T, url, name string, durable bool, args amqp091.Table) {
	t.Helper()
	amqpRetry(t, url, func(ch *amqp091.Channel) error {
		_, err := ch.QueueDeclare(name, durable, false, false, false, args)
		return err
	})
}

func declareExchange(t *testing.T, url, name, kind string, durable bool) {
	t.Helper()
	amqpRetry(t, url, func(ch *amqp091.Channel) error {
		return ch.ExchangeDeclare(name, kind, durable, false, false, false, nil)
	})
}

// amqpConsumer collects what an AMQP consumer of queue on url receives,
// acking each delivery.
type amqpConsumer struct {
	mu   sync.Mutex
	got  map[string]int
	dups []string // bodies received again without redelivered
	conn *amqp091.Connection
}

func consumeAMQP(t *testing.T, url, queue string) *amqpConsumer {
	t.Helper()
	var ds <-chan amqp091.Delivery
	c, _ := amqpRetry(t, url, func(ch *amqp091.Channel) (err error) {
		if err := ch.Qos(5, 0, false); err != nil {
			return err
		}
		ds, err = ch.Consume(queue, "", false, false, false, false, nil)
		return err
	})
	ac := &amqpConsumer{got: map[string]int{}, conn: c}
	go func() {
		for d := range ds {
			ac.mu.Lock()
			ac.got[string(d.Body)]++
			if ac.got[string(d.Body)] > 1 && !d.Redelivered {
				ac.dups = append(ac.dups, string(d.Body))
			}
			ac.mu.Unlock()
			d.Ack(false)
		}
	}()
	return ac
}

// received merges what consumers got.
func received(cs ...*amqpConsumer) (got map[string]int, dups []string) {
	got = map[string]int{}
	for _, c := range cs {
		c.mu.Lock()
		for b, n := range c.got {
			got[b] += n
		}
		dups = append(dups, c.dups...)
		c.mu.Unlock()
	}
	return got, dups
}

// publishAMQP publishes bodies to the default exchange with routing key
// queue on url, with confirms, again for each one nacked or whose
// connection failed (as a RabbitMQ program does through a failover).
func publishAMQP(t *testing.T, url, queue string, bodies []string) {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for _, body := range bodies {
		for {
			if time.Now().After(deadline) {
				t.Fatalf("publication %s not confirmed within 120 s", body)
			}
			c, err := amqp091.Dial(url)
			if err != nil {
				t.Fatal(err)
			}
			ch, err := c.Channel()
			if err == nil {
				err = ch.Confirm(false)
			}
			ok := false
			if err == nil {
				var dc *amqp091.DeferredConfirmation
				if dc, err = ch.PublishWithDeferredConfirm("", queue, false, false, amqp091.Publishing{DeliveryMode: amqp091.Persistent, Body: []byte(body)}); err == nil {
					ok = dc.Wait()
				}
			}
			c.Close()
			if ok {
				break
			}
			t.Logf("publication %s: acked %v, %v; again", body, ok, err)
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func bodies(prefix string, n int) []string {
	bs := make([]string, n)
	for i := range bs {
		bs[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	return bs
}

// TestAMQPClusterQueue: in a cluster of three, an AMQP client on A
// declares a quorum queue and a classic durable one: both are replicated
// queues of three replicas, Courier's default. Exchanges declared on one
// node are known on the others with their AMQP type. Publications with
// confirms on B reach consumers on every node, and basic.get on the node
// that serves the queue, each message once. The queue leader's node
// stops: the consumers on the other nodes go on after the failover and
// get what is published then; the one on the stopped node is lost with
// its connection, as with RabbitMQ.
func TestAMQPClusterQueue(t *testing.T) {
	nodes, urls := startAMQPCluster3(t)
	for _, args := range []amqp091.Table{{"x-queue-type": "quorum"}, nil} {
		name := "jobs"
		if args == nil {
			name = "classic"
		}
		declareQueue(t, urls[0], name, true, args)
		servingNode(t, nodes, name)
		for _, n := range nodes {
			if ex, ok := n.Meta().Exchange(name); !ok || ex.Config.Replicas != 3 || ex.Config.Transient {
				t.Fatalf("%s on %s: %+v, want 3 replicas", name, n.cfg.Name, ex.Config)
			}
		}
	}
	// A non-durable queue is a queue of one replica; declaring it again
	// the same way matches.
	declareQueue(t, urls[0], "scratch", false, nil)
	if ex, _ := nodes[0].Meta().Exchange("scratch"); ex.Config.Replicas != 1 {
		t.Fatalf("a non-durable queue in a cluster: %+v", ex.Config)
	}
	declareQueue(t, urls[1], "scratch", false, nil)

	// An exchange declared on B is known on C with its type.
	declareExchange(t, urls[1], "events", "direct", true)
	waitUntil(t, 30*time.Second, "events on c", func() bool { return nodes[2].Broker().Exchange("events") != nil })
	_, chc := amqpChannel(t, urls[2])
	if err := chc.ExchangeDeclare("events", "direct", true, false, false, false, nil); err != nil {
		t.Fatalf("the same declaration on c: %v", err)
	}
	err := chc.ExchangeDeclare("events", "fanout", true, false, false, false, nil)
	wantAMQPCode(t, err, amqp.PreconditionFailed)

	// Consumers on every node; publications on B.
	leader := servingNode(t, nodes, "jobs")
	consumers := make([]*amqpConsumer, 3)
	for i := range nodes {
		consumers[i] = consumeAMQP(t, urls[i], "jobs")
	}
	first := bodies("before", 30)
	publishAMQP(t, urls[1], "jobs", first)
	waitUntil(t, 60*time.Second, "every message consumed", func() bool {
		got, _ := received(consumers...)
		return len(got) == len(first)
	})
	got, dups := received(consumers...)
	for _, b := range first {
		if got[b] != 1 {
			t.Errorf("%s consumed %d times", b, got[b])
		}
	}
	if len(dups) > 0 {
		t.Fatalf("delivered again without redelivered: %v", dups)
	}
	for _, c := range consumers {
		c.conn.Close()
	}

	// basic.get, on the node that serves the queue and on one that does
	// not: with acks, with no-ack, a reject with requeue, get-empty.
	li := slices.Index(nodes, leader)
	publishAMQP(t, urls[(li+1)%3], "jobs", bodies("got", 4))
	for _, i := range []int{li, (li + 2) % 3} {
		_, ch := amqpChannel(t, urls[i])
		get := func(noAck bool) (amqp091.Delivery, bool) {
			t.Helper()
			d, ok, err := ch.Get("jobs", noAck)
			if err != nil {
				t.Fatalf("get on %s: %v", nodes[i].cfg.Name, err)
			}
			return d, ok
		}
		d, ok := get(false)
		if !ok {
			t.Fatalf("get on %s: empty", nodes[i].cfg.Name)
		}
		if err := d.Reject(true); err != nil {
			t.Fatal(err)
		}
		var again amqp091.Delivery
		testutil.WaitForf(t, 30*time.Second, func() bool {
			again, ok = get(false)
			return ok
		}, "a message after the reject")
		if err := again.Ack(false); err != nil {
			t.Fatal(err)
		}
		// (On a node that does not serve the queue, the next message may
		// be back after the retry backoff: handed to the getter between
		// its ack and its detach.)
		testutil.WaitForf(t, 30*time.Second, func() bool {
			_, ok = get(true)
			return ok
		}, "a message got with no-ack")
	}
	_, ch := amqpChannel(t, urls[(li+1)%3])
	testutil.WaitForf(t, 30*time.Second, func() bool {
		q, err := ch.QueueDeclarePassive("jobs", true, false, false, false, nil)
		return err == nil && q.Messages == 0
	}, "every message got")
	if _, ok, err := ch.Get("jobs", false); ok || err != nil {
		t.Fatalf("get of the emptied queue on a node that does not serve it: %v, %v", ok, err)
	}

	// The leader's node stops; consumers on the others go on.
	var survivors []*amqpConsumer
	var surviving []*Node
	for i, n := range nodes {
		if n != leader {
			survivors = append(survivors, consumeAMQP(t, urls[i], "jobs"))
			surviving = append(surviving, n)
		}
	}
	// A consumer whose connection is on the stopped node is lost with it.
	lostConn, _ := amqpRetry(t, urls[slices.Index(nodes, leader)], func(ch *amqp091.Channel) error {
		_, err := ch.Consume("jobs", "", false, false, false, false, nil)
		return err
	})
	lost := lostConn.NotifyClose(make(chan *amqp091.Error, 1))
	leader.Close()
	if e := testutil.Recv(t, lost, 30*time.Second); e == nil || e.Code != amqp.ConnectionForced {
		t.Fatalf("the consumer on the stopped node: %v, want 320", e)
	}
	after := bodies("after", 30)
	publishAMQP(t, urls[slices.Index(nodes, surviving[0])], "jobs", after)
	waitUntil(t, 120*time.Second, "every message published after the failover consumed", func() bool {
		got, _ := received(survivors...)
		return len(got) == len(after)
	})
	got, dups = received(survivors...)
	for _, b := range after {
		if got[b] == 0 {
			t.Errorf("%s not consumed", b)
		}
	}
	if len(dups) > 0 {
		t.Fatalf("delivered again without redelivered: %v", dups)
	}
	if n := servingNode(t, surviving, "jobs"); n == leader {
		t.Fatal("the stopped node still serves jobs")
	}
}

// TestAMQPClusterBindings: in a cluster, a queue bound on A to a direct
// exchange and to a headers exchange declared on B takes what is
// published to them on B, and a consumer on C and basic.get on B get it
// with the exchange and routing key it was published with: the binding's
// subscription on A is moved into the replicated queue. Unbinding stops
// it.
func TestAMQPClusterBindings(t *testing.T) {
	nodes, urls := startAMQPCluster3(t)
	declareExchange(t, urls[1], "events", "direct", true)
	declareExchange(t, urls[1], "tagged", "headers", true)
	_, chb := amqpChannel(t, urls[1])
	waitUntil(t, 30*time.Second, "the exchanges on a", func() bool {
		return nodes[0].Broker().Exchange("events") != nil && nodes[0].Broker().Exchange("tagged") != nil
	})
	declareQueue(t, urls[0], "orders", true, nil)
	_, cha := amqpRetry(t, urls[0], func(ch *amqp091.Channel) error {
		if err := ch.QueueBind("orders", "new", "events", false, nil); err != nil {
			return err
		}
		return ch.QueueBind("orders", "", "tagged", false, amqp091.Table{"n": int32(7)})
	})
	servingNode(t, nodes, "orders")
	// B hears of the bindings' interest asynchronously (queue.bind-ok
	// does not wait for the other nodes, docs/amqp.md "In a cluster").
	waitUntil(t, 30*time.Second, "b knows a's two binding patterns", func() bool {
		for _, st := range nodes[1].Broker().PeerPubSubStats() {
			if st.Node == "a" {
				return st.Patterns >= 2
			}
		}
		return false
	})

	var ds <-chan amqp091.Delivery
	_, chc := amqpRetry(t, urls[2], func(ch *amqp091.Channel) (err error) {
		ds, err = ch.Consume("orders", "", false, false, false, false, nil)
		return err
	})
	if err := chb.Confirm(false); err != nil {
		t.Fatal(err)
	}
	publish := func(exchange, key string, h amqp091.Table, body string) {
		t.Helper()
		dc, err := chb.PublishWithDeferredConfirm(exchange, key, false, false, amqp091.Publishing{Headers: h, Body: []byte(body)})
		if err != nil {
			t.Fatal(err)
		}
		if !dc.Wait() {
			t.Fatalf("%s nacked", body)
		}
	}
	publish("events", "new", nil, "order-1")
	publish("events", "old", nil, "not-bound")
	publish("tagged", "any", amqp091.Table{"n": int32(7)}, "tagged-7")
	publish("tagged", "any", amqp091.Table{"n": "7"}, "tagged-string")
	want := map[string][2]string{"order-1": {"events", "new"}, "tagged-7": {"tagged", "any"}}
	for range want {
		d := testutil.Recv(t, ds, 60*time.Second)
		w, ok := want[string(d.Body)]
		if !ok || d.Exchange != w[0] || d.RoutingKey != w[1] {
			t.Fatalf("consumer on c got %q from %q with key %q", d.Body, d.Exchange, d.RoutingKey)
		}
		if _, ok := d.Headers["x-amqp-exchange"]; ok {
			t.Fatalf("the origin headers are shown: %v", d.Headers)
		}
		d.Ack(false)
	}
	chc.Close()

	// basic.get on B, which neither holds the binding nor serves the queue.
	publish("events", "new", nil, "order-2")
	_, chg := amqpChannel(t, urls[1])
	var d amqp091.Delivery
	var err error
	testutil.WaitForf(t, 60*time.Second, func() bool {
		var ok bool
		d, ok, err = chg.Get("orders", true)
		return ok || err != nil
	}, "order-2 got on b")
	if err != nil || string(d.Body) != "order-2" || d.Exchange != "events" || d.RoutingKey != "new" {
		t.Fatalf("got %q from %q key %q: %v", d.Body, d.Exchange, d.RoutingKey, err)
	}

	// Unbound, the queue takes nothing more from the exchange.
	if err := cha.QueueUnbind("orders", "new", "events", nil); err != nil {
		t.Fatal(err)
	}
	publish("events", "new", nil, "after-unbind")
	publish("tagged", "any", amqp091.Table{"n": int32(7)}, "tagged-after")
	testutil.WaitForf(t, 60*time.Second, func() bool {
		d, ok, err := chg.Get("orders", true)
		if err != nil {
			t.Fatal(err)
		}
		if ok && string(d.Body) != "tagged-after" {
			t.Fatalf("got %q after the unbind", d.Body)
		}
		return ok
	}, "tagged-after got: the other binding still moves")
	if _, ok, err := chg.Get("orders", true); ok || err != nil {
		t.Fatalf("a message after the unbind: %v, %v", ok, err)
	}

	// While A's listener is down, what its binding takes waits in the
	// subscription; a listener that starts moves it into the queue. (What
	// a mover submitted and had not yet acked when it stopped is moved
	// again, at least once: wait for the acks first.)
	sub := nodes[0].Broker().Queue("tagged/amqp.orders")
	testutil.WaitForf(t, 60*time.Second, func() bool { return sub.Stats().Messages() == 0 }, "every message of the binding acked once moved")
	ctx := testutil.Context(t, 60*time.Second)
	if err := nodes[0].amqp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	publish("tagged", "any", amqp091.Table{"n": int32(7)}, "while-down")
	if _, ok, err := chg.Get("orders", true); ok || err != nil {
		t.Fatalf("moved without a listener: %v, %v", ok, err)
	}
	s, err := amqp.New(amqp.Config{Listen: "127.0.0.1:0", Broker: nodes[0].Broker(), Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	defer func() {
		if !t.Failed() {
			exclusiveInCluster(t, nodes, urls)
		}
	}()
	testutil.WaitForf(t, 60*time.Second, func() bool {
		d, ok, err := chg.Get("orders", true)
		if err != nil {
			t.Fatal(err)
		}
		if ok && string(d.Body) != "while-down" {
			t.Fatalf("got %q", d.Body)
		}
		return ok
	}, "while-down moved once a listener serves again")
}

// exclusiveInCluster: an exclusive server-named queue declared on C, as
// RabbitMQ's tutorials declare them, is a queue of one replica; bound on
// C to a fanout exchange, it takes what is published on B; its
// connection closing deletes it on every node.
func exclusiveInCluster(t *testing.T, nodes []*Node, urls []string) {
	t.Helper()
	declareExchange(t, urls[1], "logs", "fanout", false)
	_, chb := amqpChannel(t, urls[1])
	waitUntil(t, 30*time.Second, "logs on c", func() bool { return nodes[2].Broker().Exchange("logs") != nil })
	var q amqp091.Queue
	cc, chc := amqpRetry(t, urls[2], func(ch *amqp091.Channel) (err error) {
		q, err = ch.QueueDeclare("", false, false, true, false, nil)
		return err
	})
	if ex, ok := nodes[2].Meta().Exchange(q.Name); !ok || ex.Config.Replicas != 1 {
		t.Fatalf("exclusive queue %s: %+v", q.Name, ex.Config)
	}
	if err := chc.QueueBind(q.Name, "", "logs", false, nil); err != nil {
		t.Fatal(err)
	}
	ds, err := chc.Consume(q.Name, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "b knows c's binding", func() bool {
		for _, st := range nodes[1].Broker().PeerPubSubStats() {
			if st.Node == "c" {
				return st.Patterns >= 1
			}
		}
		return false
	})
	if err := chb.Publish("logs", "", false, false, amqp091.Publishing{Body: []byte("info: Hello World!")}); err != nil {
		t.Fatal(err)
	}
	if d := testutil.Recv(t, ds, 60*time.Second); string(d.Body) != "info: Hello World!" || d.Exchange != "logs" {
		t.Fatalf("got %q from %q", d.Body, d.Exchange)
	}
	cc.Close()
	waitUntil(t, 60*time.Second, "the exclusive queue deleted on every node", func() bool {
		for _, n := range nodes {
			if _, ok := n.Meta().Exchange(q.Name); ok {
				return false
			}
		}
		return true
	})
}
