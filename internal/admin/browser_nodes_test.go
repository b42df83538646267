package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// TestDashboardNodesInBrowser opens the Nodes page of a node of a
// three-node cluster in headless chromium: every node is listed alive
// with its addresses and its link, and a node that closes shows as left.
func TestDashboardNodesInBrowser(t *testing.T) {
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
	secret := []byte("browser test cluster secret!!!!!")
	var nodes []*node.Node
	for _, name := range []string{"n1", "n2", "n3"} {
		cc := node.ClusterConfig{Listen: "127.0.0.1:0", Secret: secret}
		if len(nodes) > 0 {
			cc.Join = []string{nodes[0].ClusterAddr()}
		}
		n, err := node.Start(node.Config{Name: name, DataDir: t.TempDir(), Log: quiet, Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Cluster: cc})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		nodes = append(nodes, n)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1440, 700),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelCtx := chromedp.NewContext(actx)
	defer cancelCtx()
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var jsErrors []string
	if err := chromedp.Listen(ctx, func(ev any) {
		if ev, ok := ev.(*runtime.EventExceptionThrown); ok {
			jsErrors = append(jsErrors, ev.ExceptionDetails.Text)
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
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
			body, _ := readText("body")
			t.Fatalf("%s: %s is %q; js errors %v; page:\n%s", what, sel, last, jsErrors, body)
		}
		return last
	}
	shot := func(name string) {
		t.Helper()
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

	n1 := nodes[0]
	if err := chromedp.Do(ctx, chromedp.Navigate(n1.HTTPURL()+"/#nodes")); err != nil {
		t.Fatalf("open the nodes page: %v", err)
	}
	for _, n := range nodes {
		row := waitText(`#nodes-table tr[data-name="`+n.Name()+`"]`, n.Name()+" row", func(s string) bool {
			return strings.Contains(s, "alive") && (n == n1 || strings.Contains(s, "up"))
		})
		for _, want := range []string{n.ClusterAddr(), n.URL(), n.HTTPURL()} {
			if !strings.Contains(row, want) {
				t.Errorf("%s row %q lacks %q", n.Name(), row, want)
			}
		}
	}
	if s, _ := readText(`#nodes-table tr[data-name="n1"]`); !strings.Contains(s, "this node") {
		t.Errorf("n1's row does not say it is this node: %q", s)
	}
	shot("nodes.png")
	nodes[2].Close()
	waitText(`#nodes-table tr[data-name="n3"]`, "n3 left", func(s string) bool { return strings.Contains(s, "left") && strings.Contains(s, "down") })
	shot("nodes-left.png")
	if len(jsErrors) > 0 {
		t.Errorf("script errors: %v", jsErrors)
	}
}
