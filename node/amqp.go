package node

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/supervise"
)

// startAMQP opens the AMQP listener of Config.AMQP and adds its
// component to the supervisor; the listener is returned so that a failed
// Start can close it.
func (n *Node) startAMQP() (net.Listener, error) {
	tlsCfg, err := n.loadTLS(n.cfg.TLS, "amqp")
	if err != nil {
		return nil, err
	}
	// A message must fit a Courier frame of the node's maximum, with room
	// for its headers.
	maxMessage := n.cfg.Limits.MaxFrame - 64<<10
	if maxMessage <= 0 {
		maxMessage = n.cfg.Limits.MaxFrame / 2
	}
	s, err := amqp.New(amqp.Config{Listen: n.cfg.AMQP, TLS: tlsCfg, Users: n.users, Log: n.cfg.Log,
		Broker: n.broker, MaxMessage: maxMessage, OutboxLimit: n.cfg.Limits.AMQPOutboxBytes})
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	ln, err := s.Listen()
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	n.amqp, n.amqpAddr = s, ln.Addr()
	n.sup.Add(supervise.Component{Name: "amqp", Critical: true, Run: n.serveAMQP(ln)})
	return ln, nil
}

// serveAMQP returns the AMQP listener's component: it serves ln, and
// after a crash listens again on the same address.
func (n *Node) serveAMQP(ln net.Listener) func(context.Context) error {
	return func(ctx context.Context) error {
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", n.amqpAddr.String()); err != nil {
				return fmt.Errorf("listen again on %s: %w", n.amqpAddr, err)
			}
			n.cfg.Log.Info("amqp listener restarted", "addr", n.amqpAddr.String())
		}
		l := ln
		ln = nil
		defer l.Close()
		stop := context.AfterFunc(ctx, func() { l.Close() })
		defer stop()
		if err := n.amqp.Serve(l); !errors.Is(err, amqp.ErrServerClosed) && ctx.Err() == nil {
			return err
		}
		return nil
	}
}

// AMQPAddr returns the AMQP address served, or nil without Config.AMQP.
func (n *Node) AMQPAddr() net.Addr { return n.amqpAddr }

// AMQPURL returns the amqp:// (with TLS, amqps://) URL of the AMQP
// address served, or "".
func (n *Node) AMQPURL() string {
	if n.amqpAddr == nil {
		return ""
	}
	if n.cfg.TLS.Enabled() {
		return "amqps://" + n.amqpAddr.String()
	}
	return "amqp://" + n.amqpAddr.String()
}
