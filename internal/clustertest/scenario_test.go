//go:build linux

package clustertest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Environment of a long run (scripts/chaos sets them).
const (
	envScenario = "COURIER_CHAOS_SCENARIO"
	envSeed     = "COURIER_CHAOS_SEED"
	envDuration = "COURIER_CHAOS_DURATION"
	envReport   = "COURIER_CHAOS_REPORT"
)

// TestChaosShort runs the mixed scenario for a few seconds: every
// nemesis kind can come up, and every checker must find nothing.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault run of 10 s")
	}
	sc, err := ScenarioNamed("single-mixed")
	if err != nil {
		t.Fatal(err)
	}
	sc.Hold, sc.Gap = time.Second, time.Second
	runShort(t, sc, 10*time.Second)
}

// TestChaosClusterShort runs a 3-node cluster for 20 s under kill -9
// (restarted), SIGSTOP past the lease, and isolation, drawn with the
// seed, with the clustered workload (registry, requests, pub-sub,
// leaders, a replicated queue) and every checker: the cluster's promises under faults, in
// every CI run. netns mode as root with ip, the proxies elsewhere.
func TestChaosClusterShort(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster fault run of 20 s")
	}
	needCluster(t)
	sc := Scenario{Name: "cluster-short", Cluster: true, Workload: clustered,
		Nemeses: []Nemesis{Kill{Node: Random}, Pause{Node: Random}, Isolate{Node: Random}},
		Hold:    3 * time.Second, Gap: 4 * time.Second, Grace: 5 * time.Second}
	runShort(t, sc, 20*time.Second)
}

// TestChaosQueueShort runs a 3-node cluster with a replicated queue
// for 20 s under kill -9 of the queue's leader node (restarted), with
// producers and workers on every node and every task checker: the
// failover of a replicated queue, in every CI run.
func TestChaosQueueShort(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster fault run of 20 s")
	}
	needCluster(t)
	sc := Scenario{Name: "cluster-queue-short", Cluster: true, Workload: replicated,
		Nemeses: []Nemesis{KillQueueLeader{}}, Hold: 3 * time.Second, Gap: 5 * time.Second, Grace: 5 * time.Second}
	r := runShort(t, sc, 20*time.Second)
	if !slices.ContainsFunc(r.Nemeses, func(n NemesisRecord) bool { return n.Name == "kill-queue-leader" }) {
		t.Fatal("the queue's leader was never killed")
	}
}

// runShort runs sc for d with seed 1 (COURIER_CHAOS_SEED changes it),
// writes its reports, history and node logs into COURIER_CHAOS_REPORT
// if set, and fails on any violation, or if a fault or a checker had nothing to
// do.
func runShort(t *testing.T, sc Scenario, d time.Duration) Report {
	seed := uint64(1)
	if s := os.Getenv(envSeed); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	dir := os.Getenv(envReport)
	base := ""
	if dir != "" {
		base = filepath.Join(dir, "chaos-"+sc.Name+"-"+strconv.FormatUint(seed, 10))
		sc.LogDir = base + "-nodes"
	}
	r := RunScenario(t, sc, seed, d)
	var b strings.Builder
	r.WriteText(&b)
	t.Log("\n" + b.String())
	if base != "" {
		writeReports(t, base, r, b.String())
	}
	if !r.OK() {
		t.Fatalf("violations (seed %d)", seed)
	}
	if len(r.Nemeses) == 0 {
		t.Fatal("no fault injected")
	}
	for _, x := range r.Results {
		tasks := x.Checker == "tasks" || x.Checker == "attempts" || x.Checker == "keyed"
		idle := x.Checker == "registry" || x.Checker == "leaders" || x.Checker == "minority" ||
			tasks && !sc.Workload.Tasks || x.Checker == "keyed" && sc.Workload.TaskKeys == 0 ||
			!sc.Workload.Requests && x.Checker == "requests" || !sc.Workload.PubSub && x.Checker == "pubsub"
		if !idle && strings.HasPrefix(x.Checked, "0 ") {
			t.Errorf("%s checked nothing: %s", x.Checker, x.Checked)
		}
	}
	return r
}

// TestChaos is the long run of scripts/chaos: it runs only when
// COURIER_CHAOS_SCENARIO names a scenario, and writes the text and JSON
// reports into COURIER_CHAOS_REPORT (a directory; default: the current
// one).
func TestChaos(t *testing.T) {
	name := os.Getenv(envScenario)
	switch name {
	case "":
		t.Skip("set " + envScenario + " (scripts/chaos does)")
	case "list":
		for _, s := range Scenarios() {
			t.Logf("%s — %s", s.Name, s.Doc)
		}
		return
	}
	sc, err := ScenarioNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := strconv.ParseUint(os.Getenv(envSeed), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", envSeed, err)
	}
	d, err := time.ParseDuration(os.Getenv(envDuration))
	if err != nil {
		t.Fatalf("%s: %v", envDuration, err)
	}
	dir := os.Getenv(envReport)
	if dir == "" {
		dir = "."
	}
	base := filepath.Join(dir, "chaos-"+name+"-"+strconv.FormatUint(seed, 10))
	sc.LogDir = base + "-nodes"
	r := RunScenario(t, sc, seed, d)
	var text strings.Builder
	r.WriteText(&text)
	t.Log("\n" + text.String())
	writeReports(t, base, r, text.String())
	if !r.OK() {
		t.Fatalf("%d violations", r.Violations())
	}
}

// writeReports writes a run's reports and history next to base:
// base.txt, base.json, base-history.json.
func writeReports(t *testing.T, base string, r Report, text string) {
	t.Helper()
	if err := os.WriteFile(base+".txt", []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(base + ".json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := r.WriteJSON(f); err != nil {
		t.Fatal(err)
	}
	hist, err := json.Marshal(r.History)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(base+"-history.json", hist, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("reports: %s.txt, %s.json; history in %s-history.json; node logs in %s-nodes", base, base, base, base)
}

// envHistory names a history file (chaos-SCENARIO-SEED-history.json)
// for TestRecheck.
const envHistory = "COURIER_CHAOS_HISTORY"

// TestRecheck judges a saved history again with today's checkers:
// COURIER_CHAOS_HISTORY=path go test -run TestRecheck -v
// ./internal/clustertest, after a checker changed.
func TestRecheck(t *testing.T) {
	path := os.Getenv(envHistory)
	if path == "" {
		t.Skip("set " + envHistory + " to a history file")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	h := NewHistory()
	r := NewReport(filepath.Base(path), 0, "", 0, h, CheckRegistry(s, time.Minute), CheckLeaders(s, LeaderOptions{Grace: 5 * time.Second}),
		CheckPubSub(s, PubSubOptions{Grace: 5 * time.Second}), CheckRequests(s, DefaultMargin),
		CheckTasks(s), CheckKeyedTasks(s), CheckAttempts(s), CheckMinority(s))
	r.Nemeses = s.Nemeses
	var text strings.Builder
	r.WriteText(&text)
	t.Log("\n" + text.String())
	if !r.OK() {
		t.Fatalf("%d violations", r.Violations())
	}
}
