package node

import (
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestAMQPMandatoryReturn: a mandatory publication that reaches no queue
// and no subscriber comes back with basic.return 312 NO_ROUTE, before its
// confirm; one that is routed (a bound queue, a Courier subscriber, an
// existing queue on the default exchange) does not.
func TestAMQPMandatoryReturn(t *testing.T) {
	n, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if err := ch.ExchangeDeclare("logs", "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("errors", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("errors", "error", "logs", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	// amqp091 reads frames in one goroutine and hands each to its
	// channel in order: once a confirm is received, a return sent
	// before it is already buffered.
	returns := ch.NotifyReturn(make(chan amqp091.Return, 1))
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 1))
	ctx := testutil.Context(t, 30*time.Second)
	publish := func(exchange, key string, returned bool) {
		t.Helper()
		err := ch.PublishWithContext(ctx, exchange, key, true, false, amqp091.Publishing{ContentType: "text/plain", MessageId: "m-" + key, Body: []byte("to " + key)})
		if err != nil {
			t.Fatal(err)
		}
		if c := testutil.Recv(t, confirms, 30*time.Second); !c.Ack {
			t.Fatalf("publication to %q %q nacked", exchange, key)
		}
		select {
		case r := <-returns:
			if !returned {
				t.Fatalf("a routed publication to %q %q was returned: %+v", exchange, key, r)
			}
			if r.ReplyCode != amqp.NoRoute || r.ReplyText != "NO_ROUTE" || r.Exchange != exchange || r.RoutingKey != key ||
				string(r.Body) != "to "+key || r.ContentType != "text/plain" || r.MessageId != "m-"+key {
				t.Fatalf("return %+v", r)
			}
		default:
			if returned {
				t.Fatalf("the publication to %q %q reached nothing and was not returned before its confirm", exchange, key)
			}
		}
	}
	publish("logs", "info", true)
	publish("logs", "error", false)
	publish("", "nowhere", true)
	publish("", "errors", false)

	// A Courier-native subscriber is a route.
	conn := n.Connect()
	defer conn.Close()
	ps, err := conn.PubSub(ctx, "logs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Subscribe(ctx, "info", func(*courier.Delivery) {}); err != nil {
		t.Fatal(err)
	}
	publish("logs", "info", false)

	// Without confirms, the return comes all the same.
	_, pch := amqpChannel(t, url)
	plain := pch.NotifyReturn(make(chan amqp091.Return, 1))
	if err := pch.PublishWithContext(ctx, "logs", "debug", true, false, amqp091.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if r := testutil.Recv(t, plain, 30*time.Second); r.ReplyCode != amqp.NoRoute || r.RoutingKey != "debug" {
		t.Fatalf("return without confirms: %+v", r)
	}

	// immediate is refused, as by RabbitMQ 3: 540, closing the connection.
	c, ich := amqpChannel(t, url)
	closed := c.NotifyClose(make(chan *amqp091.Error, 1))
	if err := ich.PublishWithContext(ctx, "logs", "info", false, true, amqp091.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if e := testutil.Recv(t, closed, 30*time.Second); e == nil || e.Code != amqp.NotImplemented {
		t.Fatalf("immediate: %v, want 540", e)
	}
}
