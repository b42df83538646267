package js

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/node"
)

// TestJSFailover runs failover/failover.test.js in Node.js against two
// nodes, A and B: the JavaScript client connects to the list "A,B",
// and when the test has A stopped (a POST to COURIER_STOP_URL) it
// reconnects to B, declares its exchanges and attaches its
// attachments there again, as the Go client does with a list.
func TestJSFailover(t *testing.T) {
	bin, flags := nodeCommand(t)
	start := func() *node.Node {
		n, err := node.Start(node.Config{
			DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0",
			Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	a, b := start(), start()
	var once sync.Once
	stop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST", http.StatusMethodNotAllowed)
			return
		}
		once.Do(func() { a.Close() })
	}))
	defer stop.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append(flags, "--test", "--test-reporter=spec", "failover/")
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(),
		"COURIER_WS_URLS=ws://"+a.HTTPAddr().String()+"/ws,ws://"+b.HTTPAddr().String()+"/ws",
		"COURIER_STOP_URL="+stop.URL, "NODE_NO_WARNINGS=1")
	out, err := cmd.CombinedOutput()
	t.Logf("node %s:\n%s", strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("node --test: %v", err)
	}
}
