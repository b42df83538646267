//go:build linux

package clustertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Nemesis is one kind of fault. Start injects it, chosen with rng where
// it has a choice, and returns what it did, on which nodes, and how to
// end it. Nemeses are used through [Cluster.Inject] and [Run], which
// record them into the history.
type Nemesis interface {
	// Name names the kind of fault in the history ("kill", "partition").
	Name() string
	// Start injects the fault. heal ends it; it is called once.
	Start(c *Cluster, rng *rand.Rand) (detail string, nodes []int, heal func() error, err error)
}

// Fault is a fault under way.
type Fault struct {
	c    *Cluster
	rec  int
	heal func() error
	once sync.Once
	err  error
}

// Inject starts nemesis n now, records it in the history, and returns
// the fault to heal.
func (c *Cluster) Inject(n Nemesis, rng *rand.Rand) (*Fault, error) {
	if rng == nil {
		rng = rand.New(rand.NewPCG(c.opts.Seed, 0))
	}
	detail, nodes, heal, err := n.Start(c, rng)
	if err != nil {
		return nil, fmt.Errorf("nemesis %s: %w", n.Name(), err)
	}
	names := make([]string, len(nodes))
	for i, x := range nodes {
		names[i] = c.nodes[x].Name
	}
	rec := c.hist.BeginNemesis(n.Name(), detail, names...)
	if m, ok := n.(minorityCutter); ok && m.cutsMinority() && c.opts.Cluster {
		c.hist.SetMinority(rec, names...)
	}
	c.t.Logf("clustertest: %s %s %s at %s", n.Name(), strings.Join(names, ","), detail, ms(c.hist.Now()))
	return &Fault{c: c, rec: rec, heal: heal}, nil
}

// Heal ends the fault and records its end; later calls return the first
// call's error.
func (f *Fault) Heal() error {
	f.once.Do(func() {
		f.c.hist.HealingNemesis(f.rec)
		f.err = f.heal()
		f.c.hist.EndNemesis(f.rec)
	})
	return f.err
}

// minorityCutter is a nemesis whose nodes it cuts off from a majority of
// the cluster, which then must confirm nothing (see [CheckMinority]);
// separate single-node servers are each a majority of their own.
type minorityCutter interface{ cutsMinority() bool }

func (Isolate) cutsMinority() bool { return true }
func (Split) cutsMinority() bool   { return true }

// pick returns node, or a random node index when node < 0.
func pick(c *Cluster, rng *rand.Rand, node int) int {
	if node < 0 {
		return rng.IntN(len(c.nodes))
	}
	return node
}

// Random is the node index that asks a nemesis to pick a node at random.
const Random = -1

// Kill kills a node with SIGKILL; healing restarts it on the same data
// directory.
type Kill struct {
	// Node is the node's index, or [Random].
	Node int
}

// Name implements [Nemesis].
func (Kill) Name() string { return "kill" }

// Start implements [Nemesis].
func (k Kill) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	i := pick(c, rng, k.Node)
	n := c.nodes[i]
	if err := n.Kill(); err != nil {
		return "", nil, nil, err
	}
	return "SIGKILL; heal restarts on the same data dir", []int{i}, n.StartErr, nil
}

// Pause stops a node with SIGSTOP; healing continues it with SIGCONT.
// Hold it past the timeouts under test (leases, heartbeats).
type Pause struct {
	// Node is the node's index, or [Random].
	Node int
}

// Name implements [Nemesis].
func (Pause) Name() string { return "pause" }

// Start implements [Nemesis].
func (p Pause) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	i := pick(c, rng, p.Node)
	n := c.nodes[i]
	if err := n.Signal(syscall.SIGSTOP); err != nil {
		return "", nil, nil, err
	}
	// SIGSTOP takes effect as each thread next runs: on a loaded
	// machine a process can serve a request after kill(2) returned. The
	// fault begins when every thread is stopped.
	if err := waitStopped(n.Pid(), 10*time.Second); err != nil {
		n.Signal(syscall.SIGCONT)
		return "", nil, nil, err
	}
	return "SIGSTOP; heal sends SIGCONT", []int{i}, func() error { return n.Signal(syscall.SIGCONT) }, nil
}

