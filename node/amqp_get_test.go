package node

import (
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
)

// publishConfirmed publishes each body on the default exchange to queue
// and waits for the confirms.
func publishConfirmed(t *testing.T, ch *amqp091.Channel, exchange, key string, bodies ...string) {
	t.Helper()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, len(bodies)))
	ctx := testutil.Context(t, 30*time.Second)
	for _, b := range bodies {
		if err := ch.PublishWithContext(ctx, exchange, key, false, false, amqp091.Publishing{Body: []byte(b), ContentType: "text/plain"}); err != nil {
			t.Fatal(err)
		}
	}
	for range bodies {
		if c := testutil.Recv(t, confirms, 30*time.Second); !c.Ack {
			t.Fatalf("publication nacked: %+v", c)
		}
	}
}

// mustGet gets one message, which must be there.
func mustGet(t *testing.T, ch *amqp091.Channel, queue string, noAck bool) amqp091.Delivery {
	t.Helper()
	d, ok, err := ch.Get(queue, noAck)
	if err != nil || !ok {
		t.Fatalf("get from %s: ok %v, err %v", queue, ok, err)
	}
	return d
}

// TestAMQPBasicGet: get-empty on an empty queue, get-ok with the message
// count, no-ack and acked gets, a nack that requeues, a channel closed
// with a get unsettled, a Courier Submit got over AMQP, and a get from
// a queue's binding.
func TestAMQPBasicGet(t *testing.T) {
	n, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if _, err := ch.QueueDeclare("jobs", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ch.Get("jobs", false); ok || err != nil {
		t.Fatalf("get of an empty queue: ok %v, err %v; want get-empty", ok, err)
	}
	_, pch := amqpChannel(t, url)
	publishConfirmed(t, pch, "", "jobs", "one", "two", "three")

	d := mustGet(t, ch, "jobs", true)
	if string(d.Body) != "one" || d.MessageCount != 2 || d.Redelivered || d.RoutingKey != "jobs" || d.Exchange != "" || d.ContentType != "text/plain" {
		t.Fatalf("no-ack get: %q %+v", d.Body, d)
	}
	d = mustGet(t, ch, "jobs", false)
	if string(d.Body) != "two" || d.MessageCount != 1 {
		t.Fatalf("get: %q count %d", d.Body, d.MessageCount)
	}
	if err := d.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	// The requeued message comes back after the 1 ms retry backoff,
	// redelivered.
	var got []string
	testutil.WaitForf(t, 30*time.Second, func() bool {
		d, ok, err := ch.Get("jobs", false)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			got = append(got, string(d.Body))
			if string(d.Body) == "two" && !d.Redelivered {
				t.Fatal("the nacked message is not marked redelivered")
			}
			if err := d.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
		return len(got) == 2
	}, "the requeued message and the last one")
	if strings.Join(got, " ") != "three two" && strings.Join(got, " ") != "two three" {
		t.Fatalf("got %v, want two and three", got)
	}
	if q, err := ch.QueueDeclarePassive("jobs", true, false, false, false, nil); err != nil || q.Messages != 0 || q.Consumers != 0 {
		t.Fatalf("after the acks: %+v, %v; want empty, no consumers", q, err)
	}

	// A Courier Submit, got over AMQP, left unsettled when its channel
	// closes: back in the queue for the next get.
	ctx := testutil.Context(t, 30*time.Second)
	conn := n.Connect()
	defer conn.Close()
	tasks, err := conn.Tasks(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tasks.Submit(ctx, courier.Task{Body: []byte("native"), Header: map[string]string{"from": "courier"}}); err != nil {
		t.Fatal(err)
	}
	_, gch := amqpChannel(t, url)
	d = mustGet(t, gch, "jobs", false)
	if string(d.Body) != "native" || d.Headers["from"] != "courier" {
		t.Fatalf("the Courier task: %q %v", d.Body, d.Headers)
	}
	if err := gch.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForf(t, 30*time.Second, func() bool {
		d, ok, err := ch.Get("jobs", false)
		if err != nil {
			t.Fatal(err)
		}
		if ok && (string(d.Body) != "native" || !d.Redelivered) {
			t.Fatalf("got %q redelivered=%v, want the native task back", d.Body, d.Redelivered)
		}
		return ok && d.Ack(false) == nil
	}, "the unsettled get back in the queue")

	// A queue bound to an exchange: get takes what the exchange
	// publishes, with the exchange's name and the key.
	if err := ch.ExchangeDeclare("logs", "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("jobs", "app.*", "logs", false, nil); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, pch, "logs", "app.error", "bound")
	d = mustGet(t, ch, "jobs", false)
	if string(d.Body) != "bound" || d.Exchange != "logs" || d.RoutingKey != "app.error" || d.MessageCount != 0 {
		t.Fatalf("get from a binding: %q %+v", d.Body, d)
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ch.Get("jobs", false); ok || err != nil {
		t.Fatalf("get after all was taken: ok %v, err %v", ok, err)
	}
}

func TestAMQPBasicGetErrors(t *testing.T) {
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0", AdminUser: "admin", AdminPassword: "admin-passw0rd"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	admin := strings.Replace(n.AMQPURL(), "amqp://", "amqp://admin:admin-passw0rd@", 1) + "/"
	_, ch := amqpChannel(t, admin)
	_, _, err = ch.Get("missing", false)
	wantAMQPCode(t, err, amqp.NotFound)

	// A queue another connection declared exclusive: 405.
	_, ch = amqpChannel(t, admin)
	if _, err := ch.QueueDeclare("private", false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	_, other := amqpChannel(t, admin)
	_, _, err = other.Get("private", false)
	wantAMQPCode(t, err, amqp.ResourceLocked)

	// A Courier exchange that is not a queue: 406.
	if err := ch.ExchangeDeclare("events", "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, _, err = ch.Get("events", false)
	wantAMQPCode(t, err, amqp.PreconditionFailed)

	// Without the read permission: 403.
	_, ch = amqpChannel(t, admin)
	if _, err := ch.QueueDeclare("secret", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	perms := auth.Permissions{Configure: auth.Patterns{"mine"}, Write: auth.Patterns{"#"}, Read: auth.Patterns{"mine"}}
	if _, err := n.users.PutUser("bob", auth.UserChange{Password: "bob-passw0rd", Permissions: &perms}); err != nil {
		t.Fatal(err)
	}
	_, bch := amqpChannel(t, strings.Replace(n.AMQPURL(), "amqp://", "amqp://bob:bob-passw0rd@", 1)+"/")
	_, _, err = bch.Get("secret", false)
	wantAMQPCode(t, err, amqp.AccessRefused)

	// The delivery tag of a no-ack get cannot be acked: 406.
	publishConfirmed(t, ch, "", "secret", "x")
	d := mustGet(t, ch, "secret", true)
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	if err := ch.Ack(d.DeliveryTag, false); err != nil {
		t.Fatal(err)
	}
	if e := testutil.Recv(t, closed, 30*time.Second); e == nil || e.Code != amqp.PreconditionFailed {
		t.Fatalf("ack of a no-ack get: %v, want 406", e)
	}
}

// TestAMQPBasicGetNoAckSameKey: messages of one routing key in a bound
// queue are keyed; a no-ack get settles its message before answering,
// so the client's next get finds the next one of the key at once, never
// get-empty while one is ready.
func TestAMQPBasicGetNoAckSameKey(t *testing.T) {
	_, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if err := ch.ExchangeDeclare("keyed", "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("same-key", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("same-key", "k", "keyed", false, nil); err != nil {
		t.Fatal(err)
	}
	const n = 200
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = strconv.Itoa(i)
	}
	_, pch := amqpChannel(t, url)
	publishConfirmed(t, pch, "keyed", "k", bodies...)
	for i := range n {
		d, ok, err := ch.Get("same-key", true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("get %d of %d: get-empty with %d ready", i+1, n, n-i)
		}
		if string(d.Body) != bodies[i] {
			t.Fatalf("get %d: %q, want %q", i+1, d.Body, bodies[i])
		}
	}
}

// TestAMQPCloseReturnsDeliveries: once a client's connection.close has
// its close-ok, what its consumers held unacked is back in the queue,
// counted as a failed attempt (redelivered), as in RabbitMQ.
func TestAMQPCloseReturnsDeliveries(t *testing.T) {
	n, url := amqpNode(t)
	c, ch := amqpChannel(t, url)
	if _, err := ch.QueueDeclare("held", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, pch := amqpChannel(t, url)
	publishConfirmed(t, pch, "", "held", "one")
	ds, err := ch.Consume("held", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Recv(t, ds, 30*time.Second)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// No waiting: close-ok came after the return.
	q := n.broker.Queue("held")
	if q == nil {
		t.Fatal("no queue held")
	}
	if st := q.Stats(); st.Unacked != 0 || st.Consumers != 0 {
		t.Fatalf("after close-ok: %d unacked, %d consumers; want none", st.Unacked, st.Consumers)
	}
}
