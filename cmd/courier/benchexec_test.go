package main

import (
	"debug/buildinfo"
	"strings"
	"testing"
)

// TestServerBinaryIsLean: the courier binary does not link the modules
// only the load generator (cmd/courier-bench) uses, as go version -m
// would list them.
func TestServerBinaryIsLean(t *testing.T) {
	bi, err := buildinfo.ReadFile(cliBin)
	if err != nil {
		t.Fatal(err)
	}
	benchOnly := []string{
		"gonum.org/v1/plot",
		"github.com/nats-io/nats.go",
		"github.com/rabbitmq/amqp091-go",
		"github.com/schollz/progressbar/v3",
		"github.com/HdrHistogram/hdrhistogram-go",
	}
	var mods []string
	for _, d := range bi.Deps {
		mods = append(mods, d.Path)
		for _, b := range benchOnly {
			if d.Path == b {
				t.Errorf("courier links %s, which only courier-bench needs", b)
			}
		}
	}
	t.Logf("courier links %d modules: %s", len(mods), strings.Join(mods, " "))
}

// TestBenchWithoutCourierBench: with no courier-bench next to courier,
// courier bench fails and says how to get it, whatever its arguments.
func TestBenchWithoutCourierBench(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "reqresp", "--count", "5"},
		{"bench", "--help"},
		{"bench"},
	} {
		r := cliRun(t, args...)
		if r.code == 0 || r.stdout != "" {
			t.Errorf("courier %v: exit %d, stdout %q; want a failure", args, r.code, r.stdout)
		}
		for _, want := range []string{"error: courier bench: the load generator is its own binary, courier-bench",
			"go build -o ", "./cmd/courier-bench", "go install github.com/courier-mq/courier/cmd/...@latest"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("courier %v: stderr has no %q:\n%s", args, want, r.stderr)
			}
		}
	}
}
