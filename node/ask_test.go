package node_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/node"
)

// TestAskAfterAnswer: a handler that asks after it has answered gets an
// error at once instead of waiting for an answer that cannot come.
func TestAskAfterAnswer(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	ex, err := n.Connect().ReqResp(ctx, "late", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	askErr := make(chan error, 1)
	if _, err := ex.Handle(ctx, func(r *courier.Request) {
		r.Reply(nil)
		_, err := r.Ask(context.Background(), []byte("too late?"))
		askErr <- err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := ex.Request(ctx, courier.Message{}, courier.OnAsk(func(context.Context, []byte) ([]byte, error) {
		return []byte("yes"), nil
	})); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-askErr:
		if !errors.Is(err, courier.ErrResponded) {
			t.Fatalf("Ask after the answer: %v, want ErrResponded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Ask after the answer is still waiting")
	}
}
