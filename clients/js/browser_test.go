package js

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// TestChromium runs clients/js/browsertest in headless Chromium: the
// page, served from another origin than the server's (which ws_origins
// allows), loads courier.js as an ES module with no build step and
// talks to a real server over WebSocket, a Go handler over TCP among
// its peers.
func TestChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test is not short")
	}
	bin := testutil.Chromium(t)
	pages := httptest.NewServer(http.FileServer(http.Dir(".")))
	defer pages.Close()
	pu, _ := url.Parse(pages.URL)
	n, err := node.Start(node.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0",
		WSOrigins: []string{pu.Host},
		Log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	gc, err := client.Dial(ctx, n.URL(), client.Options{Name: "go-echo"})
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	echo, err := gc.ReqResp(ctx, "go.echo", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := echo.Handle(ctx, func(r *courier.Request) { r.Reply(append([]byte("go:"), r.Body()...)) }); err != nil {
		t.Fatal(err)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelCtx := chromedp.NewContext(actx)
	defer cancelCtx()
	bctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()
	page := pages.URL + "/browsertest/index.html?ws=" + url.QueryEscape("ws://"+n.HTTPAddr().String()+"/ws")
	if err := chromedp.Do(bctx, chromedp.Navigate(page)); err != nil {
		t.Fatalf("open %s: %v", page, err)
	}
	var result string
	ok := testutil.Eventually(90*time.Second, func() bool {
		r, err := chromedp.Run(bctx, chromedp.Evaluate[*string](`window.__result ?? null`))
		if err != nil || r == nil {
			return false
		}
		result = *r
		return true
	})
	logText, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("log").textContent`))
	t.Logf("in Chromium:\n%s", logText)
	if !ok {
		t.Fatal("the page did not finish within 90s")
	}
	if !strings.HasPrefix(result, "PASS") {
		t.Fatalf("in Chromium: %s", result)
	}
}

// TestChromiumNodeSuite runs the whole Node.js suite (clients/js/test,
// every *.test.js) in headless Chromium, unchanged and with no build
// step: browsertest/node.html maps node:test, node:assert/strict and
// node:fs to small shims (browsertest/nodeshim) with an import map, and
// gives the suite its environment. The page's server passes /ws, /api/
// and /auth/ws through to the nodes, so that the page, its WebSockets
// and its management calls are of one origin, as a page served next to
// the server would be.
func TestChromiumNodeSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test is not short")
	}
	bin := testutil.Chromium(t)
	files, err := filepath.Glob(filepath.Join("test", "*.test.js"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for i, f := range files {
		files[i] = filepath.Base(f)
	}
	mux := http.NewServeMux()
	pages := httptest.NewServer(mux)
	defer pages.Close()
	pu, _ := url.Parse(pages.URL)
	n, secure := suiteServers(t, pu.Host)
	golden, _ := json.Marshal(goldenFrames(t))
	mux.Handle("/", http.FileServer(http.Dir(".")))
	mux.HandleFunc("/golden.json", func(w http.ResponseWriter, _ *http.Request) { w.Write(golden) })
	mux.Handle("/ws", passTo(n, "/ws"))
	mux.Handle("/api/", passTo(n, ""))
	mux.Handle("/auth/ws", passTo(secure, "/ws"))

	bctx := browser(t, bin)
	q := url.Values{
		"ws": {"ws://" + pu.Host + "/ws"}, "auth": {"ws://" + pu.Host + "/auth/ws"},
		"golden": {"/golden.json"}, "files": {strings.Join(files, ",")},
	}
	page := pages.URL + "/browsertest/node.html?" + q.Encode()
	if err := chromedp.Do(bctx, chromedp.Navigate(page)); err != nil {
		t.Fatalf("open %s: %v", page, err)
	}
	var result string
	ok := testutil.Eventually(3*time.Minute, func() bool {
		r, err := chromedp.Run(bctx, chromedp.Evaluate[*string](`window.__result ?? null`))
		if err != nil || r == nil {
			return false
		}
		result = *r
		return true
	})
	logText, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("log").textContent`))
	t.Logf("the Node.js suite (%s) in Chromium:\n%s", strings.Join(files, ", "), logText)
	if !ok {
		t.Fatal("the suite did not finish within 3 minutes")
	}
	if !strings.HasPrefix(result, "PASS") {
		t.Fatalf("in Chromium: %s", result)
	}
}

// passTo passes requests through to n's management listener, path
// replacing theirs unless empty; WebSocket upgrades too.
func passTo(n *node.Node, path string) http.Handler {
	target, _ := url.Parse(n.HTTPURL())
	return &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.Host = r.In.Host // the page's origin is the node's, as seen
		if path != "" {
			r.Out.URL.Path = path
		}
	}}
}

// browser starts headless Chromium for one test.
func browser(t *testing.T, bin string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(cancelCtx)
	bctx, cancel := context.WithTimeout(bctx, 5*time.Minute)
	t.Cleanup(cancel)
	return bctx
}
