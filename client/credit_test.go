package client_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/server"
)

// TestCreditWakesEveryWaiter: when several publishers wait for credit and
// one CREDIT frame grants room for more than one, every one of them must
// go on. A single wake-up per CREDIT left the others waiting forever once
// nothing more was in flight to earn credit.
func TestCreditWakesEveryWaiter(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := broker.New(broker.Config{Log: log})
	defer b.Close()
	srv, err := server.New(server.Config{Listen: "127.0.0.1:0", Credit: 8, Log: log}, b)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Shutdown(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "courier://"+ln.Addr().String(), client.Options{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ps, err := c.PubSub(ctx, "credit")
	if err != nil {
		t.Fatal(err)
	}
	const publishers, each = 32, 200
	var wg sync.WaitGroup
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := ps.Publish(ctx, "k", []byte("x")); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("publishers still waiting for credit the server granted")
	}
	// The connection still works: the server saw no publish without credit.
	if err := ps.PublishSync(ctx, courier.Message{Key: "k"}); err != nil {
		t.Fatal(err)
	}
}
