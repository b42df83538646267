package amqp

import (
	"strings"
	"sync"
)

// Auto-delete queues: a queue declared auto-delete is deleted, with its
// bindings, when its last AMQP consumer goes (basic.cancel, its channel
// or connection closing) after it has had one, as in RabbitMQ. The
// listener remembers which queues are auto-delete, and their AMQP
// consumers, in memory: Courier-native workers do not count, and after a
// restart a queue is auto-delete again once a program declares it so.

// autoDeletes counts the AMQP consumers of the auto-delete queues.
type autoDeletes struct {
	mu sync.Mutex // guards m
	m  map[string]int
}

// declared records queue as auto-delete.
func (a *autoDeletes) declared(queue string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = make(map[string]int)
	}
	if _, ok := a.m[queue]; !ok {
		a.m[queue] = 0
	}
}

// consumed counts a new consumer of queue.
func (a *autoDeletes) consumed(queue string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n, ok := a.m[queue]; ok {
		a.m[queue] = n + 1
	}
}

// released counts a consumer of queue gone; it reports whether that was
// the last of an auto-delete queue, which is then forgotten.
func (a *autoDeletes) released(queue string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.m[queue]
	switch {
	case !ok:
		return false
	case n <= 1:
		delete(a.m, queue)
		return true
	}
	a.m[queue] = n - 1
	return false
}

// forget forgets a queue deleted.
func (a *autoDeletes) forget(queue string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, queue)
}

// consumerReleased deletes queue if cs was the last consumer of an
// auto-delete queue.
func (c *conn) consumerReleased(queue string) {
	if !c.s.autoDel.released(queue) {
		return
	}
	c.dropBindings(queue)
	if err := c.s.cfg.Broker.Delete(queue); err != nil {
		c.s.log.Debug("amqp auto-delete queue not deleted", "queue", queue, "err", err)
		return
	}
	c.s.log.Info("amqp auto-delete queue deleted: its last consumer went", "queue", queue)
}

// autoDeleteExchanges are the exchanges declared auto-delete.
type autoDeleteExchanges struct {
	mu sync.Mutex // guards m
	m  map[string]bool
}

func (a *autoDeleteExchanges) set(exchange string, on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !on {
		delete(a.m, exchange)
		return
	}
	if a.m == nil {
		a.m = make(map[string]bool)
	}
	a.m[exchange] = true
}

func (a *autoDeleteExchanges) has(exchange string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.m[exchange]
}

// bindingGone deletes exchange if it is auto-delete and no queue is
// bound to it any more.
func (c *conn) bindingGone(exchange string) {
	if !c.s.autoDelX.has(exchange) {
		return
	}
	_, _, subs := c.s.cfg.Broker.Definitions()
	for _, d := range subs {
		if d.Exchange == exchange && strings.HasPrefix(d.Name, bindSub("")) {
			return
		}
	}
	c.s.autoDelX.set(exchange, false)
	if err := c.s.cfg.Broker.Delete(exchange); err != nil {
		c.s.log.Debug("amqp auto-delete exchange not deleted", "exchange", exchange, "err", err)
		return
	}
	c.s.log.Info("amqp auto-delete exchange deleted: its last binding went", "exchange", exchange)
}
