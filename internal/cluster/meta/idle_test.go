package meta

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// TestIdleCost reports the CPU an idle 3-node group takes (all three in
// this process), with META_IDLE=1, or META_IDLE=50ms for that commit timeout: a figure,
// not a check.
func TestIdleCost(t *testing.T) {
	if os.Getenv("META_IDLE") == "" {
		t.Skip("set META_IDLE=1 to measure")
	}
	var tune func(*Config)
	if d, err := time.ParseDuration(os.Getenv("META_IDLE")); err == nil {
		tune = func(c *Config) { c.CommitTimeout = d }
	}
	newCluster(t, 3, tune)
	time.Sleep(2 * time.Second) // settle: the figure below is of the idle group
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before, start := cpu(), time.Now()
	time.Sleep(10 * time.Second)
	used, wall := cpu()-before, time.Since(start)
	t.Logf("idle 3-node group: %v CPU over %v: %.2f%% of one core", used.Round(time.Millisecond), wall.Round(time.Millisecond), 100*float64(used)/float64(wall))
}
