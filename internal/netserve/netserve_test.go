package netserve

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeListener returns its results in turn, then blocks until closed.
type fakeListener struct {
	mu      sync.Mutex
	results []error // nil: a connection
	closed  chan struct{}
}

func (l *fakeListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if len(l.results) > 0 {
		err := l.results[0]
		l.results = l.results[1:]
		l.mu.Unlock()
		if err != nil {
			return nil, err
		}
		c, _ := net.Pipe()
		return c, nil
	}
	l.mu.Unlock()
	<-l.closed
	return nil, net.ErrClosed
}

func (l *fakeListener) Close() error   { close(l.closed); return nil }
func (l *fakeListener) Addr() net.Addr { return &net.TCPAddr{} }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestServeRetriesWhatMayPass(t *testing.T) {
	emfile := &os.SyscallError{Syscall: "accept", Err: syscall.EMFILE}
	l := &fakeListener{results: []error{nil, emfile, syscall.ENFILE, nil}, closed: make(chan struct{})}
	var mu sync.Mutex
	var stop bool
	handled := make(chan net.Conn, 2)
	done := make(chan error, 1)
	go func() {
		done <- Serve(l, quiet, "accept failed", func() bool { mu.Lock(); defer mu.Unlock(); return stop }, func(c net.Conn) { handled <- c })
	}()
	for range 2 {
		select {
		case c := <-handled:
			c.Close()
		case <-time.After(30 * time.Second):
			t.Fatal("a connection after EMFILE and ENFILE was not handled")
		}
	}
	mu.Lock()
	stop = true
	mu.Unlock()
	l.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("Serve after stop: %v, want ErrStopped", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return once stopped")
	}
}

func TestServeReturnsAFailureForGood(t *testing.T) {
	bad := errors.New("broken")
	l := &fakeListener{results: []error{bad}, closed: make(chan struct{})}
	if err := Serve(l, quiet, "x", func() bool { return false }, func(net.Conn) {}); !errors.Is(err, bad) {
		t.Fatalf("Serve: %v, want the failure", err)
	}
}

func TestWait(t *testing.T) {
	var wg sync.WaitGroup
	wg.Add(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Wait(ctx, &wg); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with the goroutine running: %v", err)
	}
	wg.Done()
	if err := Wait(context.Background(), &wg); err != nil {
		t.Fatal(err)
	}
}