// waitStopped waits until every thread of pid is stopped (state T in
// /proc/PID/task/*/stat).
func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		stopped, err := allStopped(pid)
		if err != nil || stopped {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("clustertest: process %d not stopped %v after SIGSTOP", pid, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// allStopped reports whether every thread of pid is stopped.
func allStopped(pid int) (bool, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("clustertest: %w", err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
		if err != nil {
			continue // the thread ended
		}
		// The state follows the command name, which is in parentheses
		// and may hold spaces: read after the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			return false, fmt.Errorf("clustertest: bad %s/%s/stat", dir, task.Name())
		}
		if st := b[i+2]; st != 'T' && st != 't' {
			return false, nil
		}
	}
	return true, nil
}

// Isolate cuts one node from every other.
type Isolate struct {
	// Node is the node's index, or [Random].
	Node int
}

// Name implements [Nemesis].
func (Isolate) Name() string { return "partition" }

// Start implements [Nemesis].
func (p Isolate) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	i := pick(c, rng, p.Node)
	var rest []int
	for j := range c.nodes {
		if j != i {
			rest = append(rest, j)
		}
	}
	if err := c.Partition([]int{i}, rest); err != nil {
		return "", nil, nil, err
	}
	return "isolated from every other node", []int{i}, c.Heal, nil
}

// Split cuts the nodes into a random majority and minority.
type Split struct{}

// Name implements [Nemesis].
func (Split) Name() string { return "partition" }

// Start implements [Nemesis].
func (Split) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	perm := rng.Perm(len(c.nodes))
	minority := perm[:len(perm)/2]
	majority := perm[len(perm)/2:]
	if err := c.Partition(minority, majority); err != nil {
		return "", nil, nil, err
	}
	return fmt.Sprintf("minority %v cut from majority %v", names(c, minority), names(c, majority)), minority, c.Heal, nil
}

// Bridge splits the nodes in two halves that cannot reach each other
// but can both reach one bridge node (Jepsen's bridge). Needs 3 nodes.
type Bridge struct{}

// Name implements [Nemesis].
func (Bridge) Name() string { return "partition" }

// Start implements [Nemesis].
func (Bridge) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	if len(c.nodes) < 3 {
		return "", nil, nil, errors.New("a bridge needs 3 nodes")
	}
	perm := rng.Perm(len(c.nodes))
	bridge, rest := perm[0], perm[1:]
	a, b := rest[:len(rest)/2], rest[len(rest)/2:]
	var pairs [][2]int
	for _, x := range a {
		for _, y := range b {
			pairs = append(pairs, [2]int{x, y})
		}
	}
	if err := c.Cut(pairs...); err != nil {
		return "", nil, nil, err
	}
	return fmt.Sprintf("%v and %v cut, both reach %s", names(c, a), names(c, b), c.nodes[bridge].Name), []int{bridge}, c.Heal, nil
}

// Flap isolates a random node, heals, and isolates another, every
// Period, until healed.
type Flap struct {
	// Period is how long each state lasts. Default: 5s.
	Period time.Duration
}

// Name implements [Nemesis].
func (Flap) Name() string { return "flap" }

// Start implements [Nemesis].
func (f Flap) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	period := f.Period
	if period <= 0 {
		period = 5 * time.Second
	}
	seed := rng.Uint64()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		r := rand.New(rand.NewPCG(seed, 1))
		cut := false
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			if cut {
				c.Heal()
				c.hist.Notef("flap: healed")
			} else {
				i := r.IntN(len(c.nodes))
				var rest []int
				for j := range c.nodes {
					if j != i {
						rest = append(rest, j)
					}
				}
				c.Partition([]int{i}, rest)
				c.hist.Notef("flap: isolated " + c.nodes[i].Name)
			}
			cut = !cut
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return fmt.Sprintf("a random node isolated and healed every %v", period), nil, func() error {
		close(stop)
		<-done
		return c.Heal()
	}, nil
}

// Netem delays (and drops a fraction of) what a node sends, with tc
// netem on its link in netns mode and in its proxy otherwise.
type Netem struct {
	// Node is the node's index, or [Random].
	Node int
	// Delay is added to every packet.
	Delay time.Duration
	// Loss is the fraction of packets dropped, 0..1.
	Loss float64
}

// Name implements [Nemesis].
func (Netem) Name() string { return "netem" }

// Start implements [Nemesis].
func (n Netem) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	i := pick(c, rng, n.Node)
	if err := c.Netem(i, n.Delay, n.Loss); err != nil {
		return "", nil, nil, err
	}
	return fmt.Sprintf("delay %v, loss %g%%", n.Delay, n.Loss*100), []int{i}, func() error { return c.Netem(i, 0, 0) }, nil
}

// names lists node names.
func names(c *Cluster, idx []int) []string {
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = c.nodes[i].Name
	}
	return out
}

// Schedule bounds a run of random faults.
type Schedule struct {
	// Seed chooses the faults, their nodes and their timing.
	Seed uint64
	// Nemeses are the kinds of fault to draw from, uniformly.
	Nemeses []Nemesis
	// Count bounds the number of faults. Default: 10.
	Count int
	// Hold is the longest a fault lasts; each lasts between Hold/2 and
	// Hold. Default: 5s.
	Hold time.Duration
	// Gap is the longest quiet time before each fault, between Gap/2 and
	// Gap. Default: 5s.
	Gap time.Duration
}

