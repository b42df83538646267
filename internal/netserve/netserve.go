// Package netserve is what the network listeners share: the client
// listener (internal/server) and the AMQP listener (internal/amqp) accept
// with one loop, which rides out a shortage of file descriptors, and
// wait for their connections' goroutines with one helper. What each does
// with a connection (its handshake limits, its protocol) stays its own.
package netserve

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// ErrStopped is returned by [Serve] when its server stopped.
var ErrStopped = errors.New("netserve: stopped")

// Backoff bounds of a failing accept: it is retried after a wait that
// doubles from MinBackoff to MaxBackoff, as net/http does.
const (
	MinBackoff = 5 * time.Millisecond
	MaxBackoff = time.Second
)

// Serve accepts connections on ln and hands each to handle, which must
// not block, until accepting fails for good. A failure that may pass (a
// timeout, or no file descriptor left: EMFILE, ENFILE) is logged at
// warning level as msg and retried after a backoff. Once accepting
// fails, stopped tells whether the server stopped (and closed ln): Serve
// then returns ErrStopped, and otherwise the failure.
func Serve(ln net.Listener, log *slog.Logger, msg string, stopped func() bool, handle func(net.Conn)) error {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if stopped() {
				return ErrStopped
			}
			if !Temporary(err) {
				return err
			}
			backoff = min(max(2*backoff, MinBackoff), MaxBackoff)
			log.Warn(msg, "err", err, "in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		handle(nc)
	}
}

// Temporary reports whether an accept failure may pass: a timeout, or
// no file descriptor left.
func Temporary(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// Wait waits for wg, or until ctx ends, whose error it then returns.
func Wait(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
