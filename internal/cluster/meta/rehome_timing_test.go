package meta

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

// EnvRehomeKills runs [TestRehomeTimings] with that many losses.
const EnvRehomeKills = "META_REHOME_KILLS"

// TestRehomeTimings measures, over META_REHOME_KILLS losses of a node of
// an in-process 3-node group, the time from the loss until the group
// has re-homed an exchange homed on the lost node (the moment a new
// home may appoint a leader): a figure, not a check. Losses alternate
// between a kill (the node stops, its listeners close: connections are
// refused, as after kill -9) and a cut (a partition: the node runs on,
// alone); victims are drawn with seed META_REHOME_SEED (default 1) and
// are the metadata leader in about a third of the losses, reported
// apart. The lost node comes back (restarted on its directory, or
// healed) before the next loss.
func TestRehomeTimings(t *testing.T) {
	kills, _ := strconv.Atoi(os.Getenv(EnvRehomeKills))
	if kills <= 0 {
		t.Skip("set " + EnvRehomeKills + " to the number of losses")
	}
	seed := uint64(1)
	if s, err := strconv.ParseUint(os.Getenv("META_REHOME_SEED"), 10, 64); err == nil {
		seed = s
	}
	rng := rand.New(rand.NewPCG(seed, 14))
	var tune func(*Config)
	if v := os.Getenv("META_REHOME_LEASE"); v != "" {
		// heartbeat,lease,margin: another timing to compare.
		var d [3]time.Duration
		for i, f := range strings.SplitN(v, ",", 3) {
			d[i], _ = time.ParseDuration(f)
		}
		tune = func(c *Config) { c.RenewInterval, c.LeaseDuration, c.LeaseMargin = d[0], d[1], d[2] }
	}
	c := newCluster(t, 3, tune)
	ctx := testutil.Context(t, time.Duration(kills)*time.Minute)
	var follower, leader []time.Duration
	for k := range kills {
		lead := c.waitLeader(30 * time.Second)
		for _, m := range c.running() {
			testutil.WaitForf(t, 30*time.Second, m.LeaseValid, "loss %d: %s holds a lease", k, m.NodeID())
		}
		victim := c.ids[rng.IntN(len(c.ids))]
		vm := c.node(victim)
		name := fmt.Sprintf("home.%d", k)
		if _, _, err := vm.Declare(ctx, name, reqresp(""), DeclareOptions{}); err != nil {
			t.Fatalf("loss %d: declare on %s: %v", k, victim, err)
		}
		// Every node has the declaration before the loss.
		testutil.WaitForf(t, 30*time.Second, func() bool {
			for _, m := range c.running() {
				if ex, ok := m.Exchange(name); !ok || ex.Home != victim {
					return false
				}
			}
			return true
		}, "loss %d: %s known everywhere", k, name)
		kill := k%2 == 0
		wasLeader := lead.NodeID() == victim
		start := time.Now()
		if kill {
			c.kill(victim)
		} else {
			c.tn.cut(victim)
		}
		testutil.WaitForf(t, 60*time.Second, func() bool {
			for _, m := range c.running() {
				if m.NodeID() == victim {
					continue
				}
				if ex, ok := m.Exchange(name); ok && ex.Home != victim {
					return true
				}
			}
			return false
		}, "loss %d: %s re-homed off %s", k, name, victim)
		d := time.Since(start)
		how := map[bool]string{true: "kill", false: "cut"}[kill]
		after := "none"
		if l := c.leader(); l != nil {
			after = l.NodeID()
		}
		t.Logf("loss %d: %s of %s (metadata leader: %v): re-homed after %v; metadata leader %s, then %s",
			k, how, victim, wasLeader, d.Round(time.Millisecond), lead.NodeID(), after)
		if wasLeader {
			leader = append(leader, d)
		} else {
			follower = append(follower, d)
		}
		if kill {
			c.start(victim, 3)
		} else {
			c.tn.heal(victim)
		}
	}
	t.Logf("seed %d: home lost, metadata leader survived: %s", seed, timings(follower))
	t.Logf("seed %d: home lost with the metadata leader:    %s", seed, timings(leader))
}

// timings formats the count, p50, p99 and max of ds.
func timings(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return fmt.Sprintf("n=%d p50 %v p99 %v max %v", len(s), at(0.5).Round(time.Millisecond), at(0.99).Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}
