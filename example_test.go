package courier_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/node"
)

// startNode starts an embedded node for the examples and returns the
// function that stops it; client.Dial gives the same *courier.Conn for a
// server.
func startNode() (*node.Node, func()) {
	dir, _ := os.MkdirTemp("", "courier-example")
	n, err := node.Start(node.Config{DataDir: dir, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	return n, func() { n.Close(); os.RemoveAll(dir) }
}

// A round-robin exchange with one handler, and a request to it.
func Example() {
	n, stop := startNode()
	defer stop()
	ctx := context.Background()
	conn := n.Connect()

	users, err := conn.ReqResp(ctx, "users", courier.RoundRobin)
	if err != nil {
		panic(err)
	}
	users.Handle(ctx, func(r *courier.Request) { r.Reply([]byte("pong")) })
	resp, err := users.Request(ctx, courier.Message{Body: []byte("ping")})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(resp.Body))
	// Output: pong
}

// Publish-subscribe with a topic pattern: '#' matches any number of words.
func ExamplePubSub_Subscribe() {
	n, stop := startNode()
	defer stop()
	ctx := context.Background()
	conn := n.Connect()

	news, _ := conn.PubSub(ctx, "news")
	got := make(chan string, 1)
	news.Subscribe(ctx, "eu.#", func(d *courier.Delivery) { got <- d.Key + ": " + string(d.Body) })
	news.Publish(ctx, "us.ny", []byte("not for eu.#"))
	news.Publish(ctx, "eu.fr.paris", []byte("bonjour"))
	fmt.Println(<-got)
	// Output: eu.fr.paris: bonjour
}

// Every member of a group learns who leads; the oldest member does.
func ExampleOnEvent() {
	n, stop := startNode()
	defer stop()
	ctx := context.Background()

	sched, _ := n.Connect().ReqResp(ctx, "scheduler", courier.Leader)
	first, _ := sched.Handle(ctx, func(r *courier.Request) { r.Reply(nil) })
	events := make(chan courier.Event, 4)
	second, _ := sched.Handle(ctx, func(r *courier.Request) { r.Reply(nil) },
		courier.OnEvent(func(e courier.Event) { events <- e }))
	e := <-events
	fmt.Println(e.Kind, "leader is first:", e.Leader == first.ID(), "second leads:", second.IsLeader())
	// Output: leader leader is first: true second leads: false
}

// A handler streams its answer in chunks.
func ExampleReqResp_RequestStream() {
	n, stop := startNode()
	defer stop()
	ctx := context.Background()
	conn := n.Connect()

	logs, _ := conn.ReqResp(ctx, "logs", courier.RoundRobin)
	logs.Handle(ctx, func(r *courier.Request) {
		for _, line := range []string{"one", "two", "three"} {
			r.Chunk([]byte(line))
		}
		r.End()
	})
	s, _ := logs.RequestStream(ctx, courier.Message{})
	for s.Next() {
		fmt.Println(string(s.Chunk()))
	}
	fmt.Println("err:", s.Err())
	// Output:
	// one
	// two
	// three
	// err: <nil>
}
