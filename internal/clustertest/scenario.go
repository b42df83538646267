//go:build linux

package clustertest

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// Scenario is a named fault test: nodes, a workload, and the nemeses
// drawn from while it runs.
type Scenario struct {
	// Name names it for scripts/chaos -scenario.
	Name string
	// Doc says what it does, in one line.
	Doc string
	// Nodes is the number of nodes. Default: 3.
	Nodes int
	// Cluster makes the nodes one cluster (see [Options.Cluster]).
	Cluster bool
	// Workload is what the clients do.
	Workload Workload
	// Nemeses are drawn from uniformly; none: a run without faults.
	Nemeses []Nemesis
	// Hold and Gap time the faults (see [Schedule]). Defaults: 2s, 3s.
	Hold, Gap time.Duration
	// Grace is how long after a fault pub-sub losses are still allowed.
	// Default: 3s.
	Grace time.Duration
	// LogDir, if set, keeps the nodes' logs (see [Options.KeepLogs]).
	LogDir string
}

// singleNode is the workload against separate single-node servers:
// every client on its node, registry names scoped by node. Definitions
// are durable (fsynced before a declare is answered, docs/operations.md
// "Durable storage"), so a node's registry must stay linearizable across
// its kill -9 and restart.
var singleNode = Workload{
	Registry: true, Requests: true, PubSub: true, Leaders: true, Tasks: true, TaskKeys: 4,
	RegistryNames: func(n *Node) []string {
		return []string{n.Name + "-a", n.Name + "-b", n.Name + "-c"}
	},
	Separate: true,
	Rate:     40,
}

// clustered is the workload against one cluster: shared exchange names,
// so handlers, subscribers and leader members on every node are in the
// same groups; declares, deletes and gets, all linearizable in a
// cluster (docs/cluster.md "What each operation promises"); and a
// replicated queue (Replicas(3)) with a producer and a worker per node,
// at 10 submits a second each to keep the run cheap. Its tasks have no
// keys: after a partition heals, a node may cut its links to a healthy
// one on stale news of its death, and the queue's leader then gives
// another worker the tasks a forwarded worker still holds, which the
// keyed checker reports (docs/replication.md, "Chaos suite", open);
// the cluster-queue-* scenarios have keys.
var clustered = Workload{Registry: true, Requests: true, PubSub: true, Leaders: true, Rate: 40,
	Tasks: true, TaskRate: 10, Replicas: 3}

// replicated is the workload of the queue scenarios: on every node a
// producer submitting with confirms (every other task keyed, 4 keys
// shared by all) and a worker (prefetch 8, acking each task after a
// random hold of up to 30 ms), on one task exchange declared with
// Replicas(3), so that the replicated queue is the only thing under
// test.
var replicated = Workload{Tasks: true, TaskKeys: 4, Replicas: 3, Rate: 40}

