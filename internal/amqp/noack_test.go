package amqp

import (
	"log/slog"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/testutil"
)

// A no-ack consumer delivers at most once: a consumer cancelled while
// its deliveries still wait in the outbox (the client does not read)
// still gets every one of them, and none goes back to the queue to be
// delivered again. (Before, a no-ack delivery was acked only once
// written: the cancel's DETACH gave the broker back the deliveries the
// outbox still held, which were then written all the same and delivered
// again to the next consumer. The 64 MiB held are far more than loopback
// socket buffers take, so most of them wait in the outbox.)
func TestNoAckAtMostOnce(t *testing.T) {
	const n, size = 64, 1 << 20
	b := broker.New(broker.Config{Log: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { b.Close() })
	_, url := startServer(t, Config{Broker: b, WriteTimeout: 10 * time.Minute, OutboxLimit: 1 << 30, MaxMessage: 2 << 20})
	ch, err := dial(t, url).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("q", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}

	rc := rawDial(t, url)
	rc.open(0)
	rc.method(1, &BasicConsume{Queue: "q", ConsumerTag: "na", NoAck: true})
	if _, ok := rc.next().(*BasicConsumeOK); !ok {
		t.Fatal("no consume-ok")
	}
	publishN(t, url, n, size)
	q := b.Queue("q")
	testutil.WaitForf(t, wait, func() bool { return q.Stats().Ready == 0 }, "every message handed to the no-ack consumer")

	// The client cancels without having read anything, then reads what
	// was sent to it.
	rc.nc.SetDeadline(time.Now().Add(2 * wait))
	rc.method(1, &BasicCancel{ConsumerTag: "na"})
	got := 0
	for {
		f, err := rc.r.ReadFrame()
		if err != nil {
			t.Fatalf("after %d deliveries: %v", got, err)
		}
		if f.Type != FrameMethod {
			continue
		}
		m, err := DecodeMethod(f.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.(*BasicDeliver); ok {
			got++
		}
		if _, ok := m.(*BasicCancelOK); ok {
			break
		}
	}
	if got != n {
		t.Fatalf("the cancelled no-ack consumer got %d deliveries, want %d", got, n)
	}
	testutil.WaitForf(t, wait, func() bool { return q.Stats().Messages() == 0 }, "the queue empty: every no-ack delivery settled")
	if st := q.Stats(); st.Delivered != n || st.Acked != n {
		t.Fatalf("delivered %d, acked %d; want %d each, none delivered again", st.Delivered, st.Acked, n)
	}
}
