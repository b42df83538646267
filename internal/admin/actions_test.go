package admin_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// actionsAPI is a node with users for the dashboard's actions: admin
// (administrator, every permission), mon (monitoring) and ops
// (administrator without any permission on exchanges and queues).
func actionsAPI(t *testing.T) *secureAPI {
	t.Helper()
	a := startSecureAPI(t, nil)
	a.want(http.StatusCreated, "admin", "adminpw", "PUT", "/api/users/mon", `{"password":"monpw","tags":["monitoring"]}`)
	a.want(http.StatusCreated, "admin", "adminpw", "PUT", "/api/users/ops", `{"password":"opspw","tags":["administrator"]}`)
	return a
}

func TestPublishThroughAPI(t *testing.T) {
	a := actionsAPI(t)
	ctx := testutil.Context(t, 20*time.Second)
	c := a.n.Connect()
	defer c.Close()
	news, err := c.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []*courier.Delivery
	if _, err := news.Subscribe(ctx, "eu.*", func(d *courier.Delivery) {
		mu.Lock()
		got = append(got, d)
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	b := a.want(http.StatusOK, "admin", "adminpw", "POST", "/api/exchanges/news/publish",
		`{"routing_key":"eu.fr","payload":"bonjour","payload_encoding":"string","properties":{"headers":{"lang":"fr"},"delivery_mode":2}}`)
	if b != `{"routed":true}` {
		t.Errorf("publish answered %s", b)
	}
	testutil.WaitForf(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 1
	}, "the subscriber gets the message published through the API")
	mu.Lock()
	if d := got[0]; string(d.Body) != "bonjour" || d.Key != "eu.fr" || d.Header["lang"] != "fr" {
		t.Errorf("delivered %q key %q headers %v", d.Body, d.Key, d.Header)
	}
	mu.Unlock()
	if b := a.want(http.StatusOK, "admin", "adminpw", "POST", "/api/exchanges/news/publish", `{"routing_key":"us.ny","payload":"aGk=","payload_encoding":"base64"}`); b != `{"routed":false}` {
		t.Errorf("publish with no subscriber answered %s", b)
	}

	// A task exchange: the publish is a confirmed submit.
	if _, err := c.Tasks(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}
	var sub struct {
		Routed bool
		ID     uint64
	}
	json.Unmarshal([]byte(a.want(http.StatusOK, "admin", "adminpw", "POST", "/api/exchanges/jobs/publish",
		`{"payload":"work","properties":{"priority":7}}`)), &sub)
	if !sub.Routed || sub.ID == 0 {
		t.Errorf("submit answered %+v", sub)
	}
	q := a.want(http.StatusOK, "admin", "adminpw", "GET", "/api/queues/jobs", "")
	if !strings.Contains(q, `"messages_ready":1`) {
		t.Errorf("jobs after a publish: %s", q)
	}

	// Refusals.
	if _, err := c.ReqResp(ctx, "users", courier.RoundRobin); err != nil {
		t.Fatal(err)
	}
	a.want(http.StatusConflict, "admin", "adminpw", "POST", "/api/exchanges/users/publish", `{"payload":"x"}`)
	a.want(http.StatusNotFound, "admin", "adminpw", "POST", "/api/exchanges/ghost/publish", `{"payload":"x"}`)
	a.want(http.StatusBadRequest, "admin", "adminpw", "POST", "/api/exchanges/news/publish", `{"payload":"!","payload_encoding":"base64"}`)
	a.want(http.StatusBadRequest, "admin", "adminpw", "POST", "/api/exchanges/news/publish", `{"payload":"x","mandatory":true}`)
	a.want(http.StatusBadRequest, "admin", "adminpw", "POST", "/api/exchanges/jobs/publish", `{"payload":"x","properties":{"priority":10}}`)
	a.want(http.StatusMethodNotAllowed, "admin", "adminpw", "GET", "/api/exchanges/news/publish", "")
	a.want(http.StatusUnauthorized, "", "", "POST", "/api/exchanges/news/publish", `{"payload":"x"}`)
	a.want(http.StatusForbidden, "mon", "monpw", "POST", "/api/exchanges/news/publish", `{"payload":"x"}`)
	if b := a.want(http.StatusForbidden, "ops", "opspw", "POST", "/api/exchanges/news/publish", `{"routing_key":"eu.de","payload":"x"}`); !strings.Contains(b, "write permission") {
		t.Errorf("ops without write permission: %s", b)
	}
	a.want(http.StatusNoContent, "admin", "adminpw", "PUT", "/api/permissions/ops", `{"write":"news"}`)
	a.want(http.StatusOK, "ops", "opspw", "POST", "/api/exchanges/news/publish", `{"routing_key":"eu.de","payload":"x"}`)
	testutil.WaitForf(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 2
	}, "ops's publish arrives once it may write")
}

