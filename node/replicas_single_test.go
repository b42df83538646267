package node_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// TestReplicasOnANodeAlone: a node alone keeps every queue on itself:
// Replicas(1) and the default declare the same queue, Replicas(3) is
// refused (as NATS refuses R3 outside a cluster), and so is replicas on
// an exchange that is not a task exchange, or above the maximum. The
// management API takes x-quorum-initial-group-size the same way.
func TestReplicasOnANodeAlone(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Log: quiet(), HTTP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := testutil.Context(t, 30*time.Second)
	c := n.Connect()
	if _, err := c.Tasks(ctx, "one", courier.Replicas(1)); err != nil {
		t.Fatalf("Replicas(1): %v", err)
	}
	if _, err := c.Tasks(ctx, "one"); err != nil {
		t.Fatalf("the default after Replicas(1): %v", err)
	}
	if _, err := c.Tasks(ctx, "one", courier.Replicas(1)); err != nil {
		t.Fatalf("Replicas(1) again: %v", err)
	}
	if _, err := c.Tasks(ctx, "three", courier.Replicas(3)); !errors.Is(err, courier.ErrBadOptions) || !strings.Contains(err.Error(), "cluster") {
		t.Fatalf("Replicas(3) alone: %v, want a bad-options error naming the cluster", err)
	}
	if _, err := c.Tasks(ctx, "eight", courier.Replicas(8)); !errors.Is(err, courier.ErrBadOptions) {
		t.Fatalf("Replicas(8): %v, want bad options", err)
	}
	if _, err := c.Declare(ctx, "rr", courier.ExchangeSpec{ExchangeConfig: courierConfig("reqresp", 3)}); !errors.Is(err, courier.ErrBadOptions) {
		t.Fatalf("replicas on reqresp: %v, want bad options", err)
	}
	put := func(name, body string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "PUT", n.HTTPURL()+"/api/queues/"+name, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := put("q1", `{"durable":true,"arguments":{"x-quorum-initial-group-size":1}}`); code/100 != 2 {
		t.Fatalf("x-quorum-initial-group-size 1: %d", code)
	}
	if code := put("q3", `{"durable":true,"arguments":{"x-quorum-initial-group-size":3}}`); code != 400 {
		t.Fatalf("x-quorum-initial-group-size 3 alone: %d, want 400", code)
	}
	if code := put("q9", `{"durable":true,"arguments":{"x-quorum-initial-group-size":9}}`); code != 400 {
		t.Fatalf("x-quorum-initial-group-size 9: %d, want 400", code)
	}
}

func courierConfig(pattern string, replicas int) wire.ExchangeConfig {
	return wire.ExchangeConfig{Pattern: pattern, Replicas: replicas}
}
