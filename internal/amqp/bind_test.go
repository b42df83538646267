package amqp

import (
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// recv returns the next delivery, or fails after wait.
func recv(t *testing.T, ds <-chan amqp091.Delivery) amqp091.Delivery {
	t.Helper()
	select {
	case d := <-ds:
		return d
	case <-time.After(wait):
		t.Fatal("no delivery")
	}
	return amqp091.Delivery{}
}

// none checks that nothing more is delivered: a marker published to the
// queue itself comes first.
func none(t *testing.T, ch *amqp091.Channel, queue string, ds <-chan amqp091.Delivery) {
	t.Helper()
	if err := ch.Publish("", queue, false, false, amqp091.Publishing{Body: []byte("marker")}); err != nil {
		t.Fatal(err)
	}
	if d := recv(t, ds); string(d.Body) != "marker" {
		t.Fatalf("got %q (key %q) where nothing was to be delivered", d.Body, d.RoutingKey)
	}
}

// Queues bound to direct, topic and fanout exchanges get what matches,
// with RabbitMQ's semantics; unbinding stops it.
func TestQueueBind(t *testing.T) {
	_, url := queueServer(t, Config{})
	ch := channelOf(t, dial(t, url))
	for _, x := range []struct{ name, kind string }{{"logs", "fanout"}, {"direct_logs", "direct"}, {"topic_logs", "topic"}} {
		if err := ch.ExchangeDeclare(x.name, x.kind, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	pub := func(x, key, body string) {
		t.Helper()
		if err := ch.Publish(x, key, false, false, amqp091.Publishing{Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct{ key, x string }{{"", "logs"}, {"error", "direct_logs"}, {"kern.*", "topic_logs"}, {"*.critical", "topic_logs"}} {
		if err := ch.QueueBind(q.Name, b.key, b.x, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := ch.Consume(q.Name, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub("logs", "anything", "f1")
	if d := recv(t, ds); string(d.Body) != "f1" || d.Exchange != "logs" || d.RoutingKey != "anything" {
		t.Fatalf("fanout: %q from %q key %q", d.Body, d.Exchange, d.RoutingKey)
	}
	pub("direct_logs", "info", "no")
	pub("direct_logs", "error", "d1")
	if d := recv(t, ds); string(d.Body) != "d1" || d.Exchange != "direct_logs" {
		t.Fatalf("direct: %q from %q", d.Body, d.Exchange)
	}
	pub("topic_logs", "kern.info.x", "no")
	pub("topic_logs", "kern.info", "t1")
	if d := recv(t, ds); string(d.Body) != "t1" {
		t.Fatalf("topic: %q", d.Body)
	}
	pub("topic_logs", "app.critical", "t2")
	if d := recv(t, ds); string(d.Body) != "t2" {
		t.Fatalf("topic: %q", d.Body)
	}
	none(t, ch, q.Name, ds)

	// Unbound: the exchange's messages no longer come.
	if err := ch.QueueUnbind(q.Name, "kern.*", "topic_logs", nil); err != nil {
		t.Fatal(err)
	}
	pub("topic_logs", "kern.info", "no")
	pub("topic_logs", "db.critical", "t3")
	if d := recv(t, ds); string(d.Body) != "t3" {
		t.Fatalf("after unbind: %q", d.Body)
	}
	if err := ch.QueueUnbind(q.Name, "*.critical", "topic_logs", nil); err != nil {
		t.Fatal(err)
	}
	pub("topic_logs", "db.critical", "no")
	none(t, ch, q.Name, ds)

	// Bound while consuming: the consumer takes from it at once.
	if err := ch.QueueBind(q.Name, "late", "direct_logs", false, nil); err != nil {
		t.Fatal(err)
	}
	pub("direct_logs", "late", "d2")
	if d := recv(t, ds); string(d.Body) != "d2" {
		t.Fatalf("late binding: %q", d.Body)
	}

	// Errors.
	wantCode(t, channelOf(t, dial(t, url)).QueueBind("nope", "k", "logs", false, nil), NotFound)
	wantCode(t, channelOf(t, dial(t, url)).QueueBind("q", "k", "nope", false, nil), NotFound)
	wantCode(t, channelOf(t, dial(t, url)).QueueBind("q", "k", "", false, nil), AccessRefused)
	wantCode(t, channelOf(t, dial(t, url)).QueueBind(q.Name, "k", "logs", false, nil), ResourceLocked)
}

// A message published while no one consumes waits in the binding, and
// deleting the queue deletes its bindings.
func TestQueueBindKeepsMessages(t *testing.T) {
	_, url := queueServer(t, Config{})
	ch := channelOf(t, dial(t, url))
	if err := ch.ExchangeDeclare("tx", "topic", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("q", "a.#", "tx", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish("tx", "a.b.c", false, false, amqp091.Publishing{Body: []byte("kept")}); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume("q", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := recv(t, ds)
	if string(d.Body) != "kept" || d.RoutingKey != "a.b.c" {
		t.Fatalf("got %q key %q", d.Body, d.RoutingKey)
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete("q", false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	ch.Publish("tx", "a.b", false, false, amqp091.Publishing{Body: []byte("lost")})
	ds, err = ch.Consume("q", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	none(t, ch, "q", ds)
}

// An exclusive queue's bindings go with it when its connection closes;
// what is not built fails loudly.
func TestQueueBindExclusiveAndRefusals(t *testing.T) {
	s, url := queueServer(t, Config{})
	b := s.cfg.Broker
	c := dial(t, url)
	ch := channelOf(t, c)
	for _, x := range []struct{ name, kind string }{{"d", "direct"}, {"h", "headers"}} {
		if err := ch.ExchangeDeclare(x.name, x.kind, false, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	q, err := ch.QueueDeclare("", false, false, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "k", "d", false, nil); err != nil {
		t.Fatal(err)
	}
	if xs := boundExchanges(b, q.Name); len(xs) != 1 || xs[0] != "d" {
		t.Fatalf("bound to %v", xs)
	}
	other := dial(t, url)
	wantCode(t, channelOf(t, other).QueueBind("q", "k", "d", false, amqp091.Table{"a": "1"}), NotImplemented)
	wantCode(t, channelOf(t, dial(t, url)).QueueBind("q", "a.*", "d", false, nil), NotImplemented)
	c.Close()
	for deadline := time.Now().Add(wait); len(boundExchanges(b, q.Name)) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("the exclusive queue's binding outlived its connection: %v", boundExchanges(b, q.Name))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
