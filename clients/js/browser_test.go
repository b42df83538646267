package js

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
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
