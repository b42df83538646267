package bench_test

import (
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
	return target
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
