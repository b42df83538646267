package node

import (
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestAMQPBindingTakesCourierPublish: an AMQP queue bound to an exchange
// receives what a Courier-native publisher publishes to it, and a
// durable queue's binding to a durable exchange survives a restart with
// the messages it kept.
func TestAMQPBindingTakesCourierPublish(t *testing.T) {
	dir := t.TempDir()
	start := func() (*Node, string) {
		t.Helper()
		n, err := Start(Config{DataDir: dir, Log: quiet, AMQP: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		return n, strings.Replace(n.AMQPURL(), "amqp://", "amqp://guest:guest@", 1) + "/"
	}
	n, url := start()
	c, ch := amqpChannel(t, url)
	if err := ch.ExchangeDeclare("prices", "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("eu-prices", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("eu-prices", "eu.#", "prices", false, nil); err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 60*time.Second)
	conn := n.Connect()
	ps, err := conn.PubSub(ctx, "prices")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"us.ibm", "eu.sap", "eu.de.bmw"} {
		if err := ps.Publish(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := ch.Consume("eu-prices", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := testutil.Recv(t, ds, 30*time.Second)
	if string(d.Body) != "eu.sap" || d.RoutingKey != "eu.sap" || d.Exchange != "prices" {
		t.Fatalf("got %q key %q from %q", d.Body, d.RoutingKey, d.Exchange)
	}
	d.Ack(false)
	// Left unacked: kept through the restart.
	d = testutil.Recv(t, ds, 30*time.Second)
	if string(d.Body) != "eu.de.bmw" {
		t.Fatalf("got %q", d.Body)
	}
	conn.Close()
	c.Close()
	n.Close()

	n, url = start()
	defer n.Close()
	_, ch = amqpChannel(t, url)
	ds, err = ch.Consume("eu-prices", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := testutil.Recv(t, ds, 30*time.Second); string(d.Body) != "eu.de.bmw" || !d.Redelivered {
		t.Fatalf("after the restart: %q redelivered %v", d.Body, d.Redelivered)
	} else {
		d.Ack(false)
	}
	// The binding holds: a new publication matching it arrives.
	if err := ch.Publish("prices", "eu.fr.airbus", false, false, amqp091.Publishing{Body: []byte("airbus")}); err != nil {
		t.Fatal(err)
	}
	if d := testutil.Recv(t, ds, 30*time.Second); string(d.Body) != "airbus" {
		t.Fatalf("after the restart: %q", d.Body)
	}
}

// TestAMQPLongCourierKeyAndHeaders: a Courier-native publication whose
// key, and headers, no AMQP short string or table can carry still
// reaches the AMQP consumer of a bound queue: the key cut to 255 octets,
// the header named past 255 left out, a long message-id in the table
// as x-courier-message-id. (Before, its delivery failed to encode and
// was held unacknowledged, never sent.)
func TestAMQPLongCourierKeyAndHeaders(t *testing.T) {
	n, url := amqpNode(t)
	_, ch := amqpChannel(t, url)
	if err := ch.ExchangeDeclare("long", "fanout", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("longq", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("longq", "", "long", false, nil); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume("longq", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 30*time.Second)
	conn := n.Connect()
	defer conn.Close()
	ps, err := conn.PubSub(ctx, "long")
	if err != nil {
		t.Fatal(err)
	}
	key, id := strings.Repeat("k", 300), strings.Repeat("i", 300)
	if err := ps.PublishSync(ctx, courier.Message{Key: key, Header: map[string]string{strings.Repeat("h", 300): "x", "message-id": id, "ok": "1"}, Body: []byte("long")}); err != nil {
		t.Fatal(err)
	}
	d := testutil.Recv(t, ds, 30*time.Second)
	if string(d.Body) != "long" || d.RoutingKey != key[:255] || d.MessageId != "" || d.Headers["x-courier-message-id"] != id || d.Headers["ok"] != "1" || len(d.Headers) != 2 {
		t.Fatalf("got %q key of %d octets, message-id %q, headers %v", d.Body, len(d.RoutingKey), d.MessageId, d.Headers)
	}
	d.Ack(false)
}
