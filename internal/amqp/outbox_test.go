package amqp

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/broker"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// queueServer starts a server on a broker with a transient queue "q".
func queueServer(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	b := broker.New(broker.Config{Log: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { b.Close() })
	cfg.Broker = b
	s, url := startServer(t, cfg)
	ch, err := dial(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	return s, url
}

// stalledConsumer is a raw client that consumes q with prefetch and then
// reads nothing more.
func stalledConsumer(t *testing.T, url string, prefetch uint16) *rawClient {
	t.Helper()
	rc := rawDial(t, url)
	rc.open(0)
	rc.method(1, &BasicQos{PrefetchCount: prefetch})
	if _, ok := rc.next().(*BasicQosOK); !ok {
		t.Fatal("no qos-ok")
	}
	rc.method(1, &BasicConsume{Queue: "q", ConsumerTag: "stalled"})
	if _, ok := rc.next().(*BasicConsumeOK); !ok {
		t.Fatal("no consume-ok")
	}
	return rc
}

// publishN publishes n messages of size octets to q, confirmed.
func publishN(t *testing.T, url string, n, size int) {
	t.Helper()
	if err := publish(dial(t, url), n, size); err != nil {
		t.Fatal(err)
	}
}

func publish(c *amqp091.Connection, n, size int) error {
	ch, err := c.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	body := make([]byte, size)
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", "q", false, false, amqp091.Publishing{MessageId: fmt.Sprint(i), Body: body})
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			return fmt.Errorf("publication %d not confirmed: %v", i, err)
		}
	}
	return nil
}

// consumeN receives n messages on a fresh consumer of q with prefetch 1,
// acking each, within wait.
func consumeN(t *testing.T, url string, n int) {
	t.Helper()
	ch, err := dial(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	ch.Qos(1, 0, false)
	ds, err := ch.Consume("q", "fast", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	timeout := time.After(2 * wait)
	for got := 0; got < n; got++ {
		select {
		case d := <-ds:
			d.Ack(false)
		case <-timeout:
			t.Fatalf("the reading consumer got %d of %d messages", got, n)
		}
	}
}

// A consumer that stops reading holds up no other consumer of its queue:
// the broker's goroutine that delivers to it never waits on its socket.
// (Before the outbox, deliveries were written on that goroutine, so the
// other consumer got nothing until the write timeout cut the stalled
// one: the megabytes held for the stalled client are far more than
// loopback socket buffers take.)
func TestStalledConsumerHoldsNobody(t *testing.T) {
	const prefetch, size = 100, 512 << 10
	s, url := queueServer(t, Config{WriteTimeout: 10 * time.Minute, OutboxLimit: 2 * prefetch * size})
	stalledConsumer(t, url, prefetch)
	pc := dial(t, url)
	published := make(chan error, 1)
	go func() { published <- publish(pc, 2*prefetch, size) }()
	// The stalled consumer holds at most its prefetch; the reader gets
	// the rest while the stalled client stays connected.
	consumeN(t, url, prefetch)
	if n := s.Conns(); n != 4 {
		t.Fatalf("%d connections, want 4: the stalled one was cut", n)
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
}

// A client with more than OutboxLimit waiting for it is cut off as a
// slow consumer, and its deliveries go to the consumer that reads.
func TestSlowConsumerCutAtLimit(t *testing.T) {
	const prefetch, size, n = 100, 64 << 10, 200
	_, url := queueServer(t, Config{WriteTimeout: 10 * time.Minute, OutboxLimit: 1 << 20, MaxMessage: 128 << 10})
	rc := stalledConsumer(t, url, prefetch)
	publishN(t, url, n, size)
	consumeN(t, url, n)
	rc.nc.SetReadDeadline(time.Now().Add(wait))
	rc.wantEOFAfterData()
}

// A client that takes nothing for the write timeout is cut off, however
// little waits for it.
func TestSlowConsumerCutAtWriteTimeout(t *testing.T) {
	const prefetch, size, n = 100, 256 << 10, 100
	_, url := queueServer(t, Config{WriteTimeout: time.Second, OutboxLimit: 1 << 30})
	rc := stalledConsumer(t, url, prefetch)
	publishN(t, url, n, size)
	consumeN(t, url, n)
	rc.nc.SetReadDeadline(time.Now().Add(wait))
	rc.wantEOFAfterData()
}

// wantEOFAfterData reads until the server closes the connection.
func (rc *rawClient) wantEOFAfterData() {
	rc.t.Helper()
	for {
		if _, err := rc.r.ReadFrame(); err != nil {
			if isTimeout(err) {
				rc.t.Fatal("the connection stayed open")
			}
			return
		}
	}
}
