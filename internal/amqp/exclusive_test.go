package amqp

import (
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

func channelOf(t *testing.T, c *amqp091.Connection) *amqp091.Channel {
	t.Helper()
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// An exclusive queue is its connection's: another connection is refused
// with 405, and the queue is deleted when its connection closes.
func TestExclusiveQueue(t *testing.T) {
	_, url := queueServer(t, Config{})
	owner := dial(t, url)
	och := channelOf(t, owner)
	q, err := och.QueueDeclare("", true, false, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(q.Name, "amq.gen-") || len(q.Name) != len("amq.gen-")+22 {
		t.Fatalf("server-named queue %q", q.Name)
	}
	// The owner finds and uses it.
	if _, err := och.QueueDeclarePassive(q.Name, true, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	ds, err := och.Consume(q.Name, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := och.Publish("", q.Name, false, false, amqp091.Publishing{Body: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-ds:
		if string(d.Body) != "hi" {
			t.Fatalf("got %q", d.Body)
		}
	case <-time.After(wait):
		t.Fatal("no delivery")
	}

	other := dial(t, url)
	for name, try := range map[string]func(*amqp091.Channel) error{
		"passive": func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclarePassive(q.Name, false, false, false, false, nil)
			return err
		},
		"consume": func(ch *amqp091.Channel) error {
			_, err := ch.Consume(q.Name, "", false, false, false, false, nil)
			return err
		},
		"purge": func(ch *amqp091.Channel) error {
			_, err := ch.QueuePurge(q.Name, false)
			return err
		},
		"delete": func(ch *amqp091.Channel) error {
			_, err := ch.QueueDelete(q.Name, false, false, false)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			wantCode(t, try(channelOf(t, other)), ResourceLocked)
		})
	}

	// A queue that exists, not exclusive, cannot be made exclusive.
	wantCode(t, func() error {
		_, err := channelOf(t, other).QueueDeclare("q", false, false, true, false, nil)
		return err
	}(), ResourceLocked)

	owner.Close()
	deadline := time.Now().Add(wait)
	for {
		_, err := channelOf(t, other).QueueDeclarePassive(q.Name, false, false, false, false, nil)
		if e, ok := err.(*amqp091.Error); ok && e.Code == NotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the exclusive queue outlived its connection: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A named exclusive queue: its name is free again once its
	// connection closes.
	third := dial(t, url)
	if _, err := channelOf(t, third).QueueDeclare("mine", true, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, exclusive := range []bool{false, true} {
		wantCode(t, func() error {
			_, err := channelOf(t, other).QueueDeclare("mine", false, false, exclusive, false, nil)
			return err
		}(), ResourceLocked)
	}
	third.Close()
	for deadline := time.Now().Add(wait); ; {
		_, err := channelOf(t, other).QueueDeclare("mine", false, false, true, false, nil)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the name stayed locked: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
