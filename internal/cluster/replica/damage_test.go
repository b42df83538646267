package replica

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
)

// damagedCluster builds a 3-host cluster whose logs span many segments,
// commits entries, crashes a follower, lets damage(fs) harm its disk
// and restarts it. It returns the cluster, the damaged host, and the
// committed entries.
func damagedCluster(t *testing.T, damage func(fs *store.MemFS)) (*testCluster, uint64, []string) {
	t.Helper()
	c, bad, want := crashedFollower(t, damage)
	c.restart(bad)
	return c, bad, want
}

// crashedFollower is damagedCluster without the restart: the follower
// stays down, its disk damaged.
func crashedFollower(t *testing.T, damage func(fs *store.MemFS)) (*testCluster, uint64, []string) {
	t.Helper()
	cfg := testConfig()
	cfg.Store.SegmentSize = store.MinSegmentSize
	c := newTestCluster(t, 3, cfg)
	want := make([]string, 150)
	for i := range want {
		want[i] = fmt.Sprintf("%03d-%s", i, strings.Repeat("x", 100))
		c.propose(want[i])
	}
	c.converge(want)
	lead := c.leader()
	var bad uint64
	for _, id := range c.ids {
		if id != lead {
			bad = id
			break
		}
	}
	c.crash(bad)
	damage(c.fss[bad])
	return c, bad, want
}

// flipSealedByte flips a byte in the middle of a sealed segment of fs.
func flipSealedByte(t *testing.T, fs *store.MemFS) {
	t.Helper()
	seg := segFiles(t, fs)[1]
	b, err := fs.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xFF
	fs.WriteFile(seg, b)
}

