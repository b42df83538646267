package courier_test

// The Go snippets of README.md, each whole inside an example here, so
// that they compile and run; TestReadmeSnippets checks that README shows
// them as they are here.

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/node"
)

// README, "Embedded or remote: one API".
func Example_embeddedOrRemote() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "courier-readme")
	defer os.RemoveAll(dir)

	n, err := node.Start(node.Config{DataDir: dir}) // an embedded broker...
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()
	conn := n.Connect() // ...or a server's: conn, err := client.Dial(ctx, "courier://127.0.0.1:7400", client.Options{})

	users, err := conn.ReqResp(ctx, "users", courier.RoundRobin)
	if err != nil {
		log.Fatal(err)
	}
	users.Handle(ctx, func(r *courier.Request) { r.Reply([]byte("pong")) })
	resp, err := users.Request(ctx, courier.Message{Body: []byte("ping")})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(resp.Body)) // pong
	// Output: pong
}

// README, "Publish-subscribe".
func Example_publishSubscribe() {
	n, stop := startNode()
	defer stop()
	ctx := context.Background()
	conn := n.Connect()

	news, err := conn.PubSub(ctx, "news")
	if err != nil {
		log.Fatal(err)
	}
	got := make(chan string, 1)
	news.Subscribe(ctx, "eu.#", func(d *courier.Delivery) { got <- d.Key + ": " + string(d.Body) })
	news.Publish(ctx, "eu.fr.paris", []byte("bonjour"))
	fmt.Println(<-got) // eu.fr.paris: bonjour
	// Output: eu.fr.paris: bonjour
}

// README, "Task distribution".
func Example_taskDistribution() {
	n, stop := startNode()
	defer stop()
	ctx := context.Background()
	conn := n.Connect()
	doResize := func([]byte) error { return nil }
	img, userID := []byte("img-42"), "user-7"
	log.SetOutput(io.Discard)
	defer log.SetOutput(os.Stderr)

	resize, err := conn.Tasks(ctx, "resize", courier.MaxAttempts(5), courier.DeadLetter("resize.failed"))
	if err != nil {
		log.Fatal(err)
	}
	resize.Work(ctx, func(j *courier.Job) error {
		j.Progress(50, "halfway")
		return doResize(j.Body) // nil: ack; error: retry later
	}, courier.Prefetch(10))

	w, err := resize.SubmitWatch(ctx, courier.Task{Body: img, Key: userID}, func(ev courier.TaskEvent) {
		log.Println(ev.Kind, ev.Percent, ev.Text) // progress, retry, completed, failed; lost if its queue moved (watch again)
	})
	if err != nil {
		log.Fatal(err)
	}
	last, err := w.Wait(ctx)
	fmt.Println(last.Kind, err) // completed <nil>
	// Output: completed <nil>
}

// README, "Leaders and membership". Compiled, not run: whether the
// handler leads when Handle returns depends on when the leader event
// arrives.
func Example_leaders() {
	n, stop := startNode()
	defer stop()
	ctx := context.Background()
	conn := n.Connect()
	handle := func(r *courier.Request) { r.Reply(nil) }
	runJobs := func() { fmt.Println("leading: running the jobs") }
	log.SetOutput(io.Discard)
	defer log.SetOutput(os.Stderr)

	sched, err := conn.ReqResp(ctx, "scheduler", courier.Leader)
	if err != nil {
		log.Fatal(err)
	}
	att, err := sched.Handle(ctx, handle, courier.OnEvent(func(e courier.Event) {
		log.Println(e.Kind, "leader:", e.Leader, "me:", e.IsLeader)
	}))
	if err != nil {
		log.Fatal(err)
	}
	if att.IsLeader() {
		runJobs()
	}
}

// TestReadmeSnippets: every Go snippet of README.md is in an example of
// this file, line for line (indentation aside), so that README shows
// code that compiles and runs.
func TestReadmeSnippets(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("readme_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	code := codeLines(string(self))
	blocks := strings.Split(string(readme), "```go\n")[1:]
	if len(blocks) == 0 {
		t.Fatal("no Go snippet in README.md")
	}
	for i, b := range blocks {
		snippet, _, ok := strings.Cut(b, "```")
		if !ok {
			t.Fatalf("snippet %d is not closed", i+1)
		}
		lines := codeLines(snippet)
		if !containsRun(code, lines) {
			t.Errorf("README's Go snippet %d is not in an example of readme_example_test.go as it is:\n%s", i+1, snippet)
		}
	}
}

// codeLines returns the non-blank lines of s, trimmed.
func codeLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// containsRun reports whether run occurs in lines, consecutively.
func containsRun(lines, run []string) bool {
	for i := 0; i+len(run) <= len(lines); i++ {
		if slices.Equal(lines[i:i+len(run)], run) {
			return true
		}
	}
	return false
}
