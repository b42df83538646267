package node

import (
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
)

func TestAMQPListener(t *testing.T) {
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Addr() != nil {
		t.Fatalf("client listener %v without Listen", n.Addr())
	}
	url := n.AMQPURL()
	if !strings.HasPrefix(url, "amqp://127.0.0.1:") {
		t.Fatalf("AMQP URL %q", url)
	}
	c, err := amqp091.Dial(strings.Replace(url, "amqp://", "amqp://guest:guest@", 1))
	if err != nil {
		t.Fatal(err)
	}
	closed := c.NotifyClose(make(chan *amqp091.Error, 1))
	if _, err := c.Channel(); err != nil {
		t.Fatal(err)
	}
	n.Close()
	if e := testutil.Recv(t, closed, 30*time.Second); e == nil || e.Code != amqp.ConnectionForced {
		t.Fatalf("on node close: %v, want 320", e)
	}
}

func TestAMQPTLS(t *testing.T) {
	ca := testutil.NewCA(t)
	cert := ca.Server()
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0",
		TLS: TLSFiles{CertFile: cert.CertFile, KeyFile: cert.KeyFile}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	url := n.AMQPURL()
	if !strings.HasPrefix(url, "amqps://") {
		t.Fatalf("AMQP URL %q with TLS", url)
	}
	c, err := amqp091.DialTLS(strings.Replace(url, "amqps://", "amqps://guest:guest@", 1), &tls.Config{RootCAs: ca.Pool})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestAMQPBeyondLoopbackNeedsUsers(t *testing.T) {
	_, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "0.0.0.0:0"})
	if err == nil || !strings.Contains(err.Error(), "amqp listener") {
		t.Fatalf("AMQP on 0.0.0.0 without users: %v", err)
	}
	// A busy address fails Start with amqp.ErrListen.
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	_, err = Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: n.AMQPAddr().String()})
	if !errors.Is(err, amqp.ErrListen) {
		t.Fatalf("AMQP on a busy address: %v", err)
	}
}

// amqpNode starts a node with an AMQP listener and returns it with the
// guest URL.
func amqpNode(t *testing.T) (*Node, string) {
	t.Helper()
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, strings.Replace(n.AMQPURL(), "amqp://", "amqp://guest:guest@", 1) + "/"
}

func amqpChannel(t *testing.T, url string) (*amqp091.Connection, *amqp091.Channel) {
	t.Helper()
	c, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return c, ch
}

func wantAMQPCode(t *testing.T, err error, code int) {
	t.Helper()
	var ae *amqp091.Error
	if !errors.As(err, &ae) || ae.Code != code {
		t.Fatalf("err %v, want AMQP code %d", err, code)
	}
}