func TestGetMessagesThroughAPI(t *testing.T) {
	a := actionsAPI(t)
	ctx := testutil.Context(t, 20*time.Second)
	c := a.n.Connect()
	defer c.Close()
	tasks, err := c.Tasks(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	for i, body := range []string{"one", "two", "three"} {
		task := courier.Task{Body: []byte(body), Key: "", Header: map[string]string{"n": body}}
		if i == 2 {
			task.Body = []byte{0xff, 0xfe, 'x'}
		}
		if _, err := tasks.Submit(ctx, task); err != nil {
			t.Fatal(err)
		}
	}
	var msgs []struct {
		Payload         string
		PayloadEncoding string `json:"payload_encoding"`
		PayloadBytes    int    `json:"payload_bytes"`
		MessageCount    int    `json:"message_count"`
		Truncated       bool
		Properties      struct{ Headers map[string]string }
	}
	json.Unmarshal([]byte(a.want(http.StatusOK, "admin", "adminpw", "POST", "/api/queues/jobs/get",
		`{"count":5,"ackmode":"ack_requeue_true","encoding":"auto","truncate":50000}`)), &msgs)
	if len(msgs) != 3 || msgs[0].Payload != "one" || msgs[0].PayloadEncoding != "string" || msgs[0].Properties.Headers["n"] != "one" ||
		msgs[0].MessageCount != 2 || msgs[2].PayloadEncoding != "base64" || msgs[2].Payload != "//54" {
		t.Fatalf("get answered %+v", msgs)
	}
	// Only a peek: the messages are still there, none delivered.
	q := a.want(http.StatusOK, "admin", "adminpw", "GET", "/api/queues/jobs", "")
	if !strings.Contains(q, `"messages_ready":3`) || !strings.Contains(q, `"deliver":0`) {
		t.Errorf("jobs after a get: %s", q)
	}
	json.Unmarshal([]byte(a.want(http.StatusOK, "admin", "adminpw", "POST", "/api/queues/jobs/get", `{"truncate":2}`)), &msgs)
	if len(msgs) != 1 || msgs[0].Payload != "on" || !msgs[0].Truncated || msgs[0].PayloadBytes != 3 {
		t.Errorf("get truncated to 2 bytes: %+v", msgs)
	}
	a.want(http.StatusBadRequest, "admin", "adminpw", "POST", "/api/queues/jobs/get", `{"ackmode":"ack_requeue_false"}`)
	a.want(http.StatusBadRequest, "admin", "adminpw", "POST", "/api/queues/jobs/get", `{"count":101}`)
	a.want(http.StatusBadRequest, "admin", "adminpw", "POST", "/api/queues/jobs/get", `{"encoding":"hex"}`)
	a.want(http.StatusNotFound, "admin", "adminpw", "POST", "/api/queues/ghost/get", `{}`)
	a.want(http.StatusMethodNotAllowed, "admin", "adminpw", "GET", "/api/queues/jobs/get", "")
	a.want(http.StatusUnauthorized, "", "", "POST", "/api/queues/jobs/get", `{}`)
	a.want(http.StatusForbidden, "mon", "monpw", "POST", "/api/queues/jobs/get", `{}`)
	if b := a.want(http.StatusForbidden, "ops", "opspw", "POST", "/api/queues/jobs/get", `{}`); !strings.Contains(b, "read permission") {
		t.Errorf("ops without read permission: %s", b)
	}
}

func TestPurgeAndDeleteNeedPermissions(t *testing.T) {
	a := actionsAPI(t)
	ctx := testutil.Context(t, 20*time.Second)
	c := a.n.Connect()
	defer c.Close()
	tasks, err := c.Tasks(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if _, err := tasks.Submit(ctx, courier.Task{Body: []byte("w")}); err != nil {
			t.Fatal(err)
		}
	}
	a.want(http.StatusForbidden, "mon", "monpw", "DELETE", "/api/queues/jobs/contents", "")
	a.want(http.StatusForbidden, "ops", "opspw", "DELETE", "/api/queues/jobs/contents", "")
	a.want(http.StatusForbidden, "ops", "opspw", "DELETE", "/api/queues/jobs", "")
	a.want(http.StatusForbidden, "ops", "opspw", "DELETE", "/api/exchanges/jobs", "")
	if b := a.want(http.StatusOK, "admin", "adminpw", "GET", "/api/queues/jobs", ""); !strings.Contains(b, `"messages_ready":4`) {
		t.Fatalf("refused purges changed the queue: %s", b)
	}
	a.want(http.StatusNoContent, "admin", "adminpw", "PUT", "/api/permissions/ops", `{"read":"jobs"}`)
	if b := a.want(http.StatusOK, "ops", "opspw", "DELETE", "/api/queues/jobs/contents", ""); b != `{"message_count":4}` {
		t.Errorf("purge answered %s", b)
	}
	a.want(http.StatusForbidden, "ops", "opspw", "DELETE", "/api/queues/jobs", "")
	a.want(http.StatusNoContent, "admin", "adminpw", "PUT", "/api/permissions/ops", `{"configure":"jobs"}`)
	a.want(http.StatusNoContent, "ops", "opspw", "DELETE", "/api/queues/jobs", "")
	a.want(http.StatusNotFound, "admin", "adminpw", "GET", "/api/queues/jobs", "")
}

func TestCloseConnectionThroughAPI(t *testing.T) {
	a := actionsAPI(t)
	ctx := testutil.Context(t, 20*time.Second)
	// A client that reconnects comes back (as RabbitMQ's and NATS's do
	// after a forced close); this one does not, to see what it is told.
	cl, err := client.Dial(ctx, "courier://admin:adminpw@"+a.n.Addr().String(), client.Options{Name: "to-close", NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	news, err := cl.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := news.Subscribe(ctx, "#", func(*courier.Delivery) {}); err != nil {
		t.Fatal(err)
	}
	emb := a.n.Connect()
	defer emb.Close()
	if _, err := emb.PubSub(ctx, "news"); err != nil {
		t.Fatal(err)
	}
	var conns []struct{ ID, Name, Type string }
	json.Unmarshal([]byte(a.want(http.StatusOK, "admin", "adminpw", "GET", "/api/connections", "")), &conns)
	var netID, embID string
	for _, c := range conns {
		switch {
		case c.Name == "to-close":
			netID = c.ID
		case c.Type == "embedded":
			embID = c.ID
		}
	}
	if netID == "" || embID == "" {
		t.Fatalf("connections %+v", conns)
	}
	a.want(http.StatusUnauthorized, "", "", "DELETE", "/api/connections/"+netID, "")
	a.want(http.StatusForbidden, "mon", "monpw", "DELETE", "/api/connections/"+netID, "")
	a.want(http.StatusConflict, "admin", "adminpw", "DELETE", "/api/connections/"+embID, "")
	a.want(http.StatusNotFound, "admin", "adminpw", "DELETE", "/api/connections/c999999", "")
	a.want(http.StatusNoContent, "admin", "adminpw", "DELETE", "/api/connections/"+netID, "", "X-Reason", "maintenance")
	select {
	case <-cl.Done():
	case <-ctx.Done():
		t.Fatal("the client's connection is still open after DELETE")
	}
	var we *wire.Error
	if err := cl.Err(); !errors.Is(err, courier.ErrClosed) || !errors.As(err, &we) || !strings.Contains(we.Msg, "closed by admin") || !strings.Contains(we.Msg, "maintenance") {
		t.Errorf("the client was told %v", err)
	}
	testutil.WaitForf(t, 10*time.Second, func() bool {
		_, _, b := a.call("admin", "adminpw", "GET", "/api/exchanges/news", "")
		return strings.Contains(b, `"subscribers":0`)
	}, "the closed connection's subscriber leaves news")
	a.want(http.StatusNotFound, "admin", "adminpw", "GET", "/api/connections/"+netID, "")
}

// The overview's history of queued messages fills the dashboard's chart
// when it opens: RabbitMQ's queue_totals samples.
func TestOverviewQueuedSamples(t *testing.T) {
	fq := &fakeQueues{q: map[string]*admin.QueueInfo{}}
	h := start(t, func(c *admin.Config) { c.Queues = fq })
	for i := range 4 {
		fq.set(admin.QueueInfo{Name: "q", MessagesReady: uint64(10 * i), MessagesUnacked: uint64(i)})
		h.tick(time.Second)
	}
	var o obj
	h.get("/api/overview?msg_rates_age=3&msg_rates_incr=1", &o)
	read := func(path string) (vals, ts []float64) {
		samples, _ := o.at(path).([]any)
		for _, s := range samples {
			m := s.(map[string]any)
			vals = append(vals, m["sample"].(float64))
			ts = append(ts, m["timestamp"].(float64))
		}
		return vals, ts
	}
	ready, ts := read("queue_totals.messages_ready_details.samples")
	if !slices.Equal(ready, []float64{30, 20, 10, 0}) {
		t.Errorf("ready samples %v, want newest first [30 20 10 0]", ready)
	}
	if len(ts) == 4 && ts[0]-ts[1] != 1000 {
		t.Errorf("timestamps %v, want 1000 ms apart", ts)
	}
	if unacked, _ := read("queue_totals.messages_unacknowledged_details.samples"); !slices.Equal(unacked, []float64{3, 2, 1, 0}) {
		t.Errorf("unacked samples %v, want [3 2 1 0]", unacked)
	}
	h.get("/api/overview", &o)
	if o.at("queue_totals.messages_ready_details.samples") != nil {
		t.Error("queued samples without msg_rates_age")
	}
}

// A durable subscription's queue ("news/archive") is covered by its
// exchange's permissions, as on the wire.
func TestSubscriptionQueuePermissions(t *testing.T) {
	a := actionsAPI(t)
	ctx := testutil.Context(t, 20*time.Second)
	c := a.n.Connect()
	defer c.Close()
	news, err := c.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := news.Subscribe(ctx, "#", func(*courier.Delivery) {}, courier.Durable("archive"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := news.PublishSync(ctx, courier.Message{Key: "k", Body: []byte("kept")}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitForf(t, 10*time.Second, func() bool {
		_, _, b := a.call("admin", "adminpw", "GET", "/api/queues/news%2Farchive", "")
		return strings.Contains(b, `"messages_ready":3`)
	}, "news/archive holds the 3 messages published while detached")
	a.want(http.StatusForbidden, "ops", "opspw", "POST", "/api/queues/news%2Farchive/get", `{}`)
	a.want(http.StatusNoContent, "admin", "adminpw", "PUT", "/api/permissions/ops", `{"read":"news"}`)
	var msgs []struct{ Payload string }
	json.Unmarshal([]byte(a.want(http.StatusOK, "ops", "opspw", "POST", "/api/queues/news%2Farchive/get", `{"count":10}`)), &msgs)
	if len(msgs) != 3 || msgs[0].Payload != "kept" {
		t.Errorf("get from news/archive: %+v", msgs)
	}
	if b := a.want(http.StatusOK, "ops", "opspw", "DELETE", "/api/queues/news%2Farchive/contents", ""); b != `{"message_count":3}` {
		t.Errorf("purge of news/archive answered %s", b)
	}
}