// Scenarios lists the scenarios, by name. Those named single-* run
// separate single-node servers: they prove the harness, the workload and
// the checkers against real processes under real faults. Those named
// cluster-* run one 3-node cluster and are skipped by a courier without
// --join; each checks what the cluster promises, so they find the
// features not yet built (pub-sub across nodes before it lands) as
// violations.
func Scenarios() []Scenario {
	partitions := []Nemesis{Isolate{Node: Random}, Split{}, Bridge{}, Flap{Period: 2 * time.Second}, Netem{Node: Random, Delay: 50 * time.Millisecond, Loss: 0.05}}
	clusterFaults := []Nemesis{Kill{Node: Random}, KillMetaLeader{}, Pause{Node: Random}, Isolate{Node: Random}, Split{}, Bridge{}, Flap{Period: 5 * time.Second}}
	return []Scenario{
		{Name: "single-kill", Doc: "kill -9 of a random node, restarted on its data dir", Workload: singleNode, Nemeses: []Nemesis{Kill{Node: Random}}},
		{Name: "single-pause", Doc: "SIGSTOP of a random node for 2–4 s, past its clients' heartbeats", Workload: singleNode,
			Nemeses: []Nemesis{Pause{Node: Random}}, Hold: 4 * time.Second},
		{Name: "single-partition", Doc: "partitions (isolate, split, bridge, flapping) and delay with loss between the nodes", Workload: singleNode, Nemeses: partitions},
		{Name: "single-mixed", Doc: "all of the above, drawn at random", Workload: singleNode,
			Nemeses: append([]Nemesis{Kill{Node: Random}, Pause{Node: Random}}, partitions...)},
		{Name: "cluster-kill", Doc: "3-node cluster: kill -9 of a random node, restarted on its data dir", Cluster: true, Workload: clustered,
			Nemeses: []Nemesis{Kill{Node: Random}}, Hold: 5 * time.Second, Gap: 10 * time.Second, Grace: 5 * time.Second},
		{Name: "cluster-meta-leader", Doc: "3-node cluster: kill -9 of the metadata leader", Cluster: true, Workload: clustered,
			Nemeses: []Nemesis{KillMetaLeader{}}, Hold: 5 * time.Second, Gap: 10 * time.Second, Grace: 5 * time.Second},
		{Name: "cluster-pause", Doc: "3-node cluster: SIGSTOP of a random node for 3–6 s, past its 1.2 s liveness lease", Cluster: true, Workload: clustered,
			Nemeses: []Nemesis{Pause{Node: Random}}, Hold: 6 * time.Second, Gap: 10 * time.Second, Grace: 5 * time.Second},
		{Name: "cluster-partition", Doc: "3-node cluster: one node isolated, a minority split off, a bridge, flapping every 5 s", Cluster: true, Workload: clustered,
			Nemeses: []Nemesis{Isolate{Node: Random}, Split{}, Bridge{}, Flap{Period: 5 * time.Second}}, Hold: 8 * time.Second, Gap: 10 * time.Second, Grace: 5 * time.Second},
		{Name: "cluster-mixed", Doc: "3-node cluster: all of the above, drawn at random", Cluster: true, Workload: clustered,
			Nemeses: clusterFaults, Hold: 6 * time.Second, Gap: 10 * time.Second, Grace: 5 * time.Second},
		{Name: "cluster-queue-kill", Doc: "3-node cluster, a replicated queue: kill -9 of the queue's leader node or of a random node, restarted on its data dir",
			Cluster: true, Workload: replicated, Nemeses: []Nemesis{KillQueueLeader{}, KillQueueLeader{}, Kill{Node: Random}},
			Hold: 5 * time.Second, Gap: 8 * time.Second, Grace: 5 * time.Second},
		{Name: "cluster-queue-partition", Doc: "3-node cluster, a replicated queue: its leader's node isolated or stopped (SIGSTOP) past the election timeout, a random node isolated, a minority split off",
			Cluster: true, Workload: replicated, Nemeses: []Nemesis{IsolateQueueLeader{}, PauseQueueLeader{}, Isolate{Node: Random}, Split{}},
			Hold: 6 * time.Second, Gap: 8 * time.Second, Grace: 5 * time.Second},
		{Name: "cluster-queue-mixed", Doc: "3-node cluster, a replicated queue: all of the above, the metadata leader's kill and flapping, drawn at random",
			Cluster: true, Workload: replicated, Nemeses: []Nemesis{KillQueueLeader{}, PauseQueueLeader{}, IsolateQueueLeader{}, Kill{Node: Random},
				KillMetaLeader{}, Isolate{Node: Random}, Split{}, Flap{Period: 4 * time.Second}},
			Hold: 6 * time.Second, Gap: 8 * time.Second, Grace: 5 * time.Second},
	}
}

// binaryClusters reports whether the courier binary can form a cluster
// (its server has --join).
func binaryClusters() (bool, error) {
	bin, err := Binary()
	if err != nil {
		return false, err
	}
	out, _ := exec.Command(bin, "server", "--help").CombinedOutput()
	return strings.Contains(string(out), "--join"), nil
}