// TestAMQPPublishReachesCourierSubscriber: an AMQP publisher's message,
// confirmed, reaches a Courier-native subscriber of the exchange with its
// routing key, body, headers and properties.
func TestAMQPPublishReachesCourierSubscriber(t *testing.T) {
	n, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if err := ch.ExchangeDeclare("logs", "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 30*time.Second)
	conn := n.Connect()
	defer conn.Close()
	ps, err := conn.PubSub(ctx, "logs")
	if err != nil {
		t.Fatalf("the AMQP exchange seen from Courier: %v", err)
	}
	got := make(chan courier.Message, 10)
	if _, err := ps.Subscribe(ctx, "kern.*", func(d *courier.Delivery) { got <- d.Message }); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 2))
	for _, key := range []string{"user.info", "kern.critical"} {
		err := ch.PublishWithContext(ctx, "logs", key, false, false, amqp091.Publishing{
			ContentType: "text/plain", CorrelationId: "c-1", Headers: amqp091.Table{"n": int32(7), "s": "x"},
			DeliveryMode: amqp091.Persistent, Body: []byte("disk full on " + key),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		if c := testutil.Recv(t, confirms, 30*time.Second); !c.Ack || c.DeliveryTag != uint64(i+1) {
			t.Fatalf("confirm %+v", c)
		}
	}
	m := testutil.Recv(t, got, 30*time.Second)
	if m.Key != "kern.critical" || string(m.Body) != "disk full on kern.critical" {
		t.Fatalf("message %q %q", m.Key, m.Body)
	}
	for k, v := range map[string]string{"content-type": "text/plain", "correlation-id": "c-1", "delivery-mode": "2", "n": "7", "s": "x"} {
		if m.Header[k] != v {
			t.Errorf("header %s = %q, want %q (all: %v)", k, m.Header[k], v, m.Header)
		}
	}
	select {
	case m := <-got:
		t.Fatalf("the subscriber of kern.* got %q", m.Key)
	default:
	}
}

func TestAMQPExchangeErrors(t *testing.T) {
	n, url := amqpNode(t)
	ctx := testutil.Context(t, 30*time.Second)
	conn := n.Connect()
	defer conn.Close()
	if _, err := conn.ReqResp(ctx, "rpc"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		do   func(ch *amqp091.Channel) error
		code int
	}{
		{"passive declare of a missing exchange", func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclarePassive("nope", "direct", false, false, false, false, nil)
		}, amqp.NotFound},
		{"reserved name", func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclare("amq.mine", "direct", false, false, false, false, nil)
		}, amqp.AccessRefused},
		{"the default exchange", func(ch *amqp091.Channel) error {
			return ch.ExchangeDelete("", false, false)
		}, amqp.AccessRefused},
		{"a request-response exchange as pub-sub", func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclare("rpc", "direct", true, false, false, false, nil)
		}, amqp.PreconditionFailed},
		{"durability changed", func(ch *amqp091.Channel) error {
			if err := ch.ExchangeDeclare("d", "direct", true, false, false, false, nil); err != nil {
				return err
			}
			return ch.ExchangeDeclare("d", "direct", false, false, false, false, nil)
		}, amqp.PreconditionFailed},
		{"publish to a missing exchange", func(ch *amqp091.Channel) error {
			closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
			if err := ch.PublishWithContext(ctx, "nope", "k", false, false, amqp091.Publishing{Body: []byte("x")}); err != nil {
				return err
			}
			return testutil.Recv(t, closed, 30*time.Second)
		}, amqp.NotFound},
		{"unknown type", func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclare("w", "x-weird", false, false, false, false, nil)
		}, amqp.CommandInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ch := amqpChannel(t, url)
			wantAMQPCode(t, tc.do(ch), tc.code)
			if !(&amqp.Error{Code: uint16(tc.code)}).Hard() {
				// A channel error leaves the connection open.
				if _, err := c.Channel(); err != nil {
					t.Fatalf("the connection after a channel error: %v", err)
				}
			}
		})
	}
	// Delete, then the exchange is gone; deleting again succeeds.
	_, ch := amqpChannel(t, url)
	if err := ch.ExchangeDeclare("tmp", "fanout", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDelete("tmp", false, false); err != nil {
		t.Fatal(err)
	}
	if n.broker.Exchange("tmp") != nil {
		t.Fatal("exchange tmp still there after exchange.delete")
	}
	if err := ch.ExchangeDelete("tmp", false, false); err != nil {
		t.Fatalf("deleting a missing exchange: %v", err)
	}
}

