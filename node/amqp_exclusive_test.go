package node

import (
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestAMQPExclusiveConsumer: basic.consume exclusive=true has RabbitMQ's
// semantics: refused with 403 when the queue has another consumer (AMQP
// or a Courier worker), and while it consumes, every other consumer of
// the queue, on any connection, is refused with 403; once it is
// cancelled, or its connection closes, others consume again.
func TestAMQPExclusiveConsumer(t *testing.T) {
	n, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if _, err := ch.QueueDeclare("ex", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	// An exclusive consumer of a queue with another consumer: 403.
	if _, err := ch.Consume("ex", "shared", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, ch2 := amqpChannel(t, url)
	_, err := ch2.Consume("ex", "", false, true, false, false, nil)
	wantAMQPCode(t, err, amqp.AccessRefused)
	if err := ch.Cancel("shared", false); err != nil {
		t.Fatal(err)
	}

	// A Courier worker counts as another consumer too.
	cc := n.Connect()
	defer cc.Close()
	ctx := testutil.Context(t, 30*time.Second)
	jobs, err := cc.Tasks(ctx, "ex")
	if err != nil {
		t.Fatal(err)
	}
	w, err := jobs.Work(ctx, func(*courier.Job) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	_, ch2 = amqpChannel(t, url)
	_, err = ch2.Consume("ex", "", false, true, false, false, nil)
	wantAMQPCode(t, err, amqp.AccessRefused)
	if err := w.Detach(ctx); err != nil {
		t.Fatal(err)
	}

	// Alone on the queue, an exclusive consumer is accepted; while it
	// consumes, other consumers are refused, on its connection and on
	// others, exclusive or not.
	c3, ch3 := amqpChannel(t, url)
	msgs, err := ch3.Consume("ex", "only", false, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, exclusive := range []bool{false, true} {
		_, other := amqpChannel(t, url)
		_, err = other.Consume("ex", "", false, exclusive, false, false, nil)
		wantAMQPCode(t, err, amqp.AccessRefused)
		same, err := c3.Channel()
		if err != nil {
			t.Fatal(err)
		}
		_, err = same.Consume("ex", "", false, exclusive, false, false, nil)
		wantAMQPCode(t, err, amqp.AccessRefused)
	}
	// It takes the queue's messages.
	_, pub := amqpChannel(t, url)
	publishConfirmed(t, pub, "", "ex", "m1")
	if d := testutil.Recv(t, msgs, 30*time.Second); string(d.Body) != "m1" {
		t.Fatalf("exclusive consumer got %q", d.Body)
	} else if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}

	// Cancelled, it lets others consume.
	if err := ch3.Cancel("only", false); err != nil {
		t.Fatal(err)
	}
	_, ch4 := amqpChannel(t, url)
	c5, ch5 := amqpChannel(t, url)
	if _, err := ch4.Consume("ex", "", false, false, false, false, nil); err != nil {
		t.Fatalf("a consumer after the exclusive one was cancelled: %v", err)
	}
	ch4.Close()
	// Its connection closing lets others consume too.
	if _, err := ch5.Consume("ex", "", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	c5.Close()
	_, ch6 := amqpChannel(t, url)
	if _, err := ch6.Consume("ex", "", false, true, false, false, nil); err != nil {
		t.Fatalf("an exclusive consumer after the last one's connection closed: %v", err)
	}
}
