package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// ScreenshotDirEnv names the directory where TestChatInBrowser saves its
// screenshots (default: the test's temporary directory).
const ScreenshotDirEnv = "COURIER_SCREENSHOT_DIR"

// window is one user's page in a browser context of its own (its own
// localStorage), as two browser windows of two people.
type window struct {
	t    *testing.T
	name string
	ctx  context.Context
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](w *window, expr string) (T, error) {
	return chromedp.Run(w.ctx, chromedp.Evaluate[T](expr))
}

// waitFor polls expr (a boolean expression) until it holds.
func (w *window) waitFor(what, expr string) {
	w.t.Helper()
	ok := testutil.Eventually(60*time.Second, func() bool {
		v, err := eval[bool](w, expr)
		return err == nil && v
	})
	if !ok {
		body, _ := eval[string](w, `document.body.innerText`)
		events, _ := eval[string](w, `JSON.stringify(window.chat?.events)`)
		w.t.Fatalf("%s: %s did not happen within 60s; the page shows:\n%s\nevents: %s", w.name, what, body, events)
	}
}

func (w *window) do(actions ...chromedp.Action[chromedp.Void]) {
	w.t.Helper()
	if err := chromedp.Do(w.ctx, actions...); err != nil {
		w.t.Fatalf("%s: %v", w.name, err)
	}
}

func (w *window) screenshot(dir, file string) {
	w.t.Helper()
	png, err := chromedp.Run(w.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		w.t.Fatalf("%s: screenshot: %v", w.name, err)
	}
	path := filepath.Join(dir, file)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		w.t.Fatal(err)
	}
	w.t.Logf("%s's window: %s", w.name, path)
}

// hasLine is the expression: the room shows a line from who with text.
func hasLine(who, text string, history bool) string {
	sel := "#messages .line"
	if history {
		sel = "#messages .line.history"
	}
	return fmt.Sprintf(`[...document.querySelectorAll(%q)].some(li => li.dataset.from === %q && li.querySelector('.text').textContent === %q)`, sel, who, text)
}

func presence(users ...string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('#presence li')].map(li => li.textContent).join(',') === %q`, strings.Join(users, ","))
}

// TestChatInBrowser runs the command as its README says and drives two
// users, each in a browser context of their own, in headless Chromium:
// they join, see each other arrive, see the other typing, exchange
// lines and a direct message; when bob leaves alice sees him go, and
// when he comes back (a reload, his name from his own localStorage) he
// gets the room's history. It saves both windows' screenshots.
func TestChatInBrowser(t *testing.T) {
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
	ctx, stop := context.WithCancel(context.Background())
	pagec := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, Options{
			Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Web: "127.0.0.1:0", JSDir: "../../clients/js",
			Rooms: []string{"lobby", "dev"}, Banned: []string{"mallory"}, History: 50,
		}, quiet(), new(strings.Builder), func(page string, _ *node.Node) { pagec <- page })
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	var page string
	select {
	case page = <-pagec:
	case err := <-done:
		t.Fatalf("run: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the service did not start within 60s")
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1100, 650),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	root, cancelRoot := chromedp.NewContext(actx)
	defer cancelRoot()
	if err := chromedp.Do(root); err != nil { // starts the browser
		t.Fatal(err)
	}
	open := func(name string) *window {
		c, cancel := chromedp.NewContext(root, chromedp.WithNewBrowserContext())
		t.Cleanup(cancel)
		c, cancel = context.WithTimeout(c, 4*time.Minute)
		t.Cleanup(cancel)
		w := &window{t: t, name: name, ctx: c}
		w.do(chromedp.Navigate(page + "?user=" + name))
		w.waitFor("joining", `window.chat && window.chat.ready === true`)
		return w
	}
	alice := open("alice")
	alice.waitFor("alice alone in #lobby", presence("alice"))
	bob := open("bob")
	alice.waitFor("bob arriving", presence("alice", "bob"))
	bob.waitFor("bob seeing alice", presence("alice", "bob"))

	alice.do(chromedp.SendKeys("#text", "hello bob"))
	bob.waitFor("alice typing", `document.getElementById('typing').textContent.includes('alice is typing')`)
	alice.do(chromedp.Click("#say button"))
	bob.waitFor("alice's line", hasLine("alice", "hello bob", false))
	alice.waitFor("alice's own line", hasLine("alice", "hello bob", false))
	bob.do(chromedp.SendKeys("#text", "hi alice\n"))
	alice.waitFor("bob's line", hasLine("bob", "hi alice", false))

	alice.do(chromedp.SendKeys("#dm-to", "bob"), chromedp.SendKeys("#dm-text", "psst, bob\n"))
	bob.waitFor("alice's direct message", `[...document.querySelectorAll('#dms li')].some(li => li.textContent === 'alicepsst, bob')`)
	alice.waitFor("the DM shown as sent", `[...document.querySelectorAll('#dms li')].some(li => li.textContent === '→ bobpsst, bob')`)
	alice.do(chromedp.SetValue("#dm-to", "carol"), chromedp.SendKeys("#dm-text", "anyone?\n"))
	alice.waitFor("carol offline", `document.getElementById('status').textContent === 'carol is offline'`)
	alice.screenshot(dir, "chat-alice.png")
	bob.screenshot(dir, "chat-bob.png")

	bob.do(chromedp.Navigate("about:blank"))
	alice.waitFor("bob leaving", presence("alice"))
	bob.do(chromedp.Navigate(page)) // no ?user: his name is in his own storage
	bob.waitFor("bob back", `window.chat && window.chat.ready === true && document.getElementById('me').textContent === 'bob'`)
	bob.waitFor("the history on join", hasLine("alice", "hello bob", true)+" && "+hasLine("bob", "hi alice", true))
	alice.waitFor("bob back in presence", presence("alice", "bob"))
	alice.do(chromedp.Reload())
	alice.waitFor("alice reloaded", `window.chat && window.chat.ready === true && document.getElementById('me').textContent === 'alice'`)
	alice.waitFor("the history after a reload", hasLine("alice", "hello bob", true)+" && "+hasLine("bob", "hi alice", true))
	alice.waitFor("presence after a reload", presence("alice", "bob"))
	alice.screenshot(dir, "chat-alice-reloaded.png")
	bob.screenshot(dir, "chat-bob-reloaded.png")

	mallory := &window{t: t, name: "mallory"}
	c, cancel := chromedp.NewContext(root, chromedp.WithNewBrowserContext())
	defer cancel()
	mallory.ctx = c
	mallory.do(chromedp.Navigate(page + "?user=mallory"))
	mallory.waitFor("the moderator refusing mallory", `(window.chat?.refused ?? '').includes('mallory is banned')`)
	alice.waitFor("mallory never present", presence("alice", "bob"))
}
