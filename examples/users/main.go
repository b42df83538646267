// Command users runs the "users" service of Courier's design: several
// instances behind a round-robin exchange, profile updates on a pub-sub
// exchange, and a scheduler that runs its job only while the broker makes
// it the leader. By default it embeds a node; with --url it runs the very
// same code against a server.
//
//	go run ./examples/users
//	go run ./examples/users --url courier://127.0.0.1:7400
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/node"
)

func main() {
	url := flag.String("url", "", "a Courier server, such as courier://127.0.0.1:7400 (default: an embedded node)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *url, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "users:", err)
		os.Exit(1)
	}
}

// run picks where to connect, then runs the demo: the only place that
// knows whether the broker is embedded or remote.
func run(ctx context.Context, url string, out io.Writer) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var dial Dialer
	if url == "" {
		dir, err := os.MkdirTemp("", "courier-users-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		n, err := node.Start(node.Config{DataDir: dir, Log: log})
		if err != nil {
			return err
		}
		defer n.Close()
		fmt.Fprintf(out, "embedded node %s, data in %s\n", n.Name(), dir)
		dial = Embedded(n)
	} else {
		fmt.Fprintf(out, "server %s\n", url)
		dial = Remote(url, log)
	}
	_, err := Demo(ctx, dial, out, Options{})
	return err
}

// Embedded returns a Dialer of in-process connections to n.
func Embedded(n *node.Node) Dialer {
	return func(context.Context, string) (*courier.Conn, error) { return n.Connect(), nil }
}

// Remote returns a Dialer of network connections to the server at url.
func Remote(url string, log *slog.Logger) Dialer {
	return func(ctx context.Context, name string) (*courier.Conn, error) {
		return client.Dial(ctx, url, client.Options{Name: name, Log: log})
	}
}
