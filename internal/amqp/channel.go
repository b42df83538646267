package amqp

import (
	"fmt"
)

// channel is one open AMQP channel; owned by the connection's read loop.
type channel struct {
	id uint16
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
		default:
			// No method that carries content is accepted yet.
			return Errorf(UnexpectedFrame, "content frame (type %d) on channel %d without a basic.publish before it", f.Type, f.Channel)
		}
	}
}

// connectionMethod handles a method on channel 0.
func (c *conn) connectionMethod(m Method) error {
	switch m.(type) {
	case *ConnectionClose:
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
			c.channels[id] = &channel{id: id}
			return c.send(id, &ChannelOpenOK{})
		case *ChannelCloseOK:
			return nil // after a close of ours that the peer crossed
		}
		return methodError(ChannelError, m, fmt.Sprintf("expected 'channel.open' on channel %d, got '%s'", id, m.Name()))
	}
	switch m := m.(type) {
	case *ChannelOpen:
		return methodError(ChannelError, m, fmt.Sprintf("second 'channel.open' seen on channel %d", id))
	case *ChannelClose:
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
