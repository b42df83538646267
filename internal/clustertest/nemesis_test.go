//go:build linux

package clustertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeNemesis picks a node and records what it did, touching nothing.
type fakeNemesis struct {
	name string
	mu   *sync.Mutex
	log  *[]string
}

func (f fakeNemesis) Name() string { return f.name }

func (f fakeNemesis) Start(c *Cluster, rng *rand.Rand) (string, []int, func() error, error) {
	i := pick(c, rng, Random)
	f.mu.Lock()
	*f.log = append(*f.log, fmt.Sprintf("%s:%d", f.name, i))
	f.mu.Unlock()
	return "fake", []int{i}, func() error { return nil }, nil
}

// bareCluster is a cluster of n nodes that never run, for schedules.
func bareCluster(t *testing.T, n int) *Cluster {
	c := &Cluster{t: t, hist: NewHistory(), opts: Options{Seed: 1}}
	for i := range n {
		c.nodes = append(c.nodes, &Node{c: c, Index: i, Name: fmt.Sprintf("n%d", i+1)})
	}
	return c
}

func runFake(t *testing.T, seed uint64) ([]string, Snapshot) {
	c := bareCluster(t, 5)
	var mu sync.Mutex
	var log []string
	ns := []Nemesis{fakeNemesis{"a", &mu, &log}, fakeNemesis{"b", &mu, &log}}
	n, err := Run(context.Background(), c, Schedule{Seed: seed, Nemeses: ns, Count: 12, Hold: 2 * time.Millisecond, Gap: 2 * time.Millisecond})
	if err != nil || n != 12 {
		t.Fatalf("Run: %d faults, %v", n, err)
	}
	return log, c.hist.Snapshot()
}

// TestRunIsSeededAndBounded checks that a schedule's faults, their kinds
// and nodes, follow from its seed, that it stops at its count, and that
// every fault is recorded with an end at least Hold/2 after its start.
func TestRunIsSeededAndBounded(t *testing.T) {
	a, s := runFake(t, 42)
	b, _ := runFake(t, 42)
	c, _ := runFake(t, 43)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different faults:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Fatalf("seeds 42 and 43 drew the same 12 faults: %v", a)
	}
	if len(s.Nemeses) != 12 {
		t.Fatalf("%d faults recorded, want 12", len(s.Nemeses))
	}
	for _, n := range s.Nemeses {
		if n.End-n.Start < int64(time.Millisecond) || len(n.Nodes) != 1 || n.Detail != "fake" {
			t.Fatalf("fault recorded as %+v", n)
		}
	}
}

// TestRunStopsWithContext checks that a schedule ends with its context
// and heals the fault under way.
func TestRunStopsWithContext(t *testing.T) {
	c := bareCluster(t, 3)
	var mu sync.Mutex
	var log []string
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	n, err := Run(ctx, c, Schedule{Seed: 1, Nemeses: []Nemesis{fakeNemesis{"a", &mu, &log}}, Count: 1000, Hold: time.Hour, Gap: time.Millisecond})
	if err != nil || n != 1 {
		t.Fatalf("Run: %d faults, %v", n, err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("Run ran %v past its context", d)
	}
	// An open fault would end at the snapshot's own time.
	if s := c.hist.Snapshot(); s.Nemeses[0].End >= s.Duration {
		t.Fatalf("fault not healed: %+v (snapshot at %d)", s.Nemeses, s.Duration)
	}
}

func TestPartitionCuts(t *testing.T) {
	cut := partitionCuts(3, [][]int{{0}, {1, 2}})
	want := map[[2]int]bool{{0, 1}: true, {1, 0}: true, {0, 2}: true, {2, 0}: true}
	if len(cut) != len(want) {
		t.Fatalf("got %v, want %v", cut, want)
	}
	for p := range want {
		if !cut[p] {
			t.Fatalf("got %v, want %v", cut, want)
		}
	}
	// A node in no group is cut from everyone.
	if cut := partitionCuts(3, [][]int{{0, 1}}); !cut[[2]int{2, 0}] || !cut[[2]int{1, 2}] || cut[[2]int{0, 1}] {
		t.Fatalf("node left out: %v", cut)
	}
	if len(partitionCuts(3, nil)) != 0 {
		t.Fatal("no groups should heal")
	}
}

func TestSetField(t *testing.T) {
	var withField struct {
		Name        string
		NoReconnect bool
	}
	if !setField(&withField, "NoReconnect", true) || !withField.NoReconnect {
		t.Fatal("NoReconnect not set")
	}
	var without struct{ Name string }
	if setField(&without, "NoReconnect", true) || setField(&without, "Name", true) {
		t.Fatal("set a field that is missing or not a bool")
	}
}