// Run injects faults of s one after the other until s.Count have run or
// ctx ends; every fault is healed before Run returns. It returns the
// number of faults injected and the first error.
func Run(ctx context.Context, c *Cluster, s Schedule) (int, error) {
	if len(s.Nemeses) == 0 {
		return 0, errors.New("clustertest: a schedule needs nemeses")
	}
	if s.Count <= 0 {
		s.Count = 10
	}
	if s.Hold <= 0 {
		s.Hold = 5 * time.Second
	}
	if s.Gap <= 0 {
		s.Gap = 5 * time.Second
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x6e656d))
	between := func(d time.Duration) time.Duration { return d/2 + time.Duration(rng.Int64N(int64(d/2)+1)) }
	for k := range s.Count {
		if !sleepCtx(ctx, between(s.Gap)) {
			return k, nil
		}
		f, err := c.Inject(s.Nemeses[rng.IntN(len(s.Nemeses))], rng)
		if err != nil {
			return k, err
		}
		sleepCtx(ctx, between(s.Hold))
		if err := f.Heal(); err != nil {
			return k + 1, err
		}
	}
	return s.Count, nil
}

// sleepCtx sleeps for d or until ctx ends; false if ctx ended. An
// ended ctx wins over a timer that fired too: select would pick either.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// KillMetaLeader kills the node that leads the metadata Raft group (as
// GET /api/nodes tells); healing restarts it on the same data directory.
type KillMetaLeader struct{}

// Name implements [Nemesis].
func (KillMetaLeader) Name() string { return "kill-meta-leader" }

// Start implements [Nemesis].
func (KillMetaLeader) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	i, err := c.MetaLeader()
	if err != nil {
		return "", nil, nil, err
	}
	detail, nodes, heal, err := Kill{Node: i}.Start(c, rng)
	return "the metadata leader: " + detail, nodes, heal, err
}

// DefaultQueue is the task exchange of the workload's default names,
// the queue the queue nemeses aim at when they name none.
const DefaultQueue = "chaos-tasks"

// queueLeaderWait is how long a queue nemesis looks for the queue's
// leader: a queue may be between two leaders when the fault comes.
const queueLeaderWait = 30 * time.Second

// queueLeader finds the node serving queue (default [DefaultQueue]).
func queueLeader(c *Cluster, queue string) (int, string, error) {
	if queue == "" {
		queue = DefaultQueue
	}
	i, err := c.QueueLeader(queue, queueLeaderWait)
	return i, queue, err
}

// KillQueueLeader kills the node that serves a replicated queue (the
// leader of its replicas, found through the management API, see
// [Cluster.QueueLeader]) with SIGKILL; healing restarts it on the same
// data directory.
type KillQueueLeader struct {
	// Queue names the queue; default [DefaultQueue].
	Queue string
}

// Name implements [Nemesis].
func (KillQueueLeader) Name() string { return "kill-queue-leader" }

// Start implements [Nemesis].
func (k KillQueueLeader) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	i, q, err := queueLeader(c, k.Queue)
	if err != nil {
		return "", nil, nil, err
	}
	detail, nodes, heal, err := Kill{Node: i}.Start(c, rng)
	return fmt.Sprintf("the leader of queue %s: %s", q, detail), nodes, heal, err
}

// PauseQueueLeader stops the node that serves a replicated queue with
// SIGSTOP; healing continues it. Hold it past the replicas' election
// timeout, so that the others elect a new leader meanwhile.
type PauseQueueLeader struct {
	// Queue names the queue; default [DefaultQueue].
	Queue string
}

// Name implements [Nemesis].
func (PauseQueueLeader) Name() string { return "pause-queue-leader" }

// Start implements [Nemesis].
func (p PauseQueueLeader) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	i, q, err := queueLeader(c, p.Queue)
	if err != nil {
		return "", nil, nil, err
	}
	detail, nodes, heal, err := Pause{Node: i}.Start(c, rng)
	return fmt.Sprintf("the leader of queue %s: %s", q, detail), nodes, heal, err
}

// IsolateQueueLeader cuts the node that serves a replicated queue from
// every other node (its clients still reach it); healing removes the
// cut. It must confirm nothing meanwhile ([CheckMinority]).
type IsolateQueueLeader struct {
	// Queue names the queue; default [DefaultQueue].
	Queue string
}

// Name implements [Nemesis].
func (IsolateQueueLeader) Name() string { return "isolate-queue-leader" }

func (IsolateQueueLeader) cutsMinority() bool { return true }

// Start implements [Nemesis].
func (p IsolateQueueLeader) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	i, q, err := queueLeader(c, p.Queue)
	if err != nil {
		return "", nil, nil, err
	}
	detail, nodes, heal, err := Isolate{Node: i}.Start(c, rng)
	return fmt.Sprintf("the leader of queue %s: %s", q, detail), nodes, heal, err
}
