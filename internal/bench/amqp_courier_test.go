package bench_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/courier-mq/courier/internal/bench"
	"github.com/courier-mq/courier/node"
)

// startAMQPNode runs a node whose AMQP 0-9-1 listener is on a free
// loopback port, and returns it as an amqp:// target: the load
// generator's RabbitMQ mapping pointed at Courier's AMQP port.
func startAMQPNode(t testing.TB) bench.Target {
	t.Helper()
	_, target := startAMQPNodeBoth(t)
	return target
}

// startAMQPNodeBoth is startAMQPNode, returning the node's courier://
// target too.
func startAMQPNodeBoth(t testing.TB) (bench.Target, bench.Target) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", AMQP: "127.0.0.1:0", Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	url := strings.Replace(n.AMQPURL(), "amqp://", "amqp://guest:guest@", 1) + "/"
	target, err := bench.ParseTarget(url)
	if err != nil {
		t.Fatal(err)
	}
	native, err := bench.ParseTarget(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	return native, target
}

// Each scenario of the side-by-side comparison with RabbitMQ
// (scripts/bench-amqp.sh) runs on Courier's AMQP port through the same
// amqp091-go mapping that drives RabbitMQ: request-response with direct
// reply-to, fan-out through a fanout exchange to exclusive queues,
// confirmed durable tasks, and the backlog.
func TestAMQPCourierReqResp(t *testing.T) {
	checkReqResp(t, tinyReqResp(startAMQPNode(t)))
}

func TestAMQPCourierFanOut(t *testing.T) {
	checkPubSub(t, bench.Config{Target: startAMQPNode(t)})
}

func TestAMQPCourierTasks(t *testing.T) {
	checkTasks(t, tinyTasks(startAMQPNode(t)))
}

func TestAMQPCourierBacklog(t *testing.T) {
	checkBacklog(t, tinyBacklog(startAMQPNode(t)))
}

// compare heads an AMQP column by the server's product, so that
// Courier's AMQP port is not called RabbitMQ, and compares the Courier
// server with it.
func TestAMQPCourierCompareLabels(t *testing.T) {
	native, amqpTarget := startAMQPNodeBoth(t)
	cmp, err := bench.Compare(ctxFor(t), bench.CompareConfig{
		Targets: []bench.Target{native, amqpTarget},
		Cases:   []string{"reqresp"},
		Config:  bench.Config{Count: 100},
	})
	if err != nil {
		t.Fatalf("Compare: %v", err)
	}
	var out bytes.Buffer
	if err := cmp.WriteText(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("output:\n%s", out.String())
	if len(cmp.Labels) != 2 || cmp.Labels[0] != "Courier server" || cmp.Labels[1] != "Courier AMQP" {
		t.Errorf("labels %q, want Courier server, Courier AMQP", cmp.Labels)
	}
	if !strings.Contains(out.String(), "Courier server/Courier AMQP") || strings.Contains(out.String(), "RabbitMQ") {
		t.Errorf("want a Courier server/Courier AMQP ratio and no RabbitMQ heading")
	}
	if len(cmp.Errors) > 0 {
		t.Errorf("errors: %q", cmp.Errors)
	}
}