// TestAMQPPermissions: an AMQP user publishes only where Courier's
// permissions let it write, and declares only where it may configure.
func TestAMQPPermissions(t *testing.T) {
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0", AdminUser: "admin", AdminPassword: "admin-passw0rd"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	perms := auth.Permissions{Configure: auth.Patterns{"mine"}, Write: auth.Patterns{"mine"}, Read: auth.Patterns{"#"}}
	if _, err := n.users.PutUser("bob", auth.UserChange{Password: "bob-passw0rd", Permissions: &perms}); err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(n.AMQPURL(), "amqp://", "amqp://bob:bob-passw0rd@", 1) + "/"
	_, ch := amqpChannel(t, url)
	if err := ch.ExchangeDeclare("mine", "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 30*time.Second)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 1))
	if err := ch.PublishWithContext(ctx, "mine", "", false, false, amqp091.Publishing{Body: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	if c := testutil.Recv(t, confirms, 30*time.Second); !c.Ack {
		t.Fatal("publish to an exchange bob may write to was nacked")
	}
	_, ch = amqpChannel(t, url)
	wantAMQPCode(t, ch.ExchangeDeclare("theirs", "fanout", true, false, false, false, nil), amqp.AccessRefused)
	admin := strings.Replace(n.AMQPURL(), "amqp://", "amqp://admin:admin-passw0rd@", 1) + "/"
	_, ach := amqpChannel(t, admin)
	if err := ach.ExchangeDeclare("theirs", "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, ch = amqpChannel(t, url)
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	if err := ch.PublishWithContext(ctx, "theirs", "", false, false, amqp091.Publishing{Body: []byte("no")}); err != nil {
		t.Fatal(err)
	}
	if e := testutil.Recv(t, closed, 30*time.Second); e == nil || e.Code != amqp.AccessRefused {
		t.Fatalf("publish without write permission: %v, want 403", e)
	}
	// guest is nobody on a node with users.
	if _, err := amqp091.Dial(strings.Replace(n.AMQPURL(), "amqp://", "amqp://guest:guest@", 1) + "/"); err == nil {
		t.Fatal("guest logged in on a node with users")
	}
}

// TestAMQPWorkQueue is RabbitMQ's tutorial 2 against Courier, mixed with
// Courier's own producers: a durable queue, prefetch 1, acks, nack with
// requeue, reject, and a Courier Submit reaching the AMQP consumer.
func TestAMQPWorkQueue(t *testing.T) {
	n, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	q, err := ch.QueueDeclare("work", true, false, false, false, amqp091.Table{"x-queue-type": "quorum"})
	if err != nil {
		t.Fatal(err)
	}
	if q.Name != "work" || q.Messages != 0 {
		t.Fatalf("declared %+v", q)
	}
	ctx := testutil.Context(t, 30*time.Second)
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 3))
	for _, body := range []string{"one", "two"} {
		if err := ch.PublishWithContext(ctx, "", "work", false, false, amqp091.Publishing{DeliveryMode: amqp091.Persistent, ContentType: "text/plain", Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	// A publication to a queue that does not exist is dropped, and
	// confirmed, as in RabbitMQ.
	if err := ch.PublishWithContext(ctx, "", "nowhere", false, false, amqp091.Publishing{Body: []byte("lost")}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if c := testutil.Recv(t, confirms, 30*time.Second); !c.Ack {
			t.Fatalf("confirm %+v", c)
		}
	}
	conn := n.Connect()
	defer conn.Close()
	tasks, err := conn.Tasks(ctx, "work")
	if err != nil {
		t.Fatalf("the AMQP queue seen from Courier: %v", err)
	}
	if _, err := tasks.Submit(ctx, courier.Task{Body: []byte("three"), Header: map[string]string{"from": "courier"}}); err != nil {
		t.Fatal(err)
	}
	q, err = ch.QueueDeclarePassive("work", true, false, false, false, nil)
	if err != nil || q.Messages != 3 {
		t.Fatalf("passive declare: %+v, %v", q, err)
	}

	_, cch := amqpChannel(t, url)
	if err := cch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	msgs, err := cch.Consume("work", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	next := func() amqp091.Delivery {
		t.Helper()
		return testutil.Recv(t, msgs, 30*time.Second)
	}
	d := next()
	if string(d.Body) != "one" || d.ContentType != "text/plain" || d.Redelivered || d.RoutingKey != "work" {
		t.Fatalf("first delivery %q %+v", d.Body, d)
	}
	// Prefetch 1: nothing more until it is settled.
	select {
	case d2 := <-msgs:
		t.Fatalf("second delivery %q before the first was acked, with prefetch 1", d2.Body)
	default:
	}
	if err := d.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	// A requeued message comes back after Courier's 1 ms retry backoff,
	// so others may come first (RabbitMQ puts it back at the head).
	seen := map[string]bool{}
	for range 3 {
		d = next()
		seen[string(d.Body)] = true
		switch string(d.Body) {
		case "one":
			if !d.Redelivered {
				t.Fatal("the nacked message is not marked redelivered")
			}
		case "two":
			if err := d.Reject(false); err != nil { // dropped: the queue has no dead letter exchange
				t.Fatal(err)
			}
			continue
		case "three":
			if d.Headers["from"] != "courier" || d.Redelivered {
				t.Fatalf("the Courier task: %v redelivered=%v", d.Headers, d.Redelivered)
			}
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("deliveries %v", seen)
	}
	testutil.WaitForf(t, 30*time.Second, func() bool {
		q, err := cch.QueueDeclarePassive("work", true, false, false, false, nil)
		return err == nil && q.Messages == 0
	}, "the queue empties")
	// An unknown delivery tag closes the channel with 406.
	closed := cch.NotifyClose(make(chan *amqp091.Error, 1))
	if err := cch.Ack(99, false); err != nil {
		t.Fatal(err)
	}
	if e := testutil.Recv(t, closed, 30*time.Second); e == nil || e.Code != amqp.PreconditionFailed {
		t.Fatalf("ack of an unknown tag: %v", e)
	}
}

func TestAMQPQueueErrorsAndNoAck(t *testing.T) {
	_, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	_, err := ch.QueueDeclarePassive("missing", false, false, false, false, nil)
	wantAMQPCode(t, err, amqp.NotFound)
	_, ch = amqpChannel(t, url)
	_, err = ch.Consume("missing", "", false, false, false, false, nil)
	wantAMQPCode(t, err, amqp.NotFound)
	_, ch = amqpChannel(t, url)
	_, err = ch.QueueDeclare("bad", true, false, false, false, amqp091.Table{"x-queue-type": "stream"})
	wantAMQPCode(t, err, amqp.NotImplemented)
	_, ch = amqpChannel(t, url)
	if _, err := ch.QueueDeclare("lim", true, false, false, false, amqp091.Table{"x-max-length": int32(5)}); err != nil {
		t.Fatal(err)
	}
	_, err = ch.QueueDeclare("lim", true, false, false, false, amqp091.Table{"x-max-length": int32(6)})
	wantAMQPCode(t, err, amqp.PreconditionFailed)

	// A server-named queue and a no-ack consumer.
	_, ch = amqpChannel(t, url)
	q, err := ch.QueueDeclare("", false, false, false, false, nil)
	if err != nil || !strings.HasPrefix(q.Name, "amq.gen-") {
		t.Fatalf("server-named queue %+v, %v", q, err)
	}
	msgs, err := ch.Consume(q.Name, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 30*time.Second)
	for i := range 3 {
		if err := ch.PublishWithContext(ctx, "", q.Name, false, false, amqp091.Publishing{Body: []byte{byte('a' + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if d := testutil.Recv(t, msgs, 30*time.Second); string(d.Body) != string(rune('a'+i)) {
			t.Fatalf("no-ack delivery %d: %q", i, d.Body)
		}
	}
	if _, err := ch.QueueDelete(q.Name, false, false, false); err != nil {
		t.Fatal(err)
	}

	// queue.purge drops the ready messages and says how many.
	_, ch = amqpChannel(t, url)
	if _, err := ch.QueueDeclare("purged", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 3))
	for range 3 {
		if err := ch.PublishWithContext(ctx, "", "purged", false, false, amqp091.Publishing{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		testutil.Recv(t, confirms, 30*time.Second)
	}
	if n, err := ch.QueuePurge("purged", false); err != nil || n != 3 {
		t.Fatalf("purge: %d, %v; want 3", n, err)
	}
	if q, err := ch.QueueDeclarePassive("purged", true, false, false, false, nil); err != nil || q.Messages != 0 {
		t.Fatalf("after the purge: %+v, %v", q, err)
	}
	_, err = ch.QueuePurge("no-such-queue", false)
	wantAMQPCode(t, err, amqp.NotFound)
}

// TestAMQPInManagementAPI: AMQP connections are listed with protocol
// "amqp", Courier's with "courier", and the overview names the AMQP
// listener.
func TestAMQPInManagementAPI(t *testing.T) {
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0", HTTP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	c, err := amqp091.Dial(strings.Replace(n.AMQPURL(), "amqp://", "amqp://guest:guest@", 1) + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := n.Connect()
	defer conn.Close()
	get := func(path string) string {
		t.Helper()
		resp, err := http.Get(n.HTTPURL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v\n%s", path, resp.StatusCode, err, b)
		}
		return string(b)
	}
	conns := get("/api/connections")
	for _, want := range []string{`"protocol":"amqp"`, `"protocol":"courier"`, `"user":"guest"`} {
		if !strings.Contains(conns, want) {
			t.Errorf("/api/connections lacks %s:\n%s", want, conns)
		}
	}
	if ov := get("/api/overview"); !strings.Contains(ov, `"protocol":"amqp","address":"`+n.AMQPAddr().String()+`"`) {
		t.Errorf("/api/overview does not name the AMQP listener:\n%s", ov)
	}
}

// TestAMQPQueueDeletedCancelsConsumer: a consumer whose queue is deleted
// gets basic.cancel (amqp091-go closes its deliveries channel).
func TestAMQPQueueDeletedCancelsConsumer(t *testing.T) {
	_, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if _, err := ch.QueueDeclare("doomed", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	cancels := ch.NotifyCancel(make(chan string, 1))
	msgs, err := ch.Consume("doomed", "c1", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, other := amqpChannel(t, url)
	if _, err := other.QueueDelete("doomed", false, false, false); err != nil {
		t.Fatal(err)
	}
	if tag := testutil.Recv(t, cancels, 30*time.Second); tag != "c1" {
		t.Fatalf("cancel of %q", tag)
	}
	testutil.Closed(t, msgs, 30*time.Second, "the deliveries of a cancelled consumer")
}

// TestAMQPFlowControl: an AMQP publisher filling a queue past the memory
// watermark is blocked (connection.blocked) and held, not dropped; a
// consumer on another connection drains the queue and it is unblocked.
func TestAMQPFlowControl(t *testing.T) {
	const budget, size, total = 256 << 10, 1024, 2000
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0", MemoryBudget: budget / 2, MemoryHighWatermark: budget})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	url := strings.Replace(n.AMQPURL(), "amqp://", "amqp://guest:guest@", 1) + "/"
	pc, ch := amqpChannel(t, url)
	if _, err := ch.QueueDeclare("flow", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	blocked := pc.NotifyBlocked(make(chan amqp091.Blocking, 4))
	ctx := testutil.Context(t, 2*time.Minute)
	sent := make(chan error, 1)
	go func() {
		body := make([]byte, size)
		for range total {
			if err := ch.PublishWithContext(ctx, "", "flow", false, false, amqp091.Publishing{Body: body}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	if b := testutil.Recv(t, blocked, time.Minute); !b.Active {
		t.Fatalf("first notification %+v, want blocked", b)
	}
	depth := n.broker.Queue("flow").Stats().Messages()
	if bound := int64(budget/size + 200); depth > bound {
		t.Fatalf("queue depth %d past the watermark's %d messages", depth, bound)
	}
	_, cch := amqpChannel(t, url)
	msgs, err := cch.Consume("flow", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range total {
		select {
		case <-msgs:
		case <-ctx.Done():
			t.Fatalf("%d of %d messages consumed", i, total)
		}
	}
	if err := testutil.Recv(t, sent, time.Minute); err != nil {
		t.Fatal(err)
	}
	if b := testutil.Recv(t, blocked, time.Minute); b.Active {
		t.Fatalf("second notification %+v, want unblocked", b)
	}
}

// TestAMQPOutboxBytes: Limits.AMQPOutboxBytes sets the AMQP listener's
// outbox limit, 16 MiB by default, raised to twice the largest message
// and 64 KiB; a negative one is refused.
func TestAMQPOutboxBytes(t *testing.T) {
	for _, c := range []struct {
		limits Limits
		want   int
	}{
		{Limits{}, 16 << 20},
		{Limits{AMQPOutboxBytes: 32 << 20}, 32 << 20},
		// Messages of at most 256 KiB - 64 KiB: the floor is 448 KiB.
		{Limits{MaxFrame: 256 << 10, AMQPOutboxBytes: 100 << 10}, 448 << 10},
	} {
		n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0", Limits: c.limits})
		if err != nil {
			t.Fatal(err)
		}
		got := n.amqp.OutboxLimit()
		n.Close()
		if got != c.want {
			t.Errorf("limits %+v: AMQP outbox limit %d, want %d", c.limits, got, c.want)
		}
	}
	if _, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0", Limits: Limits{AMQPOutboxBytes: -1}}); err == nil || !strings.Contains(err.Error(), "amqp_outbox_bytes") {
		t.Fatalf("a negative AMQP outbox: %v", err)
	}
}
