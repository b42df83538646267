package queue

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
)

// The kill -9 test of a spilling queue: the test binary re-runs itself
// as a child that rebuilds a durable queue from a real store (checkpoint,
// runs and log), then publishes, consumes and acks under a budget small
// enough that the queue pages its bodies and spills its index, with a
// checkpoint every 100 ms. It prints "ok <body>" once a message is
// confirmed and "ack <body>" before it acks one. The parent kills it with
// SIGKILL mid-load, several times over the same directory, then rebuilds
// the queue itself and drains it: every message confirmed and not acked
// must come out.
const queueCrashEnv = "COURIER_QUEUE_CRASH_CHILD" // the log directory

func TestMain(m *testing.M) {
	if dir := os.Getenv(queueCrashEnv); dir != "" {
		queueCrashChild(dir)
		return
	}
	os.Exit(m.Run())
}

func crashStoreOptions() store.Options {
	o := store.DefaultOptions()
	o.SegmentSize = 1 << 20
	o.MaxRecordSize = 64 << 10
	return o
}

// openCrashQueue opens the log in dir and rebuilds the queue from it.
func openCrashQueue(dir string, sched *Scheduler) (*store.Log, *Queue, error) {
	log, rec, err := store.Open(store.OSFS{}, dir, crashStoreOptions())
	if err != nil {
		return nil, nil, err
	}
	rb := NewRebuilder()
	rb.LazyBodies = true
	if rec.State != nil {
		if err := rb.LoadSnapshot(rec.State); err != nil {
			return nil, nil, err
		}
	}
	if _, err := ReplayLog(log, func(uint32) *Rebuilder { return rb }); err != nil {
		return nil, nil, err
	}
	cfg := DefaultConfig()
	cfg.Scheduler, cfg.Journal, cfg.Memory = sched, StoreJournal{log, 1}, NewMemory(1<<20)
	cfg.BackoffBase = 0
	q, err := rb.Build("crash", cfg)
	return log, q, err
}

func queueCrashChild(dir string) {
	fail := func(what string, err error) {
		fmt.Fprintln(os.Stderr, "child:", what+":", err)
		os.Exit(2)
	}
	sched := NewScheduler(SchedulerOptions{})
	log, q, err := openCrashQueue(dir, sched)
	if err != nil {
		fail("open", err)
	}
	round := os.Getenv("COURIER_QUEUE_CRASH_ROUND")
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		fmt.Fprintf(os.Stdout, format, args...)
		outMu.Unlock()
	}
	go func() {
		for range time.Tick(100 * time.Millisecond) {
			if _, err := log.Checkpoint(func(store.Pos) ([]byte, error) { return q.AppendSnapshot(nil), nil }); err != nil {
				fail("checkpoint", err)
			}
		}
	}()
	deliveries := make(chan Delivery, 64)
	c, err := q.AddConsumer("c", ConsumerConfig{Prefetch: 32, Deliver: func(d Delivery) { deliveries <- d }})
	if err != nil {
		fail("consumer", err)
	}
	go func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for d := range deliveries {
			for q.Stats().Published < 2*q.Stats().Acked {
				time.Sleep(time.Millisecond)
			}
			if len(d.Body) == 0 {
				fail("deliver", fmt.Errorf("message %d without its body", d.ID))
			}
			if rng.IntN(8) == 0 {
				if err := q.Nack(c, d.ID, true); err != nil {
					fail("nack", err)
				}
				continue
			}
			say("ack %s\n", d.Body)
			if err := q.Ack(c, d.ID); err != nil {
				fail("ack", err)
			}
		}
	}()
	pad := strings.Repeat("p", 200)
	window := make(chan struct{}, 1000) // unconfirmed messages
	for i := 0; ; i++ {
		b := fmt.Sprintf("r%s-%d-%s", round, i, pad)
		window <- struct{}{}
		// Two published for one acked, as in TestBacklog: the queue
		// deepens and spills.
		if _, err := q.Enqueue(Message{Body: []byte(b), Priority: uint8(i % 3)}, func(err error) {
			if err != nil {
				fail("confirm", err)
			}
			say("ok %s\n", b)
			<-window
		}, nil); err != nil {
			fail("enqueue", err)
		}
	}
}

func TestKill9Spilling(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	confirmed := map[string]bool{}
	acked := map[string]bool{}
	rng := rand.New(rand.NewPCG(5, 6))
	const rounds = 3
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), queueCrashEnv+"="+dir, fmt.Sprintf("COURIER_QUEUE_CRASH_ROUND=%d", round))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		must(t, err)
		must(t, cmd.Start())
		target := 8000 + rng.IntN(4000)
		n, killed := 0, false
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			kind, b, ok := strings.Cut(sc.Text(), " ")
			switch {
			case ok && kind == "ok":
				confirmed[b] = true
				n++
			case ok && kind == "ack":
				acked[b] = true
			default:
				t.Fatalf("child printed %q", sc.Text())
			}
			if n >= target && !killed {
				must(t, cmd.Process.Signal(syscall.SIGKILL))
				killed = true
			}
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if !killed || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child ended with %v after %d confirms; stderr:\n%s", round, err, n, stderr.String())
		}
		t.Logf("round %d: killed after %d confirms", round, n)
	}

	sched := NewScheduler(SchedulerOptions{})
	defer sched.Close()
	log, q, err := openCrashQueue(dir, sched)
	must(t, err)
	defer log.Close()
	s := q.Stats()
	t.Logf("rebuilt: %d messages, %d spilled, %d runs", s.Messages(), s.Spilled, log.Stats().Runs)
	if s.Spilled == 0 {
		t.Fatal("nothing spilled at the last kill: the test tests too little")
	}
	got := map[string]int{}
	deliveries := make(chan Delivery, 1024)
	c, err := q.AddConsumer("check", ConsumerConfig{Prefetch: 512, Deliver: func(d Delivery) { deliveries <- d }})
	must(t, err)
	for q.Stats().Messages() > 0 {
		select {
		case d := <-deliveries:
			got[string(d.Body)]++
			must(t, q.Ack(c, d.ID))
		case <-time.After(10 * time.Second):
			t.Fatalf("stuck with %+v", q.Stats())
		}
	}
	lost, dups := 0, 0
	for b := range confirmed {
		if !acked[b] && got[b] == 0 {
			lost++
			if lost < 5 {
				t.Errorf("confirmed message %.20s... lost", b)
			}
		}
	}
	for _, n := range got {
		if n > 1 {
			dups++
		}
	}
	if lost > 0 {
		t.Fatalf("%d confirmed messages lost", lost)
	}
	t.Logf("%d confirmed, %d acked, %d delivered after the last restart, %d of them more than once; %s",
		len(confirmed), len(acked), len(got), dups, strconv.Quote(log.Stats().Durable.String()))
}
