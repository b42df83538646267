package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/server"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

var (
	wireClash    = wire.Errorf(wire.CodeClash, "queue %q exists with other arguments", "clash")
	wireNotFound = wire.Errorf(wire.CodeNotFound, "queue not found")
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// clock is a fake clock the tests move by hand.
type clock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// harness is a node serving the network protocol, and a management
// server for its broker on an httptest server, with a fake clock and a
// sampler that runs only when the test calls Sample.
type harness struct {
	t   *testing.T
	n   *node.Node
	srv *admin.Server
	hs  *httptest.Server
	clk *clock
}

func describe(sink broker.Sink) (admin.ConnInfo, bool) {
	if ci, ok := server.Describe(sink); ok {
		return admin.ConnInfo{Type: "network", Protocol: "courier", Transport: ci.Protocol, Peer: ci.Peer, User: ci.User, ConnectedAt: ci.ConnectedAt}, true
	}
	return admin.ConnInfo{}, false
}

func start(t *testing.T, edit ...func(*admin.Config)) *harness {
	t.Helper()
	n, err := node.Start(node.Config{Name: "n1", DataDir: t.TempDir(), Log: quiet, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	clk := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	cfg := admin.Config{
		Broker: n.Broker(), Version: "v-test", SampleInterval: time.Hour, Log: quiet, Describe: describe,
		Listeners: func() []admin.Listener { return []admin.Listener{{Protocol: "courier", Address: n.Addr().String()}} },
	}
	admin.WithClock(&cfg, clk.Now)
	for _, e := range edit {
		e(&cfg)
	}
	h := serve(t, cfg)
	h.n, h.clk = n, clk
	return h
}

// serve starts a management server of cfg on an httptest server.
func serve(t *testing.T, cfg admin.Config) *harness {
	t.Helper()
	srv, err := admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Shutdown(context.Background())
	})
	return &harness{t: t, srv: srv, hs: hs}
}

// tick moves the clock by d and samples.
func (h *harness) tick(d time.Duration) {
	h.clk.Advance(d)
	h.srv.Sample()
}

func (h *harness) do(method, path, body string) (int, http.Header, []byte) {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.hs.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// get fetches path, expects 200 and JSON, and decodes it into v.
func (h *harness) get(path string, v any) {
	h.t.Helper()
	code, hdr, b := h.do("GET", path, "")
	if code != http.StatusOK {
		h.t.Fatalf("GET %s: %d %s", path, code, b)
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		h.t.Fatalf("GET %s: Content-Type %q", path, ct)
	}
	reflect.ValueOf(v).Elem().SetZero() // decode afresh, not into what v held
	if err := json.Unmarshal(b, v); err != nil {
		h.t.Fatalf("GET %s: %v\n%s", path, err, b)
	}
}

// fails expects an error answer: the status, and {"error": code, "reason": ...}
// with a reason containing every piece of want.
func (h *harness) fails(method, path, body string, status int, code string, want ...string) {
	h.t.Helper()
	got, hdr, b := h.do(method, path, body)
	if got != status {
		h.t.Errorf("%s %s: status %d, want %d: %s", method, path, got, status, b)
		return
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		h.t.Errorf("%s %s: error Content-Type %q", method, path, ct)
	}
	var e map[string]string
	if err := json.Unmarshal(b, &e); err != nil || len(e) != 2 {
		h.t.Errorf("%s %s: error body %s, want {error, reason}", method, path, b)
		return
	}
	if e["error"] != code {
		h.t.Errorf("%s %s: error %q, want %q (%s)", method, path, e["error"], code, e["reason"])
	}
	for _, w := range want {
		if !strings.Contains(e["reason"], w) {
			h.t.Errorf("%s %s: reason %q lacks %q", method, path, e["reason"], w)
		}
	}
}

func (h *harness) conn() *courier.Conn {
	h.t.Helper()
	c := h.n.Connect()
	h.t.Cleanup(func() { c.Close() })
	return c
}

func (h *harness) dial(name string) *courier.Conn {
	h.t.Helper()
	c, err := client.Dial(testutil.Context(h.t, 5*time.Second), h.n.URL(), client.Options{Name: name})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// obj is a decoded JSON object; at reads a dotted path.
type obj map[string]any

func (o obj) at(path string) any {
	var v any = map[string]any(o)
	for p := range strings.SplitSeq(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func (o obj) num(path string) float64 {
	f, _ := o.at(path).(float64)
	return f
}

// keys lists the leaf paths of o.
func (o obj) keys() []string {
	var out []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok {
				walk(prefix+k+".", sub)
				continue
			}
			out = append(out, prefix+k)
		}
	}
	walk("", o)
	slices.Sort(out)
	return out
}

func names(list []obj, key string) []string {
	var out []string
	for _, o := range list {
		out = append(out, fmt.Sprint(o.at(key)))
	}
	return out
}

func TestOverview(t *testing.T) {
	h := start(t)
	ctx := testutil.Context(t, 10*time.Second)
	pub := h.conn()
	ps, err := pub.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	sub := h.dial("subscriber")
	sps, err := sub.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, 100)
	if _, err := sps.Subscribe(ctx, "#", func(*courier.Delivery) { got <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	rr, err := pub.ReqResp(ctx, "users", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rr.Handle(ctx, func(r *courier.Request) { r.Reply([]byte("ok")) }); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if err := ps.PublishSync(ctx, courier.Message{Key: "a.b", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		if _, err := rr.Request(ctx, courier.Message{Body: []byte("q")}); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		testutil.Recv(t, got, 5*time.Second)
	}
	h.tick(2 * time.Second)

	var o obj
	h.get("/api/overview", &o)
	checks := map[string]float64{
		"object_totals.connections": 2, "object_totals.exchanges": 2, "object_totals.queues": 0,
		"object_totals.attachments": 2, "object_totals.patterns": 1, "queue_totals.messages": 0,
		"message_stats.publish": 10, "message_stats.publish_details.rate": 5,
		"message_stats.request": 4, "message_stats.request_details.rate": 2,
		"message_stats.deliver": 14, "message_stats.deliver_details.rate": 7,
		"message_stats.response": 4, "message_stats.response_details.rate": 2,
		"uptime": 2000, "sample_interval": 3600_000,
	}
	for k, want := range checks {
		if g := o.num(k); g != want {
			t.Errorf("overview %s = %v, want %v", k, g, want)
		}
	}
	if o["node"] != "n1" || o["courier_version"] != "v-test" || !strings.HasPrefix(fmt.Sprint(o["go_version"]), "go") {
		t.Errorf("overview names: %v %v %v", o["node"], o["courier_version"], o["go_version"])
	}
	ls, _ := o["listeners"].([]any)
	if len(ls) != 1 || ls[0].(map[string]any)["protocol"] != "courier" {
		t.Errorf("listeners %v", o["listeners"])
	}

	// Totals never go down: the subscriber's deliveries stay counted once
	// its connection is gone, before and after the sampler notices.
	sub.Close()
	testutil.WaitFor(t, 5*time.Second, func() bool { return h.n.Broker().SessionCount() == 1 })
	h.get("/api/overview", &o)
	if g := o.num("message_stats.deliver"); g != 14 {
		t.Errorf("deliver total %v right after a connection closed, want 14", g)
	}
	h.tick(time.Second)
	h.get("/api/overview", &o)
	if g := o.num("message_stats.deliver"); g != 14 {
		t.Errorf("deliver total %v after the sampler retired the connection, want 14", g)
	}
	if g := o.num("message_stats.deliver_details.rate"); g != 0 {
		t.Errorf("deliver rate %v with no traffic, want 0", g)
	}
	if err := h.n.Broker().Delete("news"); err != nil {
		t.Fatal(err)
	}
	h.tick(time.Second)
	h.get("/api/overview", &o)
	if g := o.num("message_stats.publish"); g != 10 {
		t.Errorf("publish total %v after its exchange was deleted, want 10", g)
	}

	// Columns apply to the overview too.
	h.get("/api/overview?columns=node,message_stats.publish", &o)
	if k := o.keys(); !slices.Equal(k, []string{"message_stats.publish", "node"}) {
		t.Errorf("overview columns: keys %v", k)
	}
	h.fails("GET", "/api/overview?columns=nope", "", 400, "bad_request", `unknown column "nope"`)
	h.fails("POST", "/api/overview", "", 405, "method_not_allowed", "GET")
}

func TestOverviewSamples(t *testing.T) {
	h := start(t)
	ctx := testutil.Context(t, 10*time.Second)
	ps, err := h.conn().PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		for range i {
			ps.PublishSync(ctx, courier.Message{Key: "k"})
		}
		h.tick(time.Second)
	}
	// 6 samples now: at start, then 0, 1, 2, 3, 4 publishes a second apart.
	var o obj
	h.get("/api/overview?msg_rates_age=4&msg_rates_incr=1", &o)
	samples, _ := o.at("message_stats.publish_details.samples").([]any)
	var got []float64
	var ts []float64
	for _, s := range samples {
		m := s.(map[string]any)
		got = append(got, m["sample"].(float64))
		ts = append(ts, m["timestamp"].(float64))
	}
	if !slices.Equal(got, []float64{10, 6, 3, 1, 0}) {
		t.Errorf("publish samples %v, want newest first [10 6 3 1 0]", got)
	}
	if len(ts) == 5 && ts[0]-ts[1] != 1000 {
		t.Errorf("sample timestamps %v, want 1000 ms apart", ts)
	}
	if r := o.num("message_stats.publish_details.rate"); r != 4 {
		t.Errorf("publish rate %v, want 4", r)
	}
	h.get("/api/overview?msg_rates_age=4&msg_rates_incr=2", &o)
	if s, _ := o.at("message_stats.request_details.samples").([]any); len(s) != 3 {
		t.Errorf("age 4 every 2: %d samples, want 3", len(s))
	}
	h.get("/api/overview", &o)
	if o.at("message_stats.publish_details.samples") != nil {
		t.Error("samples without msg_rates_age")
	}
	h.fails("GET", "/api/overview?msg_rates_age=0", "", 400, "bad_request", "msg_rates_age")
	h.fails("GET", "/api/overview?msg_rates_age=x", "", 400, "bad_request", "msg_rates_age")
	h.fails("GET", "/api/overview?msg_rates_age=60&msg_rates_incr=-1", "", 400, "bad_request", "msg_rates_incr")
	h.fails("GET", "/api/overview?msg_rates_incr=5", "", 400, "bad_request", "msg_rates_age")
}

// declare creates exchanges through the broker.
func declare(t *testing.T, b *broker.Broker, pattern, strategy string, names ...string) {
	t.Helper()
	for _, n := range names {
		var spec broker.Spec
		spec.Pattern, spec.Strategy = pattern, strategy
		if _, err := b.Declare(n, spec); err != nil {
			t.Fatal(err)
		}
	}
}

func TestExchanges(t *testing.T) {
	h := start(t)
	ctx := testutil.Context(t, 10*time.Second)
	b := h.n.Broker()
	declare(t, b, "pubsub", "", "news.eu", "news.us", "alpha")
	c := h.conn()
	rr, err := c.ReqResp(ctx, "users", courier.Leader)
	if err != nil {
		t.Fatal(err)
	}
	a1, err := rr.Handle(ctx, func(r *courier.Request) { r.Reply(nil) }, courier.ServiceTag("eu"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rr.Handle(ctx, func(r *courier.Request) { r.Reply(nil) }); err != nil {
		t.Fatal(err)
	}
	pubs := map[string]int{"news.eu": 6, "news.us": 2, "alpha": 4}
	for name, n := range pubs {
		ps, err := c.PubSub(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			ps.PublishSync(ctx, courier.Message{Key: "k"})
		}
	}
	for range 3 {
		if _, err := rr.Request(ctx, courier.Message{}); err != nil {
			t.Fatal(err)
		}
	}
	h.tick(2 * time.Second)

	var list []obj
	h.get("/api/exchanges", &list)
	if n := names(list, "name"); !slices.Equal(n, []string{"alpha", "news.eu", "news.us", "users"}) {
		t.Fatalf("names %v, want sorted by name", n)
	}
	users := list[3]
	wantKeys := []string{"controlled", "key_expr", "leader", "members", "message_stats.publish", "message_stats.publish_details.rate",
		"message_stats.request", "message_stats.request_details.rate", "name", "pattern", "route_expr", "strategy", "subscribers"}
	if k := users.keys(); !slices.Equal(k, wantKeys) {
		t.Errorf("exchange keys %v\nwant %v", k, wantKeys)
	}
	if users["pattern"] != "reqresp" || users["strategy"] != "leader" || users["leader"] != a1.ID() {
		t.Errorf("users: %v", users)
	}
	members, _ := users["members"].([]any)
	if len(members) != 2 || members[0].(map[string]any)["id"] != a1.ID() || members[0].(map[string]any)["service_tag"] != "eu" ||
		members[0].(map[string]any)["role"] != "handler" {
		t.Errorf("members %v", users["members"])
	}
	if users.num("message_stats.request") != 3 || users.num("message_stats.request_details.rate") != 1.5 {
		t.Errorf("users request stats %v", users["message_stats"])
	}
	if list[1].num("message_stats.publish") != 6 || list[1].num("message_stats.publish_details.rate") != 3 {
		t.Errorf("news.eu publish stats %v", list[1]["message_stats"])
	}

	t.Run("Columns", func(t *testing.T) {
		h.get("/api/exchanges?columns=name", &list)
		for _, o := range list {
			if k := o.keys(); !slices.Equal(k, []string{"name"}) {
				t.Errorf("columns=name: keys %v", k)
			}
		}
		h.get("/api/exchanges?columns=name,message_stats.publish_details.rate", &list)
		if k := list[0].keys(); !slices.Equal(k, []string{"message_stats.publish_details.rate", "name"}) {
			t.Errorf("nested column: keys %v", k)
		}
		h.get("/api/exchanges?columns=message_stats", &list)
		if k := list[0].keys(); len(k) != 4 || !strings.HasPrefix(k[0], "message_stats.") {
			t.Errorf("parent column: keys %v", k)
		}
		h.get("/api/exchanges?columns=name&columns=leader", &list)
		if k := list[3].keys(); !slices.Equal(k, []string{"leader", "name"}) {
			t.Errorf("repeated columns: keys %v", k)
		}
		h.fails("GET", "/api/exchanges?columns=name,bogus", "", 400, "bad_request", `unknown column "bogus"`, "name,pattern")
		h.fails("GET", "/api/exchanges?columns=message_stats.publish_details.rate.x", "", 400, "bad_request", "unknown column")
	})

	t.Run("Sort", func(t *testing.T) {
		h.get("/api/exchanges?columns=name&sort=name&sort_reverse=true", &list)
		if n := names(list, "name"); !slices.Equal(n, []string{"users", "news.us", "news.eu", "alpha"}) {
			t.Errorf("reverse by name: %v", n)
		}
		h.get("/api/exchanges?columns=name&sort=message_stats.publish", &list)
		if n := names(list, "name"); !slices.Equal(n, []string{"users", "news.us", "alpha", "news.eu"}) {
			t.Errorf("by publishes: %v", n)
		}
		h.get("/api/exchanges?columns=name&sort=message_stats.publish&sort_reverse=true", &list)
		if n := names(list, "name"); !slices.Equal(n, []string{"news.eu", "alpha", "news.us", "users"}) {
			t.Errorf("by publishes, reversed: %v", n)
		}
		h.get("/api/exchanges?columns=name&sort=members&sort_reverse=true", &list)
		if n := names(list, "name"); n[0] != "users" {
			t.Errorf("by members, reversed: %v", n)
		}
		h.get("/api/exchanges?columns=name&sort=pattern", &list)
		if n := names(list, "name"); !slices.Equal(n, []string{"alpha", "news.eu", "news.us", "users"}) {
			t.Errorf("by pattern (ties in name order): %v", n)
		}
		h.fails("GET", "/api/exchanges?sort=bogus", "", 400, "bad_request", `cannot sort by "bogus"`)
		h.fails("GET", "/api/exchanges?sort_reverse=maybe", "", 400, "bad_request", "sort_reverse")
	})

	t.Run("Pages", func(t *testing.T) {
		var p struct {
			FilteredCount int   `json:"filtered_count"`
			ItemCount     int   `json:"item_count"`
			Items         []obj `json:"items"`
			Page          int   `json:"page"`
			PageCount     int   `json:"page_count"`
			PageSize      int   `json:"page_size"`
			TotalCount    int   `json:"total_count"`
		}
		h.get("/api/exchanges?columns=name&page=2&page_size=3", &p)
		if p.FilteredCount != 4 || p.ItemCount != 1 || p.Page != 2 || p.PageCount != 2 || p.PageSize != 3 || p.TotalCount != 4 ||
			!slices.Equal(names(p.Items, "name"), []string{"users"}) {
			t.Errorf("page 2 of 3: %+v", p)
		}
		h.get("/api/exchanges?columns=name&page=1&page_size=2&sort=message_stats.publish&sort_reverse=true", &p)
		if n := names(p.Items, "name"); !slices.Equal(n, []string{"news.eu", "alpha"}) {
			t.Errorf("top 2 by publishes: %v", n)
		}
		h.get("/api/exchanges?columns=name&page=2&page_size=1&sort_reverse=true", &p)
		if n := names(p.Items, "name"); !slices.Equal(n, []string{"news.us"}) {
			t.Errorf("page 2 of 1, names reversed: %v", n)
		}
		h.get("/api/exchanges?page_size=2", &p)
		if p.Page != 1 || p.ItemCount != 2 {
			t.Errorf("page_size alone: %+v", p)
		}
		h.get("/api/exchanges?page=1", &p)
		if p.PageSize != 100 || p.ItemCount != 4 {
			t.Errorf("page alone: page size %d, %d items", p.PageSize, p.ItemCount)
		}
		h.get("/api/exchanges?page=1&name=nothing", &p)
		if p.FilteredCount != 0 || p.ItemCount != 0 || p.Items == nil || p.TotalCount != 4 {
			t.Errorf("empty page: %+v", p)
		}
		h.fails("GET", "/api/exchanges?page=3&page_size=2", "", 400, "bad_request", "page 3 out of range")
		h.fails("GET", "/api/exchanges?page=0", "", 400, "bad_request", "page")
		h.fails("GET", "/api/exchanges?page=x", "", 400, "bad_request", "page")
		h.fails("GET", "/api/exchanges?page=1&page_size=0", "", 400, "bad_request", "page_size")
		h.fails("GET", fmt.Sprintf("/api/exchanges?page=1&page_size=%d", admin.MaxPageSize+1), "", 400, "bad_request", "page_size")
	})

	t.Run("NameFilter", func(t *testing.T) {
		h.get("/api/exchanges?columns=name&name=NEWS", &list)
		if n := names(list, "name"); !slices.Equal(n, []string{"news.eu", "news.us"}) {
			t.Errorf("name=NEWS: %v", n)
		}
		h.get("/api/exchanges?columns=name&name=%5Ea%7Cs%24&use_regex=true", &list)
		if n := names(list, "name"); !slices.Equal(n, []string{"alpha", "news.us", "users"}) {
			t.Errorf("regex: %v", n)
		}
		h.fails("GET", "/api/exchanges?name=%28&use_regex=true", "", 400, "bad_request", "regular expression")
		h.fails("GET", "/api/exchanges?use_regex=perhaps", "", 400, "bad_request", "use_regex")
	})

	t.Run("One", func(t *testing.T) {
		var o obj
		h.get("/api/exchanges/news.eu", &o)
		if o["name"] != "news.eu" || o["pattern"] != "pubsub" || o.num("message_stats.publish") != 6 {
			t.Errorf("news.eu: %v", o)
		}
		h.get("/api/exchanges/users?columns=leader", &o)
		if k := o.keys(); !slices.Equal(k, []string{"leader"}) || o["leader"] != a1.ID() {
			t.Errorf("users?columns=leader: %v", o)
		}
		h.fails("GET", "/api/exchanges/nope", "", 404, "not_found", `"nope"`)
		h.fails("GET", "/api/exchanges/users?columns=x", "", 400, "bad_request", "unknown column")
		h.fails("POST", "/api/exchanges/users", "{}", 405, "method_not_allowed", "GET")
		h.fails("POST", "/api/exchanges", "{}", 405, "method_not_allowed", "GET")
	})
}

func TestExchangeCreateDelete(t *testing.T) {
	h := start(t)
	code, hdr, body := h.do("PUT", "/api/exchanges/orders", `{"pattern":"reqresp","strategy":"sticky"}`)
	if code != http.StatusCreated || hdr.Get("Location") != "/api/exchanges/orders" {
		t.Fatalf("create: %d %v %s", code, hdr, body)
	}
	var o obj
	json.Unmarshal(body, &o)
	if o["name"] != "orders" || o["strategy"] != "sticky" {
		t.Errorf("create answered %s", body)
	}
	if ex := h.n.Broker().Exchange("orders"); ex == nil || ex.Config().Strategy != "sticky" {
		t.Fatal("the broker has no exchange orders")
	}
	// The same again, or with fields left out, is not an error.
	for _, b := range []string{`{"pattern":"reqresp","strategy":"sticky"}`, `{}`} {
		if code, _, body := h.do("PUT", "/api/exchanges/orders", b); code != http.StatusOK {
			t.Errorf("PUT %s again: %d %s", b, code, body)
		}
	}
	if code, _, body := h.do("PUT", "/api/exchanges/feed", `{"pattern":"pubsub","controlled":true}`); code != http.StatusCreated {
		t.Errorf("create controlled pubsub: %d %s", code, body)
	}
	code, _, body = h.do("PUT", "/api/exchanges/routed", `{"pattern":"reqresp","strategy":"fun","route_expr":"null"}`)
	if code != http.StatusCreated {
		t.Errorf("create fun: %d %s", code, body)
	}
	h.fails("PUT", "/api/exchanges/orders", `{"pattern":"pubsub"}`, 409, "conflict", "pattern")
	h.fails("PUT", "/api/exchanges/bad", `{"pattern":"reqresp","strategy":"random"}`, 400, "bad_request", "unknown strategy")
	h.fails("PUT", "/api/exchanges/bad", `{}`, 400, "bad_request", "pattern missing")
	h.fails("PUT", "/api/exchanges/bad", `{"pattern":"reqresp","colour":"red"}`, 400, "bad_request", "colour")
	h.fails("PUT", "/api/exchanges/bad", `{"pattern":`, 400, "bad_request", "JSON")
	h.fails("PUT", "/api/exchanges/bad", `{"pattern":"pubsub"} {}`, 400, "bad_request", "more than one")
	h.fails("PUT", "/api/exchanges/bad", ``, 400, "bad_request", "empty")
	h.fails("PUT", "/api/exchanges/bad%20name", `{"pattern":"pubsub"}`, 400, "bad_request", "invalid exchange name")
	h.fails("PUT", "/api/exchanges/bad", `{"pattern":"reqresp","strategy":"fun","route_expr":"1 +"}`, 400, "bad_request", "route_expr")

	if code, _, body := h.do("DELETE", "/api/exchanges/orders", ""); code != http.StatusNoContent || len(body) != 0 {
		t.Errorf("delete: %d %s", code, body)
	}
	if h.n.Broker().Exchange("orders") != nil {
		t.Error("orders still exists")
	}
	h.fails("DELETE", "/api/exchanges/orders", "", 404, "not_found", `"orders"`)
}

func TestConnections(t *testing.T) {
	h := start(t)
	ctx := testutil.Context(t, 10*time.Second)
	before := time.Now()
	emb := h.conn()
	net1 := h.dial("worker-1")
	ps, err := emb.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, 10)
	nps, err := net1.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nps.Subscribe(ctx, "#", func(*courier.Delivery) { got <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		ps.PublishSync(ctx, courier.Message{Key: "k"})
	}
	for range 4 {
		testutil.Recv(t, got, 5*time.Second)
	}
	h.tick(2 * time.Second)

	var list []obj
	h.get("/api/connections", &list)
	if len(list) != 2 {
		t.Fatalf("%d connections, want 2: %v", len(list), list)
	}
	e, n := list[0], list[1]
	wantKeys := []string{"attachments", "connected_at", "id", "inflight",
		"message_stats.deliver", "message_stats.deliver_details.rate", "message_stats.publish", "message_stats.publish_details.rate",
		"message_stats.request", "message_stats.request_details.rate", "message_stats.response", "message_stats.response_details.rate",
		"name", "patterns", "peer", "protocol", "send_blocked_ms", "send_pending", "transport", "type", "user"}
	if k := n.keys(); !slices.Equal(k, wantKeys) {
		t.Errorf("connection keys %v\nwant %v", k, wantKeys)
	}
	if e["id"] != emb.ID() || e["type"] != "embedded" || e["peer"] != "" || e["protocol"] != "courier" || e["transport"] != "" || e.num("message_stats.publish") != 4 ||
		e.num("message_stats.publish_details.rate") != 2 {
		t.Errorf("embedded connection %v", e)
	}
	if n["id"] != net1.ID() || n["name"] != "worker-1" || n["type"] != "network" || n["protocol"] != "courier" || n["transport"] != "tcp" || !strings.HasPrefix(fmt.Sprint(n["peer"]), "127.0.0.1:") ||
		n.num("attachments") != 1 || n.num("patterns") != 1 || n.num("message_stats.deliver") != 4 || n.num("message_stats.deliver_details.rate") != 2 || n["user"] != "" {
		t.Errorf("network connection %v", n)
	}
	if at := time.UnixMilli(int64(n.num("connected_at"))); at.Before(before.Add(-time.Second)) || at.After(time.Now()) {
		t.Errorf("connected_at %v, want about %v", at, before)
	}

	// Ids name the node ("n1/c2"); a connection's URL takes its id as
	// two path segments or as one with the '/' escaped.
	if !strings.HasPrefix(net1.ID(), "n1/c") || !strings.HasPrefix(emb.ID(), "n1/c") {
		t.Errorf("connection ids %q and %q do not name the node n1", net1.ID(), emb.ID())
	}
	for _, path := range []string{"/api/connections/" + net1.ID(), "/api/connections/" + url.PathEscape(net1.ID())} {
		var o obj
		h.get(path+"?columns=id,peer", &o)
		if k := o.keys(); !slices.Equal(k, []string{"id", "peer"}) || o["id"] != net1.ID() {
			t.Errorf("one connection at %s: %v", path, o)
		}
	}
	h.fails("GET", "/api/connections/n9/"+strings.TrimPrefix(net1.ID(), "n1/"), "", 404, "not_found", "n9/c")
	h.get("/api/connections?columns=id&sort=id&sort_reverse=true", &list)
	if ids := names(list, "id"); !slices.Equal(ids, []string{net1.ID(), emb.ID()}) {
		t.Errorf("reverse by id: %v", ids)
	}
	h.get("/api/connections?columns=id&sort=message_stats.deliver", &list)
	if ids := names(list, "id"); !slices.Equal(ids, []string{emb.ID(), net1.ID()}) {
		t.Errorf("by deliveries: %v", ids)
	}
	h.get("/api/connections?columns=name&name=worker", &list)
	if len(list) != 1 || list[0]["name"] != "worker-1" {
		t.Errorf("name=worker: %v", list)
	}
	h.fails("GET", "/api/connections/n1/c999", "", 404, "not_found", "n1/c999")
	h.fails("GET", "/api/connections/c999", "", 404, "not_found", "c999")
	h.fails("GET", "/api/connections/x", "", 404, "not_found")
	h.fails("POST", "/api/connections/"+net1.ID(), "", 405, "method_not_allowed")
	// Without Config.CloseConn no connection can be closed.
	h.fails("DELETE", "/api/connections/"+net1.ID(), "", 501, "not_implemented", "cannot close")
	h.fails("GET", "/api/connections?columns=socket", "", 400, "bad_request", "unknown column")
}

func TestNodes(t *testing.T) {
	h := start(t)
	var list []obj
	h.get("/api/nodes", &list)
	if len(list) != 1 {
		t.Fatalf("nodes: %v", list)
	}
	n := list[0]
	if n["name"] != "n1" || n["running"] != true || n.num("mem_used") <= 0 || n.num("goroutines") <= 0 || n.num("os_pid") <= 0 ||
		n.num("processors") <= 0 || n.num("patterns") != 0 || n.num("mem_patterns") != 0 {
		t.Errorf("node %v", n)
	}
	if b, l := n.num("mem_budget"), n.num("mem_budget_limit"); b <= 0 || b > l {
		t.Errorf("memory budget %v, high watermark %v", b, l)
	}
	var o obj
	h.get("/api/nodes/n1?columns=name,uptime", &o)
	if k := o.keys(); !slices.Equal(k, []string{"name", "uptime"}) {
		t.Errorf("node columns: %v", o)
	}
	h.fails("GET", "/api/nodes/n2", "", 404, "not_found", `"n2"`)
	h.fails("GET", "/api/nope", "", 404, "not_found", "/api/nope")
}

// fakeQueues is a queue layer in memory.
type fakeQueues struct {
	mu sync.Mutex // guards q
	q  map[string]*admin.QueueInfo
}

func (f *fakeQueues) AppendQueues(dst []admin.QueueInfo) []admin.QueueInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, q := range f.q {
		dst = append(dst, *q)
	}
	return dst
}

func (f *fakeQueues) Queue(name string) (admin.QueueInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if q := f.q[name]; q != nil {
		return *q, true
	}
	return admin.QueueInfo{}, false
}

func (f *fakeQueues) CreateQueue(name string, spec admin.QueueSpec) (admin.QueueInfo, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name == "clash" {
		return admin.QueueInfo{}, false, wireClash
	}
	if q := f.q[name]; q != nil {
		return *q, false, nil
	}
	f.q[name] = &admin.QueueInfo{Name: name}
	return *f.q[name], true, nil
}

func (f *fakeQueues) DeleteQueue(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.q[name] == nil {
		return wireNotFound
	}
	delete(f.q, name)
	return nil
}

func (f *fakeQueues) PurgeQueue(name string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.q[name]
	if q == nil {
		return 0, wireNotFound
	}
	n := q.MessagesReady
	q.MessagesReady = 0
	return n, nil
}

func (f *fakeQueues) set(q admin.QueueInfo) {
	f.mu.Lock()
	f.q[q.Name] = &q
	f.mu.Unlock()
}

func TestQueuesWithoutQueueLayer(t *testing.T) {
	h := start(t)
	code, _, body := h.do("GET", "/api/queues", "")
	if code != 200 || string(body) != "[]" {
		t.Errorf("queues: %d %s, want []", code, body)
	}
	var p struct {
		Items      []obj `json:"items"`
		TotalCount int   `json:"total_count"`
	}
	h.get("/api/queues?page=1&columns=name,messages_ready", &p)
	if p.Items == nil || len(p.Items) != 0 || p.TotalCount != 0 {
		t.Errorf("paged queues: %+v", p)
	}
	h.fails("GET", "/api/queues?columns=bogus", "", 400, "bad_request", "unknown column")
	h.fails("GET", "/api/queues/jobs", "", 404, "not_found", `"jobs"`)
	h.fails("PUT", "/api/queues/jobs", `{"durable":true}`, 501, "not_implemented", "queues are not available")
	h.fails("DELETE", "/api/queues/jobs", "", 501, "not_implemented", "queues are not available")
	h.fails("DELETE", "/api/queues/jobs/contents", "", 501, "not_implemented", "queues are not available")
	h.fails("PUT", "/api/queues/jobs", `{"bogus":1}`, 400, "bad_request", "bogus")
}

func TestQueues(t *testing.T) {
	fq := &fakeQueues{q: map[string]*admin.QueueInfo{}}
	h := start(t, func(c *admin.Config) { c.Queues = fq })
	fq.set(admin.QueueInfo{Name: "jobs", MessagesReady: 5, MessagesUnacked: 2, Consumers: 3, Memory: 4096, Publish: 10, Deliver: 4, Ack: 2})
	fq.set(admin.QueueInfo{Name: "emails", MessagesReady: 9, Publish: 9})
	h.tick(time.Second) // a first sample sees both queues from zero
	fq.set(admin.QueueInfo{Name: "jobs", MessagesReady: 5, MessagesUnacked: 2, Consumers: 3, Memory: 4096, Publish: 30, Deliver: 14, Ack: 7})
	fq.set(admin.QueueInfo{Name: "archive"})
	h.tick(2 * time.Second)

	var list []obj
	h.get("/api/queues", &list)
	if n := names(list, "name"); !slices.Equal(n, []string{"archive", "emails", "jobs"}) {
		t.Fatalf("queues %v", n)
	}
	jobs := list[2]
	wantKeys := []string{"consumers", "memory", "message_stats.ack", "message_stats.ack_details.rate", "message_stats.deliver",
		"message_stats.deliver_details.rate", "message_stats.publish", "message_stats.publish_details.rate",
		"messages", "messages_ready", "messages_unacknowledged", "name", "type", "leader", "members", "online", "replicas",
		"membership_change", "replica_error"}
	slices.Sort(wantKeys)
	if k := jobs.keys(); !slices.Equal(k, wantKeys) {
		t.Errorf("queue keys %v\nwant %v", k, wantKeys)
	}
	want := map[string]float64{"messages": 7, "messages_ready": 5, "messages_unacknowledged": 2, "consumers": 3, "memory": 4096,
		"message_stats.publish": 30, "message_stats.publish_details.rate": 10, "message_stats.deliver_details.rate": 5,
		"message_stats.ack_details.rate": 2.5}
	for k, w := range want {
		if g := jobs.num(k); g != w {
			t.Errorf("jobs %s = %v, want %v", k, g, w)
		}
	}
	h.get("/api/queues?columns=name,messages_ready", &list)
	if k := list[0].keys(); !slices.Equal(k, []string{"messages_ready", "name"}) {
		t.Errorf("columns=name,messages_ready: keys %v", k)
	}
	h.get("/api/queues?columns=name&sort=messages_ready&sort_reverse=true", &list)
	if n := names(list, "name"); !slices.Equal(n, []string{"emails", "jobs", "archive"}) {
		t.Errorf("by ready, reversed: %v", n)
	}
	var o obj
	h.get("/api/overview", &o)
	if o.num("object_totals.queues") != 3 || o.num("queue_totals.messages_ready") != 14 || o.num("queue_totals.messages") != 16 ||
		o.num("message_stats.ack") != 7 {
		t.Errorf("overview with queues: %v %v %v", o["object_totals"], o["queue_totals"], o.at("message_stats.ack"))
	}

	h.get("/api/queues/jobs?columns=name,message_stats.ack_details", &o)
	if k := o.keys(); !slices.Equal(k, []string{"message_stats.ack_details.rate", "name"}) {
		t.Errorf("one queue: %v", o)
	}
	code, _, body := h.do("PUT", "/api/queues/new", `{"durable":true,"arguments":{"x-max-length":10}}`)
	if code != 201 {
		t.Errorf("create: %d %s", code, body)
	}
	if code, _, body := h.do("PUT", "/api/queues/new", ``); code != 200 {
		t.Errorf("create again: %d %s", code, body)
	}
	h.fails("PUT", "/api/queues/clash", `{}`, 409, "conflict", "exists")
	code, _, body = h.do("DELETE", "/api/queues/emails/contents", "")
	if code != 200 || string(body) != `{"message_count":9}` {
		t.Errorf("purge: %d %s", code, body)
	}
	h.fails("GET", "/api/queues/emails/contents", "", 405, "method_not_allowed", "DELETE")
	if code, _, body := h.do("DELETE", "/api/queues/emails", ""); code != 204 {
		t.Errorf("delete: %d %s", code, body)
	}
	h.fails("DELETE", "/api/queues/emails", "", 404, "not_found")
	h.fails("DELETE", "/api/queues/emails/contents", "", 404, "not_found")
	h.fails("GET", "/api/queues/emails", "", 404, "not_found")
	h.fails("POST", "/api/queues/jobs", "", 405, "method_not_allowed")
}

func TestMetrics(t *testing.T) {
	h := start(t)
	ctx := testutil.Context(t, 10*time.Second)
	c := h.conn()
	ps, err := c.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		ps.PublishSync(ctx, courier.Message{Key: "k"})
	}
	declare(t, h.n.Broker(), "reqresp", "round-robin", "users")
	h.do("GET", "/api/overview", "")

	code, hdr, body := h.do("GET", "/metrics", "")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: %d %s", code, hdr.Get("Content-Type"))
	}
	text := string(body)
	for _, line := range []string{
		`courier_node_info{node="n1",version="v-test"} 1`,
		"courier_connections 1", "courier_exchanges 2", "courier_queues 0", "courier_attachments 0",
		"courier_patterns 0", "courier_patterns_memory_bytes 0",
		"courier_publishes_total 3", "courier_requests_total 0", "courier_deliveries_total 0", "courier_responses_total 0",
		"courier_acks_total 0", "courier_queue_messages_ready 0", "courier_queue_messages_unacked 0",
		"# TYPE courier_publishes_total counter", "# TYPE courier_connections gauge",
		`courier_http_request_duration_seconds_count{endpoint="/api/overview"} 1`,
	} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	for _, prefix := range []string{"go_goroutines ", "go_memstats_heap_alloc_bytes ", "process_cpu_seconds_total ", "process_open_fds "} {
		if !strings.Contains(text, "\n"+prefix) {
			t.Errorf("/metrics lacks %s", prefix)
		}
	}
	if strings.Contains(text, `exchange="news"`) {
		t.Error("/metrics has per-exchange series; they belong to /metrics/per-object")
	}

	_, _, body = h.do("GET", "/metrics/per-object", "")
	text = string(body)
	for _, line := range []string{
		`courier_exchange_publishes_total{exchange="news"} 3`, `courier_exchange_requests_total{exchange="users"} 0`,
		`courier_exchange_members{exchange="users"} 0`, `courier_exchange_subscribers{exchange="news"} 0`,
		"# TYPE courier_exchange_publishes_total counter",
	} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("/metrics/per-object lacks %q:\n%s", line, text)
		}
	}
}

func TestMetricsPerQueue(t *testing.T) {
	fq := &fakeQueues{q: map[string]*admin.QueueInfo{}}
	h := start(t, func(c *admin.Config) { c.Queues = fq })
	fq.set(admin.QueueInfo{Name: "jobs", MessagesReady: 5, MessagesUnacked: 2, Consumers: 3, Memory: 4096, Publish: 10, Deliver: 4, Ack: 2})
	_, _, body := h.do("GET", "/metrics/per-object", "")
	for _, line := range []string{
		`courier_queue_messages_ready{queue="jobs"} 5`, `courier_queue_messages_unacked{queue="jobs"} 2`,
		`courier_queue_consumers{queue="jobs"} 3`, `courier_queue_memory_bytes{queue="jobs"} 4096`,
		`courier_queue_publishes_total{queue="jobs"} 10`, `courier_queue_deliveries_total{queue="jobs"} 4`,
		`courier_queue_acks_total{queue="jobs"} 2`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics/per-object lacks %q", line)
		}
	}
	_, _, body = h.do("GET", "/metrics", "")
	for _, line := range []string{"courier_queues 1", "courier_queue_messages_ready 5", "courier_acks_total 2"} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
}

func TestDashboardAssets(t *testing.T) {
	h := start(t)
	for path, want := range map[string]string{
		"/":           "text/html",
		"/app.js":     "text/javascript",
		"/style.css":  "text/css",
		"/index.html": "", // redirects to /
	} {
		code, hdr, body := h.do("GET", path, "")
		if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), want) || len(body) < 100 {
			t.Errorf("GET %s: %d %q, %d bytes", path, code, hdr.Get("Content-Type"), len(body))
		}
	}
	_, _, body := h.do("GET", "/", "")
	for _, w := range []string{`<script src="app.js">`, `id="chart-rates"`, `id="exchanges-table"`} {
		if !bytes.Contains(body, []byte(w)) {
			t.Errorf("index.html lacks %s", w)
		}
	}
	if code, _, _ := h.do("GET", "/nope.js", ""); code != 404 {
		t.Errorf("GET /nope.js: %d", code)
	}
	h.fails("POST", "/", "", 405, "method_not_allowed")
}

