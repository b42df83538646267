package node

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

// python is Debian's interpreter, which python3-pika installs for.
const python = "/usr/bin/python3"

// needPika skips the test where python3-pika is not installed (.ci/run
// installs it).
func needPika(t *testing.T) {
	t.Helper()
	if err := exec.Command(python, "-c", "import pika").Run(); err != nil {
		t.Skip("python3-pika is not installed: apt-get install python3-pika")
	}
}

// lockedBuffer is a bytes.Buffer safe to read while a process writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tutorial runs one script of testdata/tutorials against port.
func tutorial(t *testing.T, port, script string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(python, append([]string{filepath.Join("testdata", "tutorials", script)}, args...)...)
	cmd.Env = append(cmd.Environ(), "AMQP_PORT="+port, "PYTHONUNBUFFERED=1")
	return cmd
}

// runTutorial runs a script to its end and returns its output.
func runTutorial(t *testing.T, port, script string, args ...string) string {
	t.Helper()
	out, err := tutorial(t, port, script, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", script, args, err, out)
	}
	return string(out)
}

// startTutorial starts a script that runs until killed.
func startTutorial(t *testing.T, port, script string, args ...string) *lockedBuffer {
	t.Helper()
	out := &lockedBuffer{}
	cmd := tutorial(t, port, script, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return out
}

func waitOutput(t *testing.T, out *lockedBuffer, want ...string) {
	t.Helper()
	testutil.WaitForf(t, 60*time.Second, func() bool {
		s := out.String()
		for _, w := range want {
			if !strings.Contains(s, w) {
				return false
			}
		}
		return true
	}, "output %q; got:\n%s", want, out)
}

// TestTutorialsPika runs RabbitMQ's Python tutorials 1 (hello world), 2
// (work queues), 3 (publish/subscribe), 4 (routing), 5 (topics) and 6
// (RPC), with
// Debian's pika, against a Courier node, and checks their outputs as the
// tutorials print them.
func TestTutorialsPika(t *testing.T) {
	needPika(t)
	n, _ := amqpNode(t)
	_, port, _ := strings.Cut(n.AMQPAddr().String(), ":")

	t.Run("1 hello world", func(t *testing.T) {
		recv := startTutorial(t, port, "receive.py")
		waitOutput(t, recv, " [*] Waiting for messages. To exit press CTRL+C")
		if out := runTutorial(t, port, "send.py"); out != " [x] Sent 'Hello World!'\n" {
			t.Fatalf("send.py printed %q", out)
		}
		waitOutput(t, recv, " [x] Received b'Hello World!'")
	})

	t.Run("2 work queues", func(t *testing.T) {
		// Two workers share the tasks, one at a time each (prefetch 1).
		w1, w2 := startTutorial(t, port, "worker.py"), startTutorial(t, port, "worker.py")
		// The script prints its greeting before it consumes: wait for
		// both consumers on the broker.
		testutil.WaitForf(t, 60*time.Second, func() bool {
			ex := n.broker.Exchange("task_queue")
			return ex != nil && ex.Info().Queue != nil && ex.Info().Queue.Consumers == 2
		}, "two workers consuming; worker 1:\n%s\nworker 2:\n%s", w1, w2)
		msgs := []string{"First message.", "Second message..", "Third message...", "Fourth message....", "Fifth message....."}
		for _, m := range msgs {
			if out := runTutorial(t, port, "new_task.py", m); out != " [x] Sent "+m+"\n" {
				t.Fatalf("new_task.py printed %q", out)
			}
		}
		testutil.WaitForf(t, 90*time.Second, func() bool {
			all := w1.String() + w2.String()
			for _, m := range msgs {
				if !strings.Contains(all, " [x] Received "+m+"\n") {
					return false
				}
			}
			return strings.Count(all, " [x] Done") == len(msgs)
		}, "every task received and done once; worker 1:\n%s\nworker 2:\n%s", w1, w2)
		if !strings.Contains(w1.String(), " [x] Received") || !strings.Contains(w2.String(), " [x] Received") {
			t.Fatalf("one worker took every task; worker 1:\n%s\nworker 2:\n%s", w1, w2)
		}
	})

	const waiting = " [*] Waiting for logs. To exit press CTRL+C"
	t.Run("3 publish subscribe", func(t *testing.T) {
		// Two receivers, each with its exclusive server-named queue bound
		// to the fanout exchange: both get every log.
		r1, r2 := startTutorial(t, port, "receive_logs.py"), startTutorial(t, port, "receive_logs.py")
		waitOutput(t, r1, waiting)
		waitOutput(t, r2, waiting)
		if out := runTutorial(t, port, "emit_log.py"); out != " [x] Sent info: Hello World!\n" {
			t.Fatalf("emit_log.py printed %q", out)
		}
		runTutorial(t, port, "emit_log.py", "second")
		for _, r := range []*lockedBuffer{r1, r2} {
			waitOutput(t, r, " [x] b'info: Hello World!'", " [x] b'second'")
		}
	})

	t.Run("4 routing", func(t *testing.T) {
		errs := startTutorial(t, port, "receive_logs_direct.py", "warning", "error")
		all := startTutorial(t, port, "receive_logs_direct.py", "info", "warning", "error")
		waitOutput(t, errs, waiting)
		waitOutput(t, all, waiting)
		if out := runTutorial(t, port, "emit_log_direct.py", "error", "Run. Run. Or it will explode."); out != " [x] Sent error:Run. Run. Or it will explode.\n" {
			t.Fatalf("emit_log_direct.py printed %q", out)
		}
		runTutorial(t, port, "emit_log_direct.py", "info", "just so")
		runTutorial(t, port, "emit_log_direct.py", "debug", "never")
		runTutorial(t, port, "emit_log_direct.py", "warning", "last")
		waitOutput(t, all, " [x] error:b'Run. Run. Or it will explode.'", " [x] info:b'just so'", " [x] warning:b'last'")
		// Deliveries of one queue are in order: "last" came after the
		// others, so what errs did not get by then it never gets.
		waitOutput(t, errs, " [x] error:b'Run. Run. Or it will explode.'", " [x] warning:b'last'")
		for _, r := range []*lockedBuffer{errs, all} {
			if strings.Contains(r.String(), "never") {
				t.Fatalf("an unbound severity was delivered:\n%s", r)
			}
		}
		if strings.Contains(errs.String(), "just so") {
			t.Fatalf("info reached the warning/error receiver:\n%s", errs)
		}
	})

	t.Run("5 topics", func(t *testing.T) {
		all := startTutorial(t, port, "receive_logs_topic.py", "#")
		kern := startTutorial(t, port, "receive_logs_topic.py", "kern.*")
		crit := startTutorial(t, port, "receive_logs_topic.py", "kern.*", "*.critical")
		for _, r := range []*lockedBuffer{all, kern, crit} {
			waitOutput(t, r, waiting)
		}
		if out := runTutorial(t, port, "emit_log_topic.py", "kern.critical", "A critical kernel error"); out != " [x] Sent kern.critical:A critical kernel error\n" {
			t.Fatalf("emit_log_topic.py printed %q", out)
		}
		runTutorial(t, port, "emit_log_topic.py", "app.critical", "app down")
		runTutorial(t, port, "emit_log_topic.py", "kern.info.deep", "too deep")
		runTutorial(t, port, "emit_log_topic.py", "kern.info", "last")
		waitOutput(t, all, " [x] kern.critical:b'A critical kernel error'", " [x] app.critical:b'app down'", " [x] kern.info.deep:b'too deep'", " [x] kern.info:b'last'")
		waitOutput(t, kern, " [x] kern.critical:b'A critical kernel error'", " [x] kern.info:b'last'")
		waitOutput(t, crit, " [x] kern.critical:b'A critical kernel error'", " [x] app.critical:b'app down'", " [x] kern.info:b'last'")
		if strings.Contains(kern.String(), "app down") || strings.Contains(kern.String(), "too deep") || strings.Contains(crit.String(), "too deep") {
			t.Fatalf("a key was delivered that no binding matches:\nkern.*:\n%s\nkern.* *.critical:\n%s", kern, crit)
		}
		if n := strings.Count(crit.String(), "A critical kernel error"); n != 1 {
			t.Fatalf("a message matching two bindings came %d times, want once:\n%s", n, crit)
		}
	})

	t.Run("6 rpc", func(t *testing.T) {
		// The reply goes to the client's exclusive server-named queue,
		// through the default exchange, with its correlation_id.
		server := startTutorial(t, port, "rpc_server.py")
		waitOutput(t, server, " [x] Awaiting RPC requests")
		if out := runTutorial(t, port, "rpc_client.py"); out != " [x] Requesting fib(30)\n [.] Got 832040\n" {
			t.Fatalf("rpc_client.py printed %q", out)
		}
		waitOutput(t, server, " [.] fib(30)")
	})
}

// TestAMQPTools drives Debian's amqp-tools (librabbitmq's command-line
// clients) against a Courier node: declare a durable queue, publish to
// it through the default exchange, consume it.
func TestAMQPTools(t *testing.T) {
	if _, err := exec.LookPath("amqp-consume"); err != nil {
		t.Skip("amqp-tools is not installed: apt-get install amqp-tools")
	}
	_, url := amqpNode(t)
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, append([]string{"--url", url}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	if out := run("amqp-declare-queue", "--durable", "--queue", "jobs"); strings.TrimSpace(out) != "jobs" {
		t.Fatalf("amqp-declare-queue printed %q", out)
	}
	for _, body := range []string{"alpha", "beta"} {
		run("amqp-publish", "--routing-key", "jobs", "--persistent", "--content-type", "text/plain", "--body", body)
	}
	if out := run("amqp-consume", "--queue", "jobs", "--count", "2", "--prefetch-count", "1", "cat"); out != "alphabeta" {
		t.Fatalf("amqp-consume printed %q", out)
	}
}

// clusterRefused reports whether a tutorial's output shows the cluster
// refused it for want of a metadata quorum or a queue leader (541 with
// Courier's "unavailable" text): a loaded machine loses leaders, and the
// program is run again, as an operator would.
func clusterRefused(out string) bool {
	return strings.Contains(out, "541") && (strings.Contains(out, "quorum") || strings.Contains(out, "catalog") ||
		strings.Contains(out, "leader") || strings.Contains(out, "unavailable"))
}

// runTutorialRetry is runTutorial, run again while the cluster refuses
// it, up to 120 s.
func runTutorialRetry(t *testing.T, port, script string, args ...string) string {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		out, err := tutorial(t, port, script, args...).CombinedOutput()
		if err == nil {
			return string(out)
		}
		if !clusterRefused(string(out)) || time.Now().After(deadline) {
			t.Fatalf("%s %v: %v\n%s", script, args, err, out)
		}
		t.Logf("%s refused by the cluster; again:\n%s", script, out)
		time.Sleep(100 * time.Millisecond)
	}
}

// startTutorialRetry starts a script that runs until killed and waits
// until it prints ready, starting it again while the cluster refuses it,
// up to 120 s.
func startTutorialRetry(t *testing.T, port, script, ready string, args ...string) *lockedBuffer {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		out := &lockedBuffer{}
		cmd := tutorial(t, port, script, args...)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
		})
		var gone bool
		testutil.WaitForf(t, 120*time.Second, func() bool {
			select {
			case <-exited:
				gone = true
				return true
			default:
			}
			return strings.Contains(out.String(), ready)
		}, "%s printing %q; got:\n%s", script, ready, out)
		if !gone {
			return out
		}
		if !clusterRefused(out.String()) || time.Now().After(deadline) {
			t.Fatalf("%s %v ended:\n%s", script, args, out)
		}
		t.Logf("%s refused by the cluster; again:\n%s", script, out)
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTutorialsPikaCluster runs RabbitMQ's tutorials 2 (work queues), 3
// (publish/subscribe) and 6 (RPC) with pika against a cluster of three
// nodes, each program on another node than the ones it talks to: the
// workers on B and C share what new_task.py sends on A; the log
// receivers on B and C, each with its exclusive queue bound on its own
// node, get what emit_log.py publishes on A; the RPC server on B answers
// the client on C.
func TestTutorialsPikaCluster(t *testing.T) {
	needPika(t)
	nodes, _ := startAMQPCluster3(t)
	port := func(i int) string {
		_, p, _ := strings.Cut(nodes[i].AMQPAddr().String(), ":")
		return p
	}

	t.Run("2 work queues", func(t *testing.T) {
		const greeting = " [*] Waiting for messages. To exit press CTRL+C"
		w1, w2 := startTutorialRetry(t, port(1), "worker.py", greeting), startTutorialRetry(t, port(2), "worker.py", greeting)
		testutil.WaitForf(t, 60*time.Second, func() bool {
			for _, n := range nodes {
				if ex := n.broker.Exchange("task_queue"); ex != nil && ex.Info().Queue != nil && ex.Info().Queue.Consumers == 2 {
					return true
				}
			}
			return false
		}, "two workers consuming where the queue is served; worker 1:\n%s\nworker 2:\n%s", w1, w2)
		msgs := []string{"First message.", "Second message..", "Third message...", "Fourth message....", "Fifth message....."}
		for _, m := range msgs {
			if out := runTutorialRetry(t, port(0), "new_task.py", m); out != " [x] Sent "+m+"\n" {
				t.Fatalf("new_task.py printed %q", out)
			}
		}
		testutil.WaitForf(t, 90*time.Second, func() bool {
			all := w1.String() + w2.String()
			for _, m := range msgs {
				if !strings.Contains(all, " [x] Received "+m+"\n") {
					return false
				}
			}
			return strings.Count(all, " [x] Done") == len(msgs)
		}, "every task received and done once; worker 1:\n%s\nworker 2:\n%s", w1, w2)
	})

	t.Run("3 publish subscribe", func(t *testing.T) {
		const waiting = " [*] Waiting for logs. To exit press CTRL+C"
		r1, r2 := startTutorialRetry(t, port(1), "receive_logs.py", waiting), startTutorialRetry(t, port(2), "receive_logs.py", waiting)
		// A hears of each receiver's binding a moment after it is made.
		waitUntil(t, 30*time.Second, "a knows the bindings of b and c", func() bool {
			known := 0
			for _, st := range nodes[0].Broker().PeerPubSubStats() {
				if (st.Node == "b" || st.Node == "c") && st.Patterns >= 1 {
					known++
				}
			}
			return known == 2
		})
		if out := runTutorialRetry(t, port(0), "emit_log.py"); out != " [x] Sent info: Hello World!\n" {
			t.Fatalf("emit_log.py printed %q", out)
		}
		runTutorialRetry(t, port(0), "emit_log.py", "second")
		for _, r := range []*lockedBuffer{r1, r2} {
			waitOutput(t, r, " [x] b'info: Hello World!'", " [x] b'second'")
		}
	})

	t.Run("6 rpc", func(t *testing.T) {
		server := startTutorialRetry(t, port(1), "rpc_server.py", " [x] Awaiting RPC requests")
		if out := runTutorialRetry(t, port(2), "rpc_client.py"); out != " [x] Requesting fib(30)\n [.] Got 832040\n" {
			t.Fatalf("rpc_client.py printed %q", out)
		}
		waitOutput(t, server, " [.] fib(30)")
	})
}