// checkRefusesVote checks that a damaged replica never helps elect a
// leader: the leader removes it and adds it back as a learner, which
// gets the log back; with the leader then gone, the learner and the one
// healthy voter elect nobody. Once the old leader is back, the learner
// is promoted again and the group goes on with three voters.
func checkRefusesVote(t *testing.T, c *testCluster, bad uint64, want []string) {
	t.Helper()
	if d := c.groups[bad].OpenDamage(); d == "" {
		t.Fatal("the damaged replica recovered as healthy")
	} else {
		t.Logf("damaged: %s", d)
	}
	lead := c.leader()
	testutil.WaitForf(t, wait, func() bool {
		st, err := c.groups[lead].Status()
		return err == nil && slices.Equal(st.Learners, []uint64{bad}) && !slices.Contains(st.Voters, bad)
	}, "the leader makes replica %d a learner", bad)
	c.converge(want) // the learner gets the log back from the leader
	if d := c.groups[bad].Damaged(); d != "" {
		t.Fatalf("the re-added learner is still damaged: %s", d)
	}
	lead = c.leader()
	c.crash(lead)
	// The healthy survivor needs a second voter, and the learner does not
	// vote. No leader in 3 s, 7 to 15 election timeouts of 200 to 400 ms
	// (a negative check: it cannot fail by slowness, only by a bug).
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for id, g := range c.groups {
			st, err := g.Status()
			if err == nil && st.Role == "leader" {
				t.Fatalf("replica %d was elected with the learner's vote", id)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.restart(lead)
	lead = c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// A leader just elected refuses changes until it applied its log.
	testutil.WaitForf(t, wait, func() bool {
		err := c.groups[lead].AddVoter(ctx, bad)
		if err != nil && !errors.Is(err, ErrConfChangePending) {
			t.Fatal(err)
		}
		return err == nil
	}, "replica %d promoted", bad)
	c.propose("after")
	c.converge(append(want, "after"))
}

func segFiles(t *testing.T, fs *store.MemFS) []string {
	t.Helper()
	names, err := fs.List("/data")
	if err != nil {
		t.Fatal(err)
	}
	var segs []string
	for _, n := range names {
		if strings.HasSuffix(n, ".seg") {
			segs = append(segs, "/data/"+n)
		}
	}
	if len(segs) < 3 {
		t.Fatalf("want several segments, have %v", names)
	}
	slices.Sort(segs) // in log order: names are hex numbers of one width
	return segs
}

func TestCorruptStoreRefusesVote(t *testing.T) {
	c, bad, want := damagedCluster(t, func(fs *store.MemFS) { flipSealedByte(t, fs) })
	checkRefusesVote(t, c, bad, want)
}

func TestTruncatedStoreRefusesVote(t *testing.T) {
	c, bad, want := damagedCluster(t, func(fs *store.MemFS) {
		seg := segFiles(t, fs)[1]
		b, err := fs.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		fs.WriteFile(seg, b[:len(b)/2]) // a sealed segment loses its second half
	})
	checkRefusesVote(t, c, bad, want)
}

// TestTruncatedTailDetectedByLeader: a follower loses the tail of its
// last segment, records it had fsynced and acknowledged. Its store
// cannot tell that from a torn write, so it opens undamaged; the leader
// sees it reject appends below what it acknowledged, and makes it
// rejoin as a learner, which gets the log back.
func TestTruncatedTailDetectedByLeader(t *testing.T) {
	c, bad, want := damagedCluster(t, func(fs *store.MemFS) {
		segs := segFiles(t, fs)
		last := segs[len(segs)-1]
		b, err := fs.ReadFile(last)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 2000 {
			// The tail segment is short: it goes, and the one before is cut.
			if err := fs.Remove(last); err != nil {
				t.Fatal(err)
			}
			last = segs[len(segs)-2]
			if b, err = fs.ReadFile(last); err != nil {
				t.Fatal(err)
			}
		}
		fs.WriteFile(last, b[:len(b)/2])
	})
	if d := c.groups[bad].OpenDamage(); d != "" {
		t.Logf("opened damaged anyway: %s", d)
	}
	// The next append shows the loss (a heartbeat alone does not: the
	// leader believes the follower has everything).
	c.propose("after")
	want = append(want, "after")
	lead := c.leader()
	testutil.WaitForf(t, wait, func() bool {
		st, err := c.groups[lead].Status()
		return err == nil && slices.Contains(st.Learners, bad)
	}, "the leader makes replica %d a learner", bad)
	c.converge(want)
}

// TestDamagedReplicaUnheard: a damaged replica whose leader's heartbeats
// are lost when it comes back (here one way: from the leader to it) lets
// the leader fall quiet again, caught up as it was before the crash; the
// replica then announces its damage itself, as no heartbeat comes for it
// to answer, and the leader makes it a learner. Without the announcement
// the leader stayed quiet for ever (TestReplicatedQueueLearnerPromoted,
// one run in about 17, as a restarted node's links came up).
func TestDamagedReplicaUnheard(t *testing.T) {
	c, bad, _ := crashedFollower(t, func(fs *store.MemFS) { flipSealedByte(t, fs) })
	lead := c.leader()
	lh := c.hosts[lead]
	testutil.WaitForf(t, wait, func() bool { s := lh.QuietStats(); return s.Down == 1 && s.Awake == 0 }, "host %d down, the leader quiet", bad)
	before := lh.QuietStats().Wakeups
	c.net.CutFrom(lead, bad)
	c.start(bad, nil)
	if d := c.groups[bad].OpenDamage(); d == "" {
		t.Fatal("the damaged replica recovered as healthy")
	}
	learner := func() bool {
		st, err := c.groups[lead].Status()
		return err == nil && slices.Equal(st.Learners, []uint64{bad}) && !slices.Contains(st.Voters, bad)
	}
	var last QuietStats
	defer func() { t.Logf("leader host: %+v", last) }()
	testutil.WaitForf(t, wait, func() bool {
		s := lh.QuietStats()
		last = s
		return learner() || s.Down == 0 && s.Wakeups > before && s.Awake == 0
	}, "the leader hears host %d again and falls quiet, or makes it a learner", bad)
	c.net.Heal()
	testutil.WaitForf(t, wait, learner, "the leader makes the unheard damaged replica %d a learner", bad)
}
