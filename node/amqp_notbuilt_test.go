package node

import (
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier/internal/amqp"
)

// TestAMQPNotSupported: transactions and exchange-to-exchange bindings
// fail loudly with 540 NOT_IMPLEMENTED, closing the connection, never
// silently.
func TestAMQPNotSupported(t *testing.T) {
	_, url := amqpNode(t)
	for name, call := range map[string]func(*amqp091.Channel) error{
		"tx.select":       func(ch *amqp091.Channel) error { return ch.Tx() },
		"exchange.bind":   func(ch *amqp091.Channel) error { return ch.ExchangeBind("dst", "k", "src", false, nil) },
		"exchange.unbind": func(ch *amqp091.Channel) error { return ch.ExchangeUnbind("dst", "k", "src", false, nil) },
	} {
		t.Run(name, func(t *testing.T) {
			_, ch := amqpChannel(t, url)
			wantAMQPCode(t, call(ch), amqp.NotImplemented)
		})
	}
}