func TestLoopbackOnly(t *testing.T) {
	b := broker.New(broker.Config{Log: quiet})
	defer b.Close()
	for _, addr := range []string{"0.0.0.0:7480", ":7480", "192.0.2.1:0", "example.com:80", "nonsense"} {
		if _, err := admin.New(admin.Config{Broker: b, Listen: addr, Log: quiet}); err == nil {
			t.Errorf("admin.New accepted %q", addr)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "localhost:0", "127.0.0.2:0"} {
		s, err := admin.New(admin.Config{Broker: b, Listen: addr, Log: quiet})
		if err != nil {
			t.Errorf("admin.New refused %q: %v", addr, err)
			continue
		}
		s.Shutdown(context.Background())
	}
	if _, err := admin.New(admin.Config{Log: quiet}); err == nil {
		t.Error("admin.New accepted no broker")
	}
	_, err := node.Start(node.Config{DataDir: t.TempDir(), Log: quiet, Listen: "127.0.0.1:0", HTTP: "0.0.0.0:0"})
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("node.Start with HTTP on 0.0.0.0: %v", err)
	}
}

func TestNodeHTTP(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Log: quiet, HTTP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.HTTPAddr() == nil || !strings.HasPrefix(n.HTTPURL(), "http://127.0.0.1:") {
		t.Fatalf("HTTPURL %q", n.HTTPURL())
	}
	c := n.Connect()
	defer c.Close()
	resp, err := http.Get(n.HTTPURL() + "/api/connections")
	if err != nil {
		t.Fatal(err)
	}
	var list []obj
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list) != 1 || list[0]["type"] != "embedded" || list[0].num("connected_at") <= 0 {
		t.Errorf("connections through the node: %v", list)
	}
	var o obj
	resp, err = http.Get(n.HTTPURL() + "/api/overview?columns=listeners")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&o)
	resp.Body.Close()
	if ls, _ := o["listeners"].([]any); len(ls) != 1 || ls[0].(map[string]any)["address"] != n.HTTPAddr().String() {
		t.Errorf("listeners %v", o["listeners"])
	}

	// A second node cannot take the same address.
	_, err = node.Start(node.Config{DataDir: t.TempDir(), Log: quiet, HTTP: n.HTTPAddr().String()})
	if err == nil || !strings.Contains(err.Error(), n.HTTPAddr().String()) {
		t.Errorf("second node on %s: %v", n.HTTPAddr(), err)
	}
	url := n.HTTPURL()
	n.Close()
	if _, err := http.Get(url + "/api/overview"); err == nil {
		t.Error("the management API still answers after Close")
	}
}

// TestSamplerRuns checks the real sampler goroutine, on the real clock.
func TestSamplerRuns(t *testing.T) {
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	s, err := admin.New(admin.Config{Broker: n.Broker(), SampleInterval: 20 * time.Millisecond, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	defer hs.Close()
	defer s.Shutdown(context.Background())
	ctx := testutil.Context(t, 10*time.Second)
	ps, err := n.Connect().PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				ps.PublishSync(ctx, courier.Message{Key: "k"})
			}
		}
	}()
	defer func() { close(stop); <-done }()
	testutil.WaitForf(t, 5*time.Second, func() bool {
		resp, err := http.Get(hs.URL + "/api/exchanges/news?columns=message_stats.publish_details.rate")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var o obj
		json.NewDecoder(resp.Body).Decode(&o)
		return o.num("message_stats.publish_details.rate") > 0
	}, "a publish rate above 0")
}
