package amqp

import (
	"fmt"
	"sync"
)

// Exclusive queues: a queue declared exclusive belongs to the connection
// that declared it. Another AMQP connection that declares, consumes,
// purges or deletes it is refused with 405 RESOURCE_LOCKED, and the
// queue is deleted when its connection closes, as in RabbitMQ. The
// queue is a transient Courier task exchange whatever durable says.

// owners maps exclusive queue names to the connections that own them.
type owners struct {
	mu sync.Mutex // guards m
	m  map[string]*conn
}

// owner returns the connection owning queue, or nil.
func (o *owners) owner(queue string) *conn {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.m[queue]
}

// claim makes c the owner of queue unless another connection is; it
// reports whether c owns it now, and whether the claim is new.
func (o *owners) claim(queue string, c *conn) (ok, fresh bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch o.m[queue] {
	case c:
		return true, false
	case nil:
		if o.m == nil {
			o.m = make(map[string]*conn)
		}
		o.m[queue] = c
		return true, true
	}
	return false, false
}

// release forgets c's ownership of queue.
func (o *owners) release(queue string, c *conn) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m[queue] == c {
		delete(o.m, queue)
	}
}

// locked is the error of a method on a queue another connection owns.
func locked(m Method, queue string) *Error {
	return methodError(ResourceLocked, m, fmt.Sprintf("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%s' in vhost '/'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.", queue))
}

// lockedBy reports whether queue is an exclusive queue of another
// connection.
func (c *conn) lockedBy(queue string) bool {
	o := c.s.owners.owner(queue)
	return o != nil && o != c
}

// deleteOwned deletes the exclusive queues of a connection that closes.
func (c *conn) deleteOwned() {
	for q := range c.owned {
		c.dropBindings(q)
		if err := c.s.cfg.Broker.Delete(q); err != nil {
			c.s.log.Debug("amqp exclusive queue not deleted", "queue", q, "err", err)
		}
		c.s.owners.release(q, c)
	}
	c.owned = nil
}
