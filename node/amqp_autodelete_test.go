package node

import (
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/testutil"
)

// queueGone reports whether the AMQP queue no longer exists, with a
// passive declare on a fresh channel (a 404 closes the channel).
func queueGone(t *testing.T, url, queue string) bool {
	t.Helper()
	_, ch := amqpChannel(t, url)
	_, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	return err != nil
}

// TestAMQPAutoDeleteQueue: an auto-delete queue stays while it never had
// a consumer and while one of its consumers remains, and goes, with its
// bindings, when the last one goes, whether cancelled or with its
// connection.
func TestAMQPAutoDeleteQueue(t *testing.T) {
	n, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if _, err := ch.QueueDeclare("tmp", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("events", "fanout", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("tmp", "", "events", false, nil); err != nil {
		t.Fatal(err)
	}
	if queueGone(t, url, "tmp") {
		t.Fatal("an auto-delete queue that never had a consumer was deleted")
	}
	if _, err := ch.Consume("tmp", "first", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	other, och := amqpChannel(t, url)
	if _, err := och.Consume("tmp", "second", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Cancel("first", false); err != nil {
		t.Fatal(err)
	}
	if queueGone(t, url, "tmp") {
		t.Fatal("the auto-delete queue went while a consumer remained")
	}
	// The last consumer goes with its connection.
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForf(t, 30*time.Second, func() bool { return queueGone(t, url, "tmp") }, "the auto-delete queue deleted")
	for _, x := range boundExchanges(n) {
		if x == "events" {
			t.Fatal("the deleted queue's binding remains")
		}
	}

	// A consumer cancelled is a last consumer too.
	if _, err := ch.QueueDeclare("tmp2", true, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Consume("tmp2", "only", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Cancel("only", false); err != nil {
		t.Fatal(err)
	}
	if !queueGone(t, url, "tmp2") {
		t.Fatal("the auto-delete queue remains after its only consumer was cancelled")
	}
}

// boundExchanges lists the exchanges the AMQP queue tmp is bound to.
func boundExchanges(n *Node) []string {
	_, _, subs := n.broker.Definitions()
	var xs []string
	for _, d := range subs {
		if d.Name == "amqp.tmp" {
			xs = append(xs, d.Exchange)
		}
	}
	return xs
}

// TestAMQPDeadLetterRoutingKey: the default exchange with
// x-dead-letter-routing-key K sends a queue's dead letters to queue K,
// as in RabbitMQ; a routing key without x-dead-letter-exchange is 406,
// and with another exchange 540.
func TestAMQPDeadLetterRoutingKey(t *testing.T) {
	_, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if _, err := ch.QueueDeclare("dlq", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	args := amqp091.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}
	if _, err := ch.QueueDeclare("orders", true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	// The same arguments again are the same queue.
	if _, err := ch.QueueDeclare("orders", true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "orders", "bad order")
	d := mustGet(t, ch, "orders", false)
	if err := d.Reject(false); err != nil {
		t.Fatal(err)
	}
	var dead amqp091.Delivery
	testutil.WaitForf(t, 30*time.Second, func() bool {
		var ok bool
		var err error
		dead, ok, err = ch.Get("dlq", true)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}, "the rejected message in dlq")
	if string(dead.Body) != "bad order" || dead.Headers["x-death-queue"] != "orders" {
		t.Fatalf("dead letter %q %v", dead.Body, dead.Headers)
	}

	_, ch = amqpChannel(t, url)
	_, err := ch.QueueDeclare("bad", true, false, false, false, amqp091.Table{"x-dead-letter-routing-key": "dlq"})
	wantAMQPCode(t, err, amqp.PreconditionFailed)
	_, ch = amqpChannel(t, url)
	_, err = ch.QueueDeclare("bad", true, false, false, false, amqp091.Table{"x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "k"})
	wantAMQPCode(t, err, amqp.NotImplemented)
}

// exchangeGone reports whether the exchange no longer exists, with a
// passive declare on a fresh channel.
func exchangeGone(t *testing.T, url, exchange string) bool {
	t.Helper()
	_, ch := amqpChannel(t, url)
	return ch.ExchangeDeclarePassive(exchange, "fanout", false, true, false, false, nil) != nil
}

// TestAMQPAutoDeleteExchange: an auto-delete exchange stays until it has
// had a queue bound, and goes when its last binding goes, by
// queue.unbind or with its queue.
func TestAMQPAutoDeleteExchange(t *testing.T) {
	_, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	for _, x := range []string{"ad1", "ad2"} {
		if err := ch.ExchangeDeclare(x, "direct", false, true, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if exchangeGone(t, url, "ad1") {
		t.Fatal("an auto-delete exchange that never had a binding was deleted")
	}
	for _, q := range []string{"qa", "qb"} {
		if _, err := ch.QueueDeclare(q, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		if err := ch.QueueBind(q, "k", "ad1", false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.QueueBind("qa", "k2", "ad1", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueUnbind("qa", "k", "ad1", nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueUnbind("qa", "k2", "ad1", nil); err != nil {
		t.Fatal(err)
	}
	if exchangeGone(t, url, "ad1") {
		t.Fatal("the auto-delete exchange went while qb was bound")
	}
	if err := ch.QueueUnbind("qb", "k", "ad1", nil); err != nil {
		t.Fatal(err)
	}
	if !exchangeGone(t, url, "ad1") {
		t.Fatal("the auto-delete exchange remains after its last unbind")
	}
	// The last binding going with its queue.
	if err := ch.QueueBind("qa", "k", "ad2", false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete("qa", false, false, false); err != nil {
		t.Fatal(err)
	}
	if !exchangeGone(t, url, "ad2") {
		t.Fatal("the auto-delete exchange remains after its last bound queue was deleted")
	}
}

// TestAMQPQueueDeleteIfUnusedIfEmpty: queue.delete if-empty refuses a
// queue with messages, if-unused one with a consumer, both with 406;
// delete-ok counts the messages deleted.
func TestAMQPQueueDeleteIfUnusedIfEmpty(t *testing.T) {
	node, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if _, err := ch.QueueDeclare("d1", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "d1", "a", "b")
	_, err := ch.QueueDelete("d1", false, true, false)
	wantAMQPCode(t, err, amqp.PreconditionFailed)

	_, cch := amqpChannel(t, url)
	if _, err := cch.Consume("d1", "c", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, ch = amqpChannel(t, url)
	_, err = ch.QueueDelete("d1", true, false, false)
	wantAMQPCode(t, err, amqp.PreconditionFailed)
	// The no-ack consumer takes both, each acked once written: wait for
	// both acks before cancelling, or a cancel that comes first returns
	// what is not acked yet to the queue.
	testutil.WaitForf(t, 30*time.Second, func() bool {
		return node.broker.Queue("d1").Stats().Messages() == 0
	}, "d1 empty")
	if err := cch.Cancel("c", false); err != nil {
		t.Fatal(err)
	}
	// The queue is unused and empty now.
	_, ch = amqpChannel(t, url)
	n, err := ch.QueueDelete("d1", true, true, false)
	if err != nil || n != 0 {
		t.Fatalf("delete if-unused if-empty of an unused empty queue: %d, %v", n, err)
	}
	// delete-ok counts what it deleted.
	if _, err := ch.QueueDeclare("d2", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "d2", "x", "y", "z")
	if n, err := ch.QueueDelete("d2", false, false, false); err != nil || n != 3 {
		t.Fatalf("delete of a queue of 3: %d, %v", n, err)
	}
}
