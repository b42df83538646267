package bench_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// writeRun writes one run's JSON and load average as scripts/bench-amqp.sh
// keeps them.
func writeRun(t *testing.T, dir string, round int, name, js string, load float64) {
	t.Helper()
	rd := filepath.Join(dir, fmt.Sprintf("round-%d", round))
	if err := os.MkdirAll(rd, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rd, name+".json"), []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rd, name+".load"), []byte(fmt.Sprintf("%.2f\n", load)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// bench-amqp-table.py gives the medians over the rounds, Courier-AMQP's
// ratios (rates divided, latency and memory inverted) and each server's
// CPU, RSS and load average.
func TestBenchAMQPTable(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	dir := t.TempDir()
	// tasks: produced 1000, 3000, 2000 /s on RabbitMQ (median 2000);
	// Courier AMQP 5000 each round; Courier native 10000.
	tasks := func(rate float64, cpu float64) string {
		return fmt.Sprintf(`{"scenario":"tasks","usage":{"server_peak_rss_bytes":%d},"produced_per_s":%g,"consumed_per_s":%g,"cpu_per_task":{"broker_us":%g}}`,
			int64(50e6), rate, rate/2, cpu)
	}
	reqresp := func(seq, p50 float64) string {
		return fmt.Sprintf(`{"scenario":"reqresp","usage":{"server_peak_rss_bytes":30000000},"runs":[{"parallel":0,"cycles_per_s":%g,"latency_us":{"p50":%g}},{"parallel":10,"cycles_per_s":%g,"latency_us":{"p50":1}}],"cpu_per_cycle":{"broker_us":10}}`,
			seq, p50, 4*seq)
	}
	backlog := func(rss1, rss2 float64) string {
		return fmt.Sprintf(`{"scenario":"backlog","usage":{"server_peak_rss_bytes":1},"iterations_per_s":100,"curve":[{"server_rss_bytes":%g},{"server_rss_bytes":%g}],"cpu_per_iteration":{"broker_us":1}}`,
			rss1, rss2)
	}
	for r, rabbit := range []float64{1000, 3000, 2000} {
		writeRun(t, dir, r+1, "tasks-rabbitmq", tasks(rabbit, 100), 4)
		writeRun(t, dir, r+1, "tasks-courier-amqp", tasks(5000, 20), 5)
		writeRun(t, dir, r+1, "tasks-courier", tasks(10000, 10), 6)
	}
	writeRun(t, dir, 1, "reqresp-rabbitmq", reqresp(1000, 400), 1)
	writeRun(t, dir, 1, "reqresp-courier-amqp", reqresp(3000, 100), 1)
	writeRun(t, dir, 1, "reqresp-courier", reqresp(4000, 80), 1)
	writeRun(t, dir, 1, "backlog-courier-amqp", backlog(80e6, 90e6), 1)
	writeRun(t, dir, 1, "backlog-rabbitmq", backlog(400e6, 800e6), 1)
	rd := filepath.Join(dir, "round-2")
	if err := os.WriteFile(filepath.Join(rd, "backlog-courier.json"), []byte("{truncated"), 0o644); err != nil {
		t.Fatal(err)
	}

	out, err := exec.Command("python3", "../../scripts/bench-amqp-table.py", dir).CombinedOutput()
	text := string(out)
	t.Logf("output:\n%s", text)
	if err != nil {
		t.Fatalf("bench-amqp-table.py: %v", err)
	}
	row := func(prefix string) []string {
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, prefix) {
				return strings.Fields(l)
			}
		}
		t.Errorf("no row %q", prefix)
		return nil
	}
	want := func(prefix string, fields ...string) {
		t.Helper()
		got := strings.Join(row(prefix), " ")
		if !strings.HasSuffix(got, strings.Join(fields, " ")) {
			t.Errorf("row %q: %q, want it to end in %q", prefix, got, strings.Join(fields, " "))
		}
	}
	// Medians with their range; AMQP/RabbitMQ 5000/2000, AMQP/native 5000/10000.
	want("tasks    produced", "2000", "[1000–3000]", "5000", "[5000–5000]", "10000", "[10000–10000]", "2.50x", "0.50x")
	// Higher latency is worse: the ratio is inverted.
	want("reqresp  sequential p50", "400", "100", "80", "4.00x", "0.80x")
	want("reqresp  parallel 10", "4000", "12000", "16000", "3.00x", "0.75x")
	want("backlog  RSS at full depth", "800", "90", "–", "8.89x", "–")
	want("tasks    Courier AMQP", "20", "[20–20]", "50", "[50–50]", "5", "[5–5]")
	if !strings.Contains(text, "Failed: round-2 backlog on Courier native") {
		t.Errorf("the unreadable run is not reported")
	}
	if strings.Contains(text, "after/before") {
		t.Errorf("an after/before column without a before target")
	}
}

// bench-amqp.sh refuses an unknown target, and the before target without
// a before binary, before it starts anything.
func TestBenchAMQPScriptTargets(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for _, tc := range []struct{ targets, want string }{
		{"courier-amqp nope", "unknown target nope"},
		{"courier-amqp courier-amqp-before", "courier-amqp-before needs BEFORE_BIN"},
	} {
		cmd := exec.Command("bash", "../../scripts/bench-amqp.sh", t.TempDir())
		cmd.Env = append(os.Environ(), "TARGETS="+tc.targets, "BEFORE_BIN=", "COURIER_BIN=/bin/false", "BENCH_BIN=/bin/false")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("TARGETS=%q: %v\n%s", tc.targets, err, out)
		}
	}
}
