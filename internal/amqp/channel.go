package amqp

import (
	"fmt"
)

// channel is one open AMQP channel; owned by the connection's read loop.
type channel struct {
	id uint16
	// closing is set once the server sent channel.close: until the
	// client's close-ok, every other frame on the channel is dropped.
	closing bool
	// confirm is set by confirm.select; nextTag is the delivery tag of
	// the last publication since.
	confirm bool
	nextTag uint64
	// pending is the publication whose content is being read.
	pending *pending
	// prefetch is basic.qos's prefetch_count for the next consumers (0:
	// no limit); consumers are the channel's by tag; tags its
	// deliveries.
	prefetch  int
	consumers map[string]*consumer
	tags      deliveries
	// reply is the channel's consumer of amq.rabbitmq.reply-to (rpc.go).
	reply *replyConsumer
	// pullers are the pull attachments of its basic.get, by source
	// (get.go).
	pullers map[getSource]uint32
	// getters are the remote getters holding a message got with acks,
	// by attachment id (get.go).
	getters map[uint32]bool
}

// pending is a basic.publish waiting for its content header and body.
type pending struct {
	exchange, key string
	mandatory     bool
	props         Properties
	size          uint64
	haveHeader    bool
	body          []byte
}

// readLoop reads frames until the connection ends and dispatches them.
func (c *conn) readLoop() error {
	for {
		f, err := c.readFrame()
		if err != nil {
			return err
		}
		switch f.Type {
		case FrameHeartbeat:
		case FrameHeader, FrameBody:
			if err := c.content(f); err != nil {
				return err
			}
		case FrameMethod:
			m, err := DecodeMethod(f.Payload)
			if err != nil {
				return err
			}
			if f.Channel == 0 {
				err = c.connectionMethod(m)
			} else {
				err = c.channelMethod(f.Channel, m)
			}
			if err != nil {
				return err
			}
		}
	}
}

// content takes a content header or body frame of a publication.
func (c *conn) content(f Frame) error {
	ch := c.channels[f.Channel]
	if ch != nil && ch.closing {
		return nil
	}
	if ch == nil || ch.pending == nil {
		return Errorf(UnexpectedFrame, "UNEXPECTED_FRAME - content frame (type %d) on channel %d without a basic.publish before it", f.Type, f.Channel)
	}
	p := ch.pending
	if f.Type == FrameHeader {
		if p.haveHeader {
			return Errorf(UnexpectedFrame, "UNEXPECTED_FRAME - second content header on channel %d", f.Channel)
		}
		h, err := DecodeHeader(f.Payload)
		if err != nil {
			return err
		}
		if h.ClassID != ClassBasic {
			return Errorf(UnexpectedFrame, "UNEXPECTED_FRAME - content header of class %d, not basic", h.ClassID)
		}
		if h.BodySize > uint64(c.s.cfg.MaxMessage) {
			return c.closeChannel(ch, &Error{Code: PreconditionFailed, ClassID: ClassBasic, MethodID: 40,
				Text: fmt.Sprintf("PRECONDITION_FAILED - message size %d is larger than configured max size %d", h.BodySize, c.s.cfg.MaxMessage)})
		}
		p.props, p.size, p.haveHeader = h.Properties, h.BodySize, true
		// Grown as the body arrives: a header alone reserves nothing.
		p.body = make([]byte, 0, min(h.BodySize, 64<<10))
	} else {
		if !p.haveHeader {
			return Errorf(UnexpectedFrame, "UNEXPECTED_FRAME - content body on channel %d before its header", f.Channel)
		}
		if uint64(len(p.body))+uint64(len(f.Payload)) > p.size {
			return Errorf(FrameError, "FRAME_ERROR - content body on channel %d longer than the %d octets its header announced", f.Channel, p.size)
		}
		if c.buffered+len(f.Payload) > 2*c.s.cfg.MaxMessage {
			return Errorf(ResourceError, "RESOURCE_ERROR - more than %d octets of unfinished publications on this connection", 2*c.s.cfg.MaxMessage)
		}
		c.buffered += len(f.Payload)
		p.body = append(p.body, f.Payload...)
	}
	if uint64(len(p.body)) < p.size {
		return nil
	}
	ch.pending = nil
	c.buffered -= len(p.body)
	return c.publish(ch, p)
}

// closeChannel closes ch with a soft error: channel.close is sent, and
// the channel ignores everything but close-ok until it comes.
func (c *conn) closeChannel(ch *channel, e *Error) error {
	if ch.pending != nil {
		c.buffered -= len(ch.pending.body)
	}
	ch.closing, ch.pending = true, nil
	c.cancelConsumers(ch)
	c.s.log.Debug("amqp channel closed with an error", "peer", c.peer, "channel", ch.id, "code", e.Code, "text", e.Text)
	return c.send(ch.id, &ChannelClose{ReplyCode: e.Code, ReplyText: truncate(e.Text), ClassID: e.ClassID, MethodID: e.MethodID})
}

// connectionMethod handles a method on channel 0.
func (c *conn) connectionMethod(m Method) error {
	switch m.(type) {
	case *ConnectionClose:
		// As RabbitMQ: close-ok once the connection's consumers are
		// gone and what they held is back in its queues, so that a
		// client whose Close returned sees it there.
		c.closeSession()
		c.send(0, &ConnectionCloseOK{})
		return errClosed
	case *ConnectionUpdateSecret:
		return methodError(NotImplemented, m, "connection.update-secret is not supported: Courier has no expiring credentials")
	}
	return methodError(CommandInvalid, m, fmt.Sprintf("%s is not valid on channel 0 of an open connection", m.Name()))
}

