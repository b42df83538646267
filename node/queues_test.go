package node_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// TestQueuesAPI: the management API lists task exchanges' queues and
// durable subscriptions with live counters, creates queues with RabbitMQ's
// arguments, purges and deletes them.
func TestQueuesAPI(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Log: quiet(), HTTP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := testutil.Context(t, 30*time.Second)
	base := n.HTTPURL()
	call := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := call("PUT", "/api/queues/jobs", `{"durable":true,"arguments":{"x-delivery-limit":3,"x-single-active-consumer":true}}`); code/100 != 2 {
		t.Fatalf("create queue: %d %s", code, body)
	}
	if code, body := call("PUT", "/api/queues/bad", `{"durable":true,"arguments":{"x-max-priority":"x"}}`); code != 400 {
		t.Fatalf("unsupported argument: %d %s", code, body)
	}
	c := n.Connect()
	jobs, err := c.Tasks(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	if jobs.Info().Strategy != string(courier.SingleActive) || jobs.Info().MaxAttempts != 3 {
		t.Fatalf("queue created as %+v", jobs.Info())
	}
	for range 5 {
		if _, err := jobs.Submit(ctx, courier.Task{Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := c.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := ps.Subscribe(ctx, "#", func(*courier.Delivery) {}, courier.Durable("archive"))
	if err != nil {
		t.Fatal(err)
	}
	sub.Detach(ctx)
	ps.PublishSync(ctx, courier.Message{Key: "a"})

	var rows []map[string]any
	_, body := call("GET", "/api/queues?columns=name,messages_ready", "")
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	got := map[string]float64{}
	for _, r := range rows {
		if len(r) != 2 {
			t.Fatalf("row %v: want only the two columns", r)
		}
		got[r["name"].(string)] = r["messages_ready"].(float64)
	}
	if got["jobs"] != 5 || got["news/archive"] != 1 || len(got) != 2 {
		t.Fatalf("queues %v", got)
	}
	if code, body := call("DELETE", "/api/queues/jobs/contents", ""); code/100 != 2 {
		t.Fatalf("purge: %d %s", code, body)
	}
	if st := n.Broker().Queue("jobs").Stats(); st.Messages() != 0 {
		t.Fatalf("after purge: %+v", st)
	}
	if code, body := call("DELETE", "/api/queues/news%2Farchive", ""); code/100 != 2 {
		t.Fatalf("delete subscription: %d %s", code, body)
	}
	if code, _ := call("GET", "/api/queues/news%2Farchive", ""); code != 404 {
		t.Fatalf("deleted subscription: %d", code)
	}
}
