package node_test

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// TestFullDisk runs a node on a small tmpfs of its own and fills it with
// durable tasks: past the free-space minimum the disk alarm holds the
// publisher (no credit) before the disk is full, nothing confirmed is
// lost, no submit fails, and once a worker has drained the queue and the
// store has deleted its segments, publishing resumes. It needs root to
// mount the tmpfs, and is skipped without.
func TestFullDisk(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=24m"); err != nil {
		t.Skipf("cannot mount a tmpfs (root needed): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	cfg := node.Config{DataDir: dir, Log: quiet(), Listen: "127.0.0.1:0", MinFreeDisk: 8 << 20}
	cfg.Limits.Credit = 16
	node.TuneStore(&cfg, func(o *store.Options) {
		o.SegmentSize, o.MaxRecordSize, o.DiskCheckInterval = 1<<20, 256<<10, 10*time.Millisecond
	})
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := testutil.Context(t, time.Minute)
	c, err := client.Dial(ctx, n.URL(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ex, err := c.Tasks(ctx, "fill")
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 64<<10)
	const attempts = 600 // 37.5 MiB: more than the file system holds
	var mu sync.Mutex
	confirmed, failed := 0, 0
	submit := func(ctx context.Context) error {
		return ex.SubmitAsync(ctx, courier.Task{Body: body}, func(_ courier.TaskID, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				t.Errorf("submit failed: %v", err)
				return
			}
			confirmed++
		})
	}
	sent := submitUntilHeld(t, ctx, attempts, submit)
	log := n.Broker().Store()
	heldByDisk(t, dir, log, sent, attempts, "submits")
	// A worker drains; the store deletes the dead segments after a
	// checkpoint; the alarm clears; the publisher goes on.
	var handled sync.WaitGroup
	handled.Add(attempts)
	if _, err := ex.Work(ctx, func(*courier.Job) error { handled.Done(); return nil }, courier.Prefetch(20)); err != nil {
		t.Fatal(err)
	}
	for ; sent < attempts; sent++ {
		if err := submit(ctx); err != nil {
			t.Fatalf("submit %d after the worker came: %v", sent, err)
		}
	}
	done := make(chan struct{})
	go func() { handled.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("not every task was handled")
	}
	testutil.WaitForf(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return confirmed+failed == attempts
	}, "every submit answered")
	if failed > 0 || log.Stats().Failed {
		t.Fatalf("%d submits failed; store failed: %v", failed, log.Stats().Failed)
	}
}

// TestFullDiskDurableSubscription: a publisher to a pub-sub exchange whose
// durable subscription nobody reads is held by the disk alarm, as a
// SUBMIT's is (no credit over the network, a wait embedded), before the
// disk is full; once the subscriber is back and has read the backlog,
// publishing resumes and every message arrives. It needs root to mount
// the tmpfs, and is skipped without.
func TestFullDiskDurableSubscription(t *testing.T) {
	for _, remote := range []bool{false, true} {
		name := map[bool]string{false: "Embedded", true: "Network"}[remote]
		t.Run(name, func(t *testing.T) { fullDiskDurableSubscription(t, remote) })
	}
}

func fullDiskDurableSubscription(t *testing.T, remote bool) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=24m"); err != nil {
		t.Skipf("cannot mount a tmpfs (root needed): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	cfg := node.Config{DataDir: dir, Log: quiet(), MinFreeDisk: 8 << 20}
	if remote {
		cfg.Listen = "127.0.0.1:0"
		cfg.Limits.Credit = 16
	}
	node.TuneStore(&cfg, func(o *store.Options) {
		o.SegmentSize, o.MaxRecordSize, o.DiskCheckInterval = 1<<20, 256<<10, 10*time.Millisecond
		// What waits to be written when the alarm goes on is still
		// written: it must fit in the margin, as the defaults' 8 MiB do
		// in their 1 GiB.
		o.MaxPending = 1 << 20
	})
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := testutil.Context(t, time.Minute)
	c := n.Connect()
	if remote {
		if c, err = client.Dial(ctx, n.URL(), client.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	defer c.Close()
	ps, err := c.PubSub(ctx, "news")
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	read := func(*courier.Delivery) { got.Add(1) }
	sub, err := ps.Subscribe(ctx, "#", read, courier.Durable("archive"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Detach(ctx); err != nil { // the subscription keeps its queue
		t.Fatal(err)
	}
	body := make([]byte, 64<<10)
	const attempts = 600 // 37.5 MiB: more than the file system holds
	publish := func(ctx context.Context) error { return ps.Publish(ctx, "eu.prices", body) }
	sent := submitUntilHeld(t, ctx, attempts, publish)
	log := n.Broker().Store()
	heldByDisk(t, dir, log, sent, attempts, "publishes")
	// The subscriber comes back and reads the backlog; the store deletes
	// the dead segments; the alarm clears; the publisher goes on.
	if _, err := ps.Subscribe(ctx, "#", read, courier.Durable("archive")); err != nil {
		t.Fatal(err)
	}
	for ; sent < attempts; sent++ {
		if err := publish(ctx); err != nil {
			t.Fatalf("publish %d after the subscriber came back: %v", sent, err)
		}
	}
	testutil.WaitForf(t, 30*time.Second, func() bool { return got.Load() == attempts }, "every message delivered")
	if log.Stats().Failed {
		t.Fatal("the store failed")
	}
}

// heldByDisk checks that a publisher of 64 KiB messages was held back
// (sent of attempts went through) by the disk alarm on the 24 MiB tmpfs
// at dir, before the disk filled up and failed the store.
func heldByDisk(t *testing.T, dir string, log *store.Log, sent, attempts int, what string) {
	t.Helper()
	var st syscall.Statfs_t
	syscall.Statfs(dir, &st)
	t.Logf("held back after %d %s of 64 KiB: disk alarm %v, %d KiB free of 24 MiB", sent, what, log.DiskAlarm(), st.Bavail*uint64(st.Bsize)>>10)
	if sent == attempts {
		t.Fatalf("all %d %s went through on a 24 MiB disk", attempts, what)
	}
	if !log.DiskAlarm() {
		t.Fatal("held back without a disk alarm")
	}
	if log.Stats().Failed {
		t.Fatal("the store failed: the disk filled up before the alarm held the publisher")
	}
}
