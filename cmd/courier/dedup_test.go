package main

import (
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestDedupAfterSIGKILL: a task confirmed by a `courier server` that is
// then killed (SIGKILL: no checkpoint at shutdown) is resent after the
// restart by a producer with the same producer id and seq, as a
// restarted process would: the server rebuilt the window from its log
// and answers with the same task id, storing nothing (the next task
// gets the next id).
func TestDedupAfterSIGKILL(t *testing.T) {
	addr, dir := "127.0.0.1:"+cliFreePort(t), t.TempDir()
	srv := crashServer(t, addr, dir)
	ctx := testutil.Context(t, 4*cliWait)
	submit := func(seq uint64) courier.TaskID {
		t.Helper()
		c, err := client.Dial(ctx, "courier://"+addr, client.Options{ProducerID: "crash-producer", NoReconnect: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		jobs, err := c.Tasks(ctx, "dedup.crash")
		if err != nil {
			t.Fatal(err)
		}
		id, err := jobs.Submit(ctx, courier.Task{Body: []byte("task"), Seq: seq})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	first := submit(1)
	srv.kill()
	crashServer(t, addr, dir)
	if again := submit(1); again != first {
		t.Fatalf("the resend after SIGKILL got task %d, want %d", again, first)
	}
	if next := submit(2); next != first+1 {
		t.Fatalf("the next task got id %d, want %d: the resend was stored", next, first+1)
	}
}
