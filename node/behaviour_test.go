package node_test

import (
	"io"
	"log/slog"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/behaviour"
	"github.com/courier-mq/courier/node"
)

// TestBehaviour runs the behaviour suite against an embedded node.
func TestBehaviour(t *testing.T) {
	n, err := node.Start(node.Config{
		DataDir: t.TempDir(),
		// The suite makes handlers panic on purpose; keep the log quiet.
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	behaviour.Run(t, func(t *testing.T) *courier.Conn {
		c := n.Connect()
		t.Cleanup(func() { c.Close() })
		return c
	})
}
