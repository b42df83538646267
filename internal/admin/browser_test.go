package admin_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// ScreenshotDirEnv names the directory where TestDashboardInBrowser saves
// its screenshots; without it they go to the test's temporary directory.
const ScreenshotDirEnv = "COURIER_SCREENSHOT_DIR"

// TestDashboardInBrowser loads the dashboard in headless chromium against
// a node under load, and checks that live figures appear and change, that
// the lists show the exchanges and connections, and that sorting works.
func TestDashboardInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test is not short")
	}
	bin := testutil.Chromium(t)
	dir := os.Getenv(ScreenshotDirEnv)
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	n, err := node.Start(node.Config{Name: "browser-test", DataDir: t.TempDir(), Log: quiet, Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	stopLoad, loadSub := startLoad(t, n)
	defer stopLoad()

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelCtx := chromedp.NewContext(actx)
	defer cancelCtx()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()

	var jsMu sync.Mutex // guards jsErrors
	var jsErrors []string
	err = chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			jsMu.Lock()
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			jsErrors = append(jsErrors, fmt.Sprintf("%s at %s:%d", msg, d.URL, d.LineNumber+1))
			jsMu.Unlock()
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				jsMu.Lock()
				var args []string
				for _, a := range ev.Args {
					if a.Value != nil {
						args = append(args, string(a.Value))
					} else {
						args = append(args, a.Description)
					}
				}
				jsErrors = append(jsErrors, "console.error "+strings.Join(args, " "))
				jsMu.Unlock()
			}
		}
	})
	if err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// readText reads the text of sel in one step of the page's own
	// script: the dashboard re-renders its tables on every poll, and a
	// node found in one DevTools call can be gone by the next ("No node
	// with given id found"; it failed a run of .ci/run so).
	readText := func(sel string) (string, error) {
		q, _ := json.Marshal(sel)
		s, err := chromedp.Run(ctx, chromedp.Evaluate[*string](`(() => { const e = document.querySelector(`+string(q)+`); return e ? e.innerText : null; })()`))
		if err == nil && s == nil {
			err = fmt.Errorf("no element matches %s", sel)
		}
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(*s), nil
	}
	text := func(sel string) string {
		t.Helper()
		s, err := readText(sel)
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return s
	}
	eval := func(what, js string) int {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[int](js))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
	// waitText polls the page until cond holds for the text of sel.
	waitText := func(sel, what string, cond func(string) bool) string {
		t.Helper()
		var last string
		ok := testutil.Eventually(30*time.Second, func() bool {
			s, err := readText(sel)
			if err != nil {
				return false
			}
			last = s
			return cond(last)
		})
		if !ok {
			t.Fatalf("%s: %s is %q", what, sel, last)
		}
		return last
	}
	shot := func(name string) {
		t.Helper()
		run("settle", chromedp.Sleep(300*time.Millisecond))
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}

	run("open the dashboard", chromedp.Navigate(n.HTTPURL()+"/"), chromedp.WaitVisible(chromedp.CSS("#chart-rates")))
	waitText("#node-name", "node name", func(s string) bool { return s == "browser-test" })
	waitText("#total-connections", "connections", func(s string) bool { return s == "3" })
	waitText("#total-exchanges", "exchanges", func(s string) bool { return s == "2" })

	// Live figures appear and change under load.
	rate := func(s string) float64 {
		f, _ := strconv.ParseFloat(strings.ReplaceAll(strings.TrimSuffix(s, "/s"), ",", ""), 64)
		return f
	}
	for _, k := range []string{"publish", "request", "deliver", "response"} {
		waitText("#rate-"+k, k+" rate", func(s string) bool { return rate(s) > 0 })
	}
	total := func(s string) int {
		v, _ := strconv.Atoi(strings.ReplaceAll(strings.TrimSuffix(s, " total"), ",", ""))
		return v
	}
	first := total(waitText("#rate-publish-total", "publish total", func(s string) bool { return total(s) > 0 }))
	waitText("#rate-publish-total", "publish total moving", func(s string) bool { return total(s) > first })
	// A few seconds of history make the chart worth looking at.
	time.Sleep(6 * time.Second)
	drawn := eval("inspect the chart", `(() => {
		const c = document.getElementById("chart-rates");
		const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
		let n = 0;
		for (let i = 0; i < d.length; i += 4) if (d[i+3] && d[i] > 200 && d[i+1] > 80 && d[i+1] < 160 && d[i+2] < 60) n++;
		return n; })()`)
	if drawn < 50 {
		t.Errorf("the rate chart has %d orange (publish) pixels: no line drawn", drawn)
	}
	shot("overview.png")

	// Exchanges: pattern, strategy, members and leader.
	run("open exchanges", chromedp.Navigate(n.HTTPURL()+"/#exchanges"), chromedp.WaitVisible(chromedp.CSS(`#exchanges-table tr[data-name="users"]`)))
	row := text(`#exchanges-table tr[data-name="users"]`)
	for _, w := range []string{"users", "reqresp", "round-robin", ".1"} {
		if !strings.Contains(row, w) {
			t.Errorf("users row %q lacks %q", row, w)
		}
	}
	leaders := eval("count leaders", `document.querySelectorAll('#exchanges-table tr[data-name="users"] .member.leader').length`)
	if leaders != 1 {
		t.Errorf("users row shows %d leaders, want 1", leaders)
	}
	// Sorting by publish rate, highest first, puts news on top.
	run("sort by publishes", chromedp.Click(chromedp.CSS(`#exchanges-table th[data-sort="message_stats.publish_details.rate"]`)))
	testutil.WaitForf(t, 10*time.Second, func() bool {
		a, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(`#exchanges-table tbody tr`), "data-name"))
		return err == nil && a.Value == "news"
	}, "news first when sorted by publish rate")
	waitText(`#exchanges-table tr[data-name="news"] td:nth-child(8)`, "news publish rate", func(s string) bool { return rate(s) > 0 })
	shot("exchanges.png")

	// Connections: embedded and network, with peers, protocols and
	// transports (one client over WebSocket).
	wsc, err := client.Dial(context.Background(), "ws://"+n.HTTPAddr().String()+"/ws", client.Options{Name: "ws-client", Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer wsc.Close()
	run("open connections", chromedp.Navigate(n.HTTPURL()+"/#connections"), chromedp.WaitVisible(chromedp.CSS(`#connections-table tbody tr[data-name]`)))
	conns := waitText("#connections-table tbody", "connections", func(s string) bool {
		return strings.Contains(s, "load-subscriber") && strings.Contains(s, "ws-client")
	})
	for _, w := range []string{"network", "embedded", "127.0.0.1:", "courier", "tcp", "websocket", "in-process"} {
		if !strings.Contains(conns, w) {
			t.Errorf("connections table lacks %q:\n%s", w, conns)
		}
	}
	shot("connections.png")

	// Queues: none yet, then two with messages waiting.
	run("open queues", chromedp.Navigate(n.HTTPURL()+"/#queues"), chromedp.WaitVisible(chromedp.CSS(`#queues-table td.empty`)))
	if s := text("#queues-table td.empty"); !strings.Contains(s, "No queues") {
		t.Errorf("queues empty state %q", s)
	}
	qc := n.Connect()
	defer qc.Close()
	for name, depth := range map[string]int{"jobs": 5, "mail": 2} {
		tasks, err := qc.Tasks(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for range depth {
			if _, err := tasks.Submit(ctx, courier.Task{Body: []byte("work")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Columns: name, messages, ready, unacked, consumers, memory...
	waitText(`#queues-table tr[data-name="jobs"] td:nth-child(3)`, "jobs ready", func(s string) bool { return s == "5" })
	waitText(`#queues-table tr[data-name="mail"] td:nth-child(3)`, "mail ready", func(s string) bool { return s == "2" })
	if s := text(`#queues-table tr[data-name="jobs"] td:nth-child(2)`); s != "5" {
		t.Errorf("jobs messages %q, want 5", s)
	}
	waitText("#nav-queues", "queue count", func(s string) bool { return s == "2" })
	shot("queues.png")

	// An alarm shows as a banner on every page while it is on: the queues
	// fill a memory high watermark cut to one byte.
	mem := n.Broker().Memory()
	limit := mem.Limit()
	mem.SetLimit(1)
	banner := waitText("#alarms", "memory alarm banner", func(s string) bool { return strings.Contains(s, "memory") })
	if !strings.Contains(banner, "memory high watermark") {
		t.Errorf("alarm banner %q", banner)
	}
	if v := eval("banner shown", `document.getElementById("alarms").hidden ? 0 : 1`); v != 1 {
		t.Errorf("the alarm banner is hidden")
	}
	shot("alarm.png")
	mem.SetLimit(limit)
	testutil.WaitForf(t, 10*time.Second, func() bool {
		v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("alarms").hidden`))
		return err == nil && v
	}, "the alarm banner goes when the alarm clears")

	// The Queued messages chart opens full: its first draw has the
	// server's history (7 messages ready for some seconds now), where a
	// chart of its own polls would need two polls to draw a line.
	run("reopen the overview", chromedp.Navigate(n.HTTPURL()+"/#overview"), chromedp.WaitVisible(chromedp.CSS("#chart-queued")))
	waitText("#queued-messages_ready", "queued ready", func(s string) bool { return s == "7" })
	blue := eval("inspect the queued chart", `(() => {
		const c = document.getElementById("chart-queued");
		const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
		let n = 0;
		for (let i = 0; i < d.length; i += 4) if (d[i+3] > 200 && d[i] < 60 && d[i+1] > 140 && d[i+1] < 190 && d[i+2] > 200) n++;
		return n; })()`)
	if blue < 50 {
		t.Errorf("the queued chart's first draw has %d blue (ready) pixels: it does not start from the server's history", blue)
	}

	// The dashboard's actions, each checked through the API.
	apiGet := func(path string, v any) int {
		t.Helper()
		resp, err := http.Get(n.HTTPURL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if v != nil && resp.StatusCode == http.StatusOK {
			if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode
	}
	ready := func(queue string) int {
		var q struct {
			Ready int `json:"messages_ready"`
		}
		if apiGet("/api/queues/"+queue, &q) != http.StatusOK {
			return -1
		}
		return q.Ready
	}
	// confirm answers the page's confirmation dialog: it must be open.
	confirm := func(what string, ok bool) {
		t.Helper()
		testutil.WaitForf(t, 10*time.Second, func() bool {
			v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("confirm").open`))
			return err == nil && v
		}, "the confirmation dialog of %s opens", what)
		button := "#confirm-cancel"
		if ok {
			button = "#confirm-ok"
		}
		// The button's own click(), as a person's click would: DevTools
		// mouse events land outside a modal dialog in headless chromium.
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { document.querySelector("`+button+`").click(); return true; })()`)); err != nil {
			t.Fatalf("answer %s: %v", what, err)
		}
		testutil.WaitForf(t, 10*time.Second, func() bool {
			v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("confirm").open`))
			return err == nil && !v
		}, "the confirmation dialog of %s closes", what)
	}
	// click clicks an element in one step of the page's script: a row's
	// button is re-rendered with its table every poll, and a node found
	// by one DevTools call can be gone by the next.
	click := func(sel string) {
		t.Helper()
		q, _ := json.Marshal(sel)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const e = document.querySelector(`+string(q)+`); if (!e) return false; e.click(); return true; })()`))
		if err != nil || !ok {
			t.Fatalf("click %s: %v (found: %v)", sel, err, ok)
		}
	}
	// setValue fills a field as typing would, in one step of the page's
	// script (chromedp.SetValue refuses an empty value).
	setValue := func(sel, v string) {
		t.Helper()
		q, _ := json.Marshal(sel)
		val, _ := json.Marshal(v)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const e = document.querySelector(`+string(q)+`); if (!e) return false;
			e.value = `+string(val)+`; e.dispatchEvent(new Event("input", { bubbles: true })); e.dispatchEvent(new Event("change", { bubbles: true })); return true; })()`))
		if err != nil || !ok {
			t.Fatalf("fill %s: %v (found: %v)", sel, err, ok)
		}
	}

	// A queue's page: figures, depth, consumers.
	run("open queue jobs", chromedp.Navigate(n.HTTPURL()+"/#queue/jobs"), chromedp.WaitVisible(chromedp.CSS("#detail-ready")))
	waitText("#detail-ready", "jobs ready on its page", func(s string) bool { return s == "5" })
	waitText("#detail-name", "jobs name", func(s string) bool { return s == "jobs" })
	// Get (peek): the messages show and stay.
	setValue("#get-count", "2")
	run("get messages", chromedp.Click(chromedp.CSS("#get-button")))
	got := waitText("#get-result", "peeked messages", func(s string) bool { return strings.Count(s, "Message ") == 2 })
	if !strings.Contains(got, "work") {
		t.Errorf("peeked messages %q lack their payload", got)
	}
	if r := ready("jobs"); r != 5 {
		t.Errorf("jobs has %d ready after a get, want 5: a get only peeks", r)
	}
	// Publish to the queue's exchange.
	setValue("#publish-payload", "from the dashboard")
	run("publish to jobs", chromedp.Click(chromedp.CSS("#publish-button")))
	waitText("#notice", "publish notice", func(s string) bool { return strings.Contains(s, "stored in jobs") })
	testutil.WaitForf(t, 10*time.Second, func() bool { return ready("jobs") == 6 }, "jobs has 6 ready after a publish")
	waitText("#detail-ready", "jobs ready after a publish", func(s string) bool { return s == "6" })
	shot("queue.png")
	// Purge asks first: cancelled, nothing happens; confirmed, it empties.
	run("purge jobs", chromedp.Click(chromedp.CSS("#purge-button")))
	confirm("purge", false)
	if r := ready("jobs"); r != 6 {
		t.Errorf("jobs has %d ready after a cancelled purge, want 6", r)
	}
	run("purge jobs", chromedp.Click(chromedp.CSS("#purge-button")))
	shot("confirm.png")
	confirm("purge", true)
	testutil.WaitForf(t, 10*time.Second, func() bool { return ready("jobs") == 0 }, "jobs is empty after a purge")
	waitText("#notice", "purge notice", func(s string) bool { return strings.Contains(s, "Purged 6 messages") })
	// Delete, confirmed: the queue is gone and the page goes back to the list.
	run("open queue mail", chromedp.Navigate(n.HTTPURL()+"/#queue/mail"), chromedp.WaitVisible(chromedp.CSS("#delete-button")))
	waitText("#detail-ready", "mail ready", func(s string) bool { return s == "2" })
	run("delete mail", chromedp.Click(chromedp.CSS("#delete-button")))
	confirm("delete", true)
	testutil.WaitForf(t, 10*time.Second, func() bool { return ready("mail") == -1 }, "mail is deleted")
	testutil.WaitForf(t, 10*time.Second, func() bool {
		h, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash`))
		return err == nil && h == "#queues"
	}, "back to the queue list after a delete")

	// An exchange's page: members with the leader, and a publish that a
	// subscriber receives.
	dash := n.Connect()
	defer dash.Close()
	newsEx, err := dash.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	heard := make(chan *courier.Delivery, 1)
	if _, err := newsEx.Subscribe(ctx, "dash.*", func(d *courier.Delivery) {
		select {
		case heard <- d:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	run("open exchange news", chromedp.Navigate(n.HTTPURL()+"/#exchange/news"), chromedp.WaitVisible(chromedp.CSS("#publish-key")))
	select {
	case <-loadSub.Done():
		t.Fatalf("the load subscriber's connection ended before the news page was checked: %v", loadSub.Err())
	default:
	}
	waitText("#detail-subscribers", "news subscribers", func(s string) bool { return s == "2" })
	setValue("#publish-key", "dash.test")
	setValue("#publish-headers", "source=dashboard")
	setValue("#publish-payload", "hello from the dashboard")
	run("publish to news", chromedp.Click(chromedp.CSS("#publish-button")))
	select {
	case d := <-heard:
		if string(d.Body) != "hello from the dashboard" || d.Key != "dash.test" || d.Header["source"] != "dashboard" {
			t.Errorf("the subscriber got %q key %q headers %v", d.Body, d.Key, d.Header)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the message published from the news page did not arrive")
	}
	waitText("#notice", "publish notice", func(s string) bool { return strings.Contains(s, "routed to the matching subscribers") })
	waitText("#detail-publish-rate", "news publish rate on its page", func(s string) bool { return rate(s) > 0 })
	run("open exchange users", chromedp.Navigate(n.HTTPURL()+"/#exchange/users"), chromedp.WaitVisible(chromedp.CSS("#detail-members tbody tr[data-name]")))
	members := waitText("#detail-members tbody", "users members", func(s string) bool { return strings.Count(s, "handler") == 2 })
	if !strings.Contains(members, "leader") || !strings.Contains(members, "eu") {
		t.Errorf("users members %q lack the leader or the service tag", members)
	}
	waitText("#detail-request-rate", "users request rate", func(s string) bool { return rate(s) > 0 })
	shot("exchange.png")

	// Close a connection, confirmed: the load's network subscriber.
	connNamed := func(name string) bool {
		var list []struct{ Name string }
		apiGet("/api/connections", &list)
		for _, c := range list {
			if c.Name == name {
				return true
			}
		}
		return false
	}
	run("open connections", chromedp.Navigate(n.HTTPURL()+"/#connections"), chromedp.WaitVisible(chromedp.CSS(`#connections-table [data-close]`)))
	if v := eval("embedded connections have no close button", `document.querySelectorAll('#connections-table tr').length - 1 - document.querySelectorAll('#connections-table [data-close]').length`); v < 1 {
		t.Errorf("every connection has a close button; embedded ones should not")
	}
	click(`#connections-table [data-close]`)
	confirm("close", true)
	testutil.WaitForf(t, 10*time.Second, func() bool { return !connNamed("load-subscriber") }, "the network subscriber's connection is closed")
	waitText("#notice", "close notice", func(s string) bool { return strings.Contains(s, "Closed connection") })

	// Users and permissions, on a node with users, as its administrator.
	usersPage(t, ctx, run, waitText, confirm, setValue, click, shot)
	run("back to the first node", chromedp.Navigate(n.HTTPURL()+"/"), chromedp.WaitVisible(chromedp.CSS("#chart-rates")))

	// The page says so when the API goes away.
	stopLoad()
	n.Close()
	waitText("#error", "error banner", func(s string) bool { return strings.Contains(s, "Cannot reach the management API") })

	jsMu.Lock()
	defer jsMu.Unlock()
	for _, e := range jsErrors {
		if !strings.Contains(e, "Failed to fetch") && !strings.Contains(e, "ERR_CONNECTION_REFUSED") {
			t.Errorf("JavaScript error: %s", e)
		}
	}
}

// startLoad makes requests and publishes on n until the returned function
// is called: a handler and a requester on "users", a network subscriber
// (returned) and a publisher on "news".
func startLoad(t *testing.T, n *node.Node) (stop func(), sub *courier.Conn) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	emb := n.Connect()
	users, err := emb.ReqResp(ctx, "users", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := users.Handle(ctx, func(r *courier.Request) { r.Reply([]byte("pong")) }); err != nil {
		t.Fatal(err)
	}
	if _, err := users.Handle(ctx, func(r *courier.Request) { r.Reply([]byte("pong")) }, courier.ServiceTag("eu")); err != nil {
		t.Fatal(err)
	}
	// Closed from the dashboard below: without reconnecting it stays
	// gone (a reconnecting client comes back, as RabbitMQ's do).
	sub, err = client.Dial(ctx, n.URL(), client.Options{Name: "load-subscriber", NoReconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	news, err := sub.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := news.Subscribe(ctx, "#", func(*courier.Delivery) {}); err != nil {
		t.Fatal(err)
	}
	pubConn := n.Connect()
	pub, err := pubConn.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			pub.PublishSync(ctx, courier.Message{Key: "eu.fr", Body: []byte("bonjour")})
			// A steady rate, not a flood: the subscriber, without
			// reconnecting, must keep up under -race on a loaded machine.
			time.Sleep(10 * time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			_, err := users.Request(ctx, courier.Message{Body: []byte("ping")})
			if err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
				t.Errorf("load request: %v", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			sub.Close()
			pubConn.Close()
			emb.Close()
		})
	}, sub
}

// usersPage drives the users page of a second node, with users, as its
// administrator: it adds a user, sets its permissions and deletes it,
// checking each through the API.
func usersPage(t *testing.T, ctx context.Context, run func(string, ...chromedp.Action[chromedp.Void]),
	waitText func(sel, what string, cond func(string) bool) string, confirm func(string, bool), setValue func(string, string), click func(string), shot func(string)) {
	t.Helper()
	a := startSecureAPI(t, func(c *node.Config) { c.Name = "browser-users" })
	a.want(http.StatusCreated, "admin", "adminpw", "PUT", "/api/users/mon", `{"password":"monpw","tags":"monitoring"}`)
	a.want(http.StatusNoContent, "admin", "adminpw", "PUT", "/api/permissions/mon", `{"read":"#"}`)
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:adminpw"))
	run("send the administrator's credentials", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		if _, err := cdp.Call(ctx, tg, network.Enable, network.EnableParams{}); err != nil {
			return err
		}
		_, err := cdp.Call(ctx, tg, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}})
		return err
	}))
	run("open users", chromedp.Navigate(a.url+"/#users"), chromedp.WaitVisible(chromedp.CSS(`#users-table tr[data-name="mon"]`)))
	waitText("#nav-users", "the users tab for an administrator", func(s string) bool { return s == "Users" })
	setValue("#user-name", "ops")
	setValue("#user-password", "opspw")
	setValue("#user-tags", "administrator")
	run("save ops", chromedp.Click(chromedp.CSS("#user-save")))
	waitText(`#users-table tr[data-name="ops"]`, "ops listed", func(s string) bool { return strings.Contains(s, "administrator") })
	a.want(http.StatusOK, "ops", "opspw", "GET", "/api/overview", "")
	click(`#users-table [data-edit-user="ops"]`)
	setValue("#perm-configure", "")
	setValue("#perm-write", "orders.#, news")
	setValue("#perm-read", "#")
	run("set ops's permissions", chromedp.Click(chromedp.CSS("#perm-save")))
	waitText(`#users-table tr[data-name="ops"]`, "ops's permissions listed", func(s string) bool { return strings.Contains(s, "orders.#, news") })
	var p struct{ Configure, Write, Read []string }
	if err := json.Unmarshal([]byte(a.want(http.StatusOK, "admin", "adminpw", "GET", "/api/permissions/ops", "")), &p); err != nil {
		t.Fatal(err)
	}
	if strings.Join(p.Write, " ") != "orders.# news" || strings.Join(p.Read, " ") != "#" || len(p.Configure) != 0 {
		t.Errorf("ops's permissions through the API: %+v", p)
	}
	shot("users.png")
	click(`#users-table [data-delete-user="ops"]`)
	confirm("delete user", true)
	testutil.WaitForf(t, 10*time.Second, func() bool {
		status, _, _ := a.call("admin", "adminpw", "GET", "/api/users/ops", "")
		return status == http.StatusNotFound
	}, "ops is deleted")
	waitText("#users-table tbody", "ops gone from the list", func(s string) bool { return !strings.Contains(s, "ops") })
}
