package node

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestAMQPRPCToCourierHandler: an AMQP publication on the default
// exchange, keyed by a Courier request-response exchange and with
// reply_to, is a Courier request; the Go handler's response comes back
// to reply_to (direct reply-to, or a reply queue) with the
// correlation_id, and a handler's error as a reply with its text.
func TestAMQPRPCToCourierHandler(t *testing.T) {
	n, url := amqpNode(t)
	ctx := testutil.Context(t, 60*time.Second)
	rr, err := n.Connect().ReqResp(ctx, "fib")
	if err != nil {
		t.Fatal(err)
	}
	fib := func(k int) int {
		a, b := 0, 1
		for range k {
			a, b = b, a+b
		}
		return a
	}
	if _, err := rr.Handle(ctx, func(r *courier.Request) {
		k, err := strconv.Atoi(string(r.Body()))
		if err != nil {
			r.Fail(errors.New("not a number"))
			return
		}
		r.Reply([]byte(strconv.Itoa(fib(k))))
	}); err != nil {
		t.Fatal(err)
	}
	_, ch := amqpChannel(t, url)
	call := func(replyTo string, replies <-chan amqp091.Delivery, corr, body string) amqp091.Delivery {
		t.Helper()
		if err := ch.Publish("", "fib", false, false, amqp091.Publishing{ReplyTo: replyTo, CorrelationId: corr, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
		d := testutil.Recv(t, replies, 30*time.Second)
		if d.CorrelationId != corr {
			t.Fatalf("reply with correlation_id %q, want %q", d.CorrelationId, corr)
		}
		return d
	}

	t.Run("direct reply-to", func(t *testing.T) {
		replies, err := ch.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d := call("amq.rabbitmq.reply-to", replies, "c1", "30"); string(d.Body) != "832040" {
			t.Fatalf("fib(30) = %q", d.Body)
		}
		d := call("amq.rabbitmq.reply-to", replies, "c2", "x")
		if string(d.Body) != "not a number" || d.Headers["x-courier-error"] != "not a number" {
			t.Fatalf("error reply %q %v", d.Body, d.Headers)
		}
	})

	t.Run("no handler", func(t *testing.T) {
		if _, err := n.Connect().ReqResp(ctx, "idle"); err != nil {
			t.Fatal(err)
		}
		_, ch3 := amqpChannel(t, url)
		replies, err := ch3.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := ch3.Publish("", "idle", false, false, amqp091.Publishing{ReplyTo: "amq.rabbitmq.reply-to", CorrelationId: "c9", Expiration: "200"}); err != nil {
			t.Fatal(err)
		}
		d := testutil.Recv(t, replies, 30*time.Second)
		if d.CorrelationId != "c9" || d.Headers["x-courier-error"] == nil {
			t.Fatalf("reply %q correlation %q headers %v", d.Body, d.CorrelationId, d.Headers)
		}
		t.Logf("reply to a request without a handler: %q %v", d.Body, d.Headers)
	})

	t.Run("without reply_to", func(t *testing.T) {
		_, ch2 := amqpChannel(t, url)
		if err := ch2.Confirm(false); err != nil {
			t.Fatal(err)
		}
		confirms := ch2.NotifyPublish(make(chan amqp091.Confirmation, 1))
		if err := ch2.Publish("", "fib", false, false, amqp091.Publishing{Body: []byte("1")}); err != nil {
			t.Fatal(err)
		}
		if c := testutil.Recv(t, confirms, 30*time.Second); c.Ack {
			t.Fatal("a request without reply_to was confirmed")
		}
	})

	t.Run("reply queue", func(t *testing.T) {
		_, ch2 := amqpChannel(t, url)
		q, err := ch2.QueueDeclare("", false, false, true, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		replies, err := ch2.Consume(q.Name, "", true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d := call(q.Name, replies, "c3", "10"); string(d.Body) != "55" {
			t.Fatalf("fib(10) = %q", d.Body)
		}
	})
}

// TestAMQPDirectReplyTo: RabbitMQ's direct reply-to between two AMQP
// programs: the server replies to the rewritten reply_to on the default
// exchange, and the reply reaches the requester's no-ack consumer.
func TestAMQPDirectReplyTo(t *testing.T) {
	_, url := amqpNode(t)
	_, srv := amqpChannel(t, url)
	if _, err := srv.QueueDeclare("rpc_queue", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	reqs, err := srv.Consume("rpc_queue", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range reqs {
			srv.Publish("", d.ReplyTo, false, false, amqp091.Publishing{CorrelationId: d.CorrelationId, Body: append([]byte("re: "), d.Body...)})
			d.Ack(false)
		}
	}()
	_, cli := amqpChannel(t, url)
	// Without a consumer of amq.rabbitmq.reply-to, reply_to is refused.
	// The refusal closes the channel asynchronously: wait for the close
	// rather than racing a following method against it.
	_, other := amqpChannel(t, url)
	closed := other.NotifyClose(make(chan *amqp091.Error, 1))
	if err := other.Publish("", "rpc_queue", false, false, amqp091.Publishing{ReplyTo: "amq.rabbitmq.reply-to", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	wantAMQPCode(t, testutil.Recv(t, closed, 30*time.Second), 406)
	// A consumer that acks is refused.
	_, acking := amqpChannel(t, url)
	_, err = acking.Consume("amq.rabbitmq.reply-to", "", false, false, false, false, nil)
	wantAMQPCode(t, err, 406)

	replies, err := cli.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, body := range []string{"one", "two"} {
		corr := strconv.Itoa(i)
		if err := cli.Publish("", "rpc_queue", false, false, amqp091.Publishing{ReplyTo: "amq.rabbitmq.reply-to", CorrelationId: corr, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
		d := testutil.Recv(t, replies, 30*time.Second)
		if string(d.Body) != "re: "+body || d.CorrelationId != corr {
			t.Fatalf("reply %q correlation %q", d.Body, d.CorrelationId)
		}
	}
}

// TestAMQPRequestRefused: a request the broker refuses (no write
// permission on the request-response exchange) comes back as an error
// reply, as a failed request does.
func TestAMQPRequestRefused(t *testing.T) {
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0", AdminUser: "admin", AdminPassword: "admin-passw0rd"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := testutil.Context(t, 30*time.Second)
	if _, err := n.Connect().ReqResp(ctx, "svc"); err != nil {
		t.Fatal(err)
	}
	perms := auth.Permissions{Read: auth.Patterns{"#"}}
	if _, err := n.users.PutUser("bob", auth.UserChange{Password: "bob-passw0rd", Permissions: &perms}); err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(n.AMQPURL(), "amqp://", "amqp://bob:bob-passw0rd@", 1) + "/"
	_, ch := amqpChannel(t, url)
	replies, err := ch.Consume("amq.rabbitmq.reply-to", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish("", "svc", false, false, amqp091.Publishing{ReplyTo: "amq.rabbitmq.reply-to", CorrelationId: "r1"}); err != nil {
		t.Fatal(err)
	}
	d := testutil.Recv(t, replies, 30*time.Second)
	if d.CorrelationId != "r1" || d.Headers["x-courier-error"] == nil {
		t.Fatalf("reply %q correlation %q headers %v", d.Body, d.CorrelationId, d.Headers)
	}
}