// channelMethod handles a method on channel id.
func (c *conn) channelMethod(id uint16, m Method) error {
	ch := c.channels[id]
	if ch == nil {
		switch m.(type) {
		case *ChannelOpen:
			if id > c.channelMax {
				return methodError(NotAllowed, m, fmt.Sprintf("channel %d beyond channel_max %d", id, c.channelMax))
			}
			c.channels[id] = &channel{id: id, consumers: make(map[string]*consumer)}
			return c.send(id, &ChannelOpenOK{})
		case *ChannelCloseOK:
			return nil // after a close of ours that the peer crossed
		}
		return methodError(ChannelError, m, fmt.Sprintf("expected 'channel.open' on channel %d, got '%s'", id, m.Name()))
	}
	if ch.closing {
		switch m.(type) {
		case *ChannelClose:
			delete(c.channels, id)
			return c.send(id, &ChannelCloseOK{})
		case *ChannelCloseOK:
			delete(c.channels, id)
		}
		return nil
	}
	if ch.pending != nil {
		return methodError(UnexpectedFrame, m, fmt.Sprintf("UNEXPECTED_FRAME - %s on channel %d while the content of a basic.publish was expected", m.Name(), id))
	}
	switch m := m.(type) {
	case *ChannelOpen:
		return methodError(ChannelError, m, fmt.Sprintf("second 'channel.open' seen on channel %d", id))
	case *ChannelClose:
		c.cancelConsumers(ch)
		delete(c.channels, id)
		return c.send(id, &ChannelCloseOK{})
	case *ChannelCloseOK:
		return nil
	case *ChannelFlow:
		if !m.Active {
			return methodError(NotImplemented, m, "channel.flow active=false is not supported, as in RabbitMQ: use basic.qos to bound deliveries")
		}
		return c.send(id, &ChannelFlowOK{Active: true})
	case *ChannelFlowOK:
		return nil
	}
	if c.gw != nil {
		if handled, err := c.brokerMethod(ch, m); handled {
			return err
		}
	}
	class, _ := m.ClassMethod()
	if class == ClassConnection {
		return methodError(CommandInvalid, m, fmt.Sprintf("%s on channel %d: connection methods belong on channel 0", m.Name(), id))
	}
	return methodError(NotImplemented, m, fmt.Sprintf("%s is not built yet in Courier's AMQP gateway (docs/amqp.md lists what is)", m.Name()))
}

// methodError is an exception caused by m.
func methodError(code uint16, m Method, text string) *Error {
	class, method := m.ClassMethod()
	return &Error{Code: code, Text: text, ClassID: class, MethodID: method}
}

// brokerMethod handles the methods the gateway maps onto the broker; it
// reports false for those it does not.
func (c *conn) brokerMethod(ch *channel, m Method) (bool, error) {
	switch m := m.(type) {
	case *ExchangeDeclare:
		return true, c.exchangeDeclare(ch, m)
	case *ExchangeDelete:
		return true, c.exchangeDelete(ch, m)
	case *BasicPublish:
		return true, c.basicPublish(ch, m)
	case *QueueDeclare:
		return true, c.queueDeclare(ch, m)
	case *QueueDelete:
		return true, c.queueDelete(ch, m)
	case *QueuePurge:
		return true, c.queuePurge(ch, m)
	case *QueueBind:
		return true, c.queueBind(ch, m)
	case *QueueUnbind:
		return true, c.queueUnbind(ch, m)
	case *BasicQos:
		return true, c.basicQos(ch, m)
	case *BasicConsume:
		return true, c.basicConsume(ch, m)
	case *BasicCancel:
		return true, c.basicCancel(ch, m)
	case *BasicAck:
		return true, c.settle(ch, m, m.DeliveryTag, m.Multiple, false, false)
	case *BasicNack:
		return true, c.settle(ch, m, m.DeliveryTag, m.Multiple, true, m.Requeue)
	case *BasicReject:
		return true, c.settle(ch, m, m.DeliveryTag, false, true, m.Requeue)
	case *BasicRecover:
		return true, c.basicRecover(ch, m)
	case *BasicGet:
		return true, c.basicGet(ch, m)
	case *ExchangeBind, *ExchangeUnbind:
		return true, methodError(NotImplemented, m, fmt.Sprintf("NOT_IMPLEMENTED - %s: exchange-to-exchange bindings are not supported by Courier's AMQP gateway (a Courier exchange routes to subscribers and queues, not to other exchanges): bind the queues to the source exchange", m.Name()))
	case *TxSelect, *TxCommit, *TxRollback:
		return true, methodError(NotImplemented, m, fmt.Sprintf("NOT_IMPLEMENTED - %s: transactions are not supported by Courier's AMQP gateway: use publisher confirms (confirm.select)", m.Name()))
	case *ConfirmSelect:
		ch.confirm = true
		if m.Nowait {
			return true, nil
		}
		return true, c.send(ch.id, &ConfirmSelectOK{})
	}
	return false, nil
}

// basicPublish starts a publication; its content follows.
func (c *conn) basicPublish(ch *channel, m *BasicPublish) error {
	switch {
	case m.Immediate:
		return methodError(NotImplemented, m, "NOT_IMPLEMENTED - immediate=true")
	}
	ch.pending = &pending{exchange: m.Exchange, key: m.RoutingKey, mandatory: m.Mandatory}
	return nil
}

// cancelConsumers cancels the consumers of a channel that closes.
func (c *conn) cancelConsumers(ch *channel) {
	c.cancelReplyTo(ch)
	for _, cs := range ch.consumers {
		c.cancelConsumer(cs)
	}
	c.dropPullers(ch)
}