// ScenarioNamed returns the scenario called name.
func ScenarioNamed(name string) (Scenario, error) {
	all := Scenarios()
	i := slices.IndexFunc(all, func(s Scenario) bool { return s.Name == name })
	if i < 0 {
		var names []string
		for _, s := range all {
			names = append(names, s.Name)
		}
		return Scenario{}, fmt.Errorf("clustertest: no scenario %q; there are %v", name, names)
	}
	return all[i], nil
}

// RunScenario runs sc for duration with seed: its nodes, its workload,
// and faults drawn from its nemeses, at most one at a time, each healed
// before the next. When the duration is over the last fault is healed,
// the clients stop (task workers drain the queues for up to 30 s), and
// every checker judges the history. The report says what was checked
// and found; the caller decides what a violation means.
func RunScenario(t testing.TB, sc Scenario, seed uint64, duration time.Duration) Report {
	t.Helper()
	if sc.Nodes <= 0 {
		sc.Nodes = 3
	}
	if sc.Hold <= 0 {
		sc.Hold = 2 * time.Second
	}
	if sc.Gap <= 0 {
		sc.Gap = 3 * time.Second
	}
	if sc.Grace <= 0 {
		sc.Grace = 3 * time.Second
	}
	if sc.Cluster {
		ok, err := binaryClusters()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Skip("this courier has no cluster (no --join); set " + EnvBinary + " to a build that has")
		}
	}
	c := New(t, Options{Nodes: sc.Nodes, Cluster: sc.Cluster, Seed: seed, KeepLogs: sc.LogDir})
	if sc.Cluster {
		// The promises hold between linked nodes: a subscriber whose
		// Subscribe returned before its node linked with a publisher's
		// was not promised that publisher's messages.
		formed := func(v []NodeView) bool { return len(v) == sc.Nodes && alive(v) == sc.Nodes }
		for _, n := range c.Nodes() {
			if _, err := n.WaitView(time.Minute, formed); err != nil {
				t.Fatalf("clustertest: the cluster did not form: %v", err)
			}
		}
	}
	h := c.History()
	h.Notef(fmt.Sprintf("scenario %s, seed %d, %v, mode %s", sc.Name, seed, duration, c.Mode()))
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go h.WatchStalls(50*time.Millisecond, stopWatch)
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	stop := sc.Workload.Start(ctx, c, seed, 30*time.Second)
	faults := make(chan error, 1)
	go func() {
		if len(sc.Nemeses) == 0 {
			faults <- nil
			return
		}
		// The count bounds the run as much as the duration does.
		count := int(duration/(sc.Gap/2+sc.Hold/2)) + 1
		n, err := Run(ctx, c, Schedule{Seed: seed, Nemeses: sc.Nemeses, Count: count, Hold: sc.Hold, Gap: sc.Gap})
		h.Notef(fmt.Sprintf("%d faults injected", n))
		faults <- err
	}()
	if err := <-faults; err != nil {
		t.Errorf("clustertest: nemesis: %v", err)
	}
	// A node a fault left down (it failed to restart) is restarted, so
	// that the queues can drain.
	for _, n := range c.Nodes() {
		if !n.Running() {
			if err := n.StartErr(); err != nil {
				t.Errorf("clustertest: %v", err)
			}
		}
	}
	cancel()
	stop()
	s := h.Snapshot()
	return NewReport(sc.Name, seed, c.Mode(), sc.Nodes, h,
		CheckRegistry(s, time.Minute),
		CheckLeaders(s, LeaderOptions{Grace: sc.Grace}),
		CheckPubSub(s, PubSubOptions{Grace: sc.Grace}),
		CheckRequests(s, DefaultMargin),
		CheckTasks(s),
		CheckKeyedTasks(s),
		CheckAttempts(s),
		CheckMinority(s),
	)
}
