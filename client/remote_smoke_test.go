package client_test

import (
	"context"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/node"
)

func BenchmarkRemoteSeq(b *testing.B) {
	n, err := node.Start(node.Config{DataDir: b.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	h, err := client.Dial(ctx, n.URL(), client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	hx, err := h.ReqResp(ctx, "ping", courier.RoundRobin)
	if err != nil {
		b.Fatal(err)
	}
	pong := []byte("pong")
	hx.Handle(ctx, func(r *courier.Request) { r.Reply(pong) })
	c, _ := client.Dial(ctx, n.URL(), client.Options{})
	ex, _ := c.ReqResp(ctx, "ping")
	msg := courier.Message{Body: []byte("ping")}
	b.ReportAllocs()
	for b.Loop() {
		r, err := ex.Request(ctx, msg)
		if err != nil || string(r.Body) != "pong" {
			b.Fatal(r, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}
