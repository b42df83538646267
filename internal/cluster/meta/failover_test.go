package meta

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
	bolt "go.etcd.io/bbolt"
)

// TestLeaderKillElectsNewLeader kills the leader (Shutdown without
// leaving, its listeners closed) twice over a 5-node cluster: each
// time the others elect a new leader. The target is 2 s; the test allows
// 6 s for the loaded machine and logs the figure. Writes go on from
// every survivor.
func TestLeaderKillElectsNewLeader(t *testing.T) {
	c := newCluster(t, 5, nil)
	ctx := testutil.Context(t, 120*time.Second)
	for round := range 2 {
		old := c.waitLeader(10 * time.Second)
		// Every node knows the leader before the kill.
		testutil.WaitFor(t, 10*time.Second, func() bool {
			for _, m := range c.running() {
				if m.Leader() != old.NodeID() {
					return false
				}
			}
			return true
		})
		killed := time.Now()
		c.kill(old.NodeID())
		var lead *Meta
		testutil.WaitForf(t, 6*time.Second, func() bool { lead = c.leader(); return lead != nil }, "a new leader after killing %s", old.NodeID())
		t.Logf("round %d: killed leader %s; %s leads %v later", round, old.NodeID(), lead.NodeID(), time.Since(killed).Round(time.Millisecond))
		for _, m := range c.running() {
			name := fmt.Sprintf("after-kill-%d-%s", round, m.NodeID())
			if _, _, err := m.Declare(ctx, name, reqresp(""), DeclareOptions{}); err != nil {
				t.Fatalf("round %d: declare on %s: %v", round, m.NodeID(), err)
			}
			if _, ok := m.Exchange(name); !ok {
				t.Fatalf("round %d: %s does not read its write", round, m.NodeID())
			}
		}
	}
}

// TestRestartRecovers restarts nodes from their directories: state from
// a snapshot plus the log after it comes back, on one node restarted
// alone and on the whole cluster restarted at once.
func TestRestartRecovers(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 120*time.Second)
	declare := func(m *Meta, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			if _, _, err := m.Declare(ctx, fmt.Sprintf("ex%03d", i), reqresp(""), DeclareOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	declare(c.follower(), 0, 20)
	// A snapshot on every node, then more entries after it.
	for _, m := range c.running() {
		if err := m.raft.Snapshot().Error(); err != nil {
			t.Fatalf("snapshot on %s: %v", m.NodeID(), err)
		}
	}
	declare(c.leader(), 20, 30)
	if err := c.waitLeader(10*time.Second).Delete(ctx, "ex005"); err != nil {
		t.Fatal(err)
	}
	want := c.waitLeader(10 * time.Second).State().Exchanges

	check := func(m *Meta) {
		t.Helper()
		testutil.WaitForf(t, 20*time.Second, func() bool {
			got := m.State().Exchanges
			if len(got) != len(want) {
				return false
			}
			for k, v := range want {
				if got[k] != v {
					return false
				}
			}
			return true
		}, "%s recovers %d exchanges (has %d)", m.NodeID(), len(want), len(m.State().Exchanges))
	}
	f := c.follower()
	id := f.NodeID()
	c.kill(id)
	check(c.start(id, 3))

	for _, id := range c.ids {
		c.kill(id)
	}
	for _, id := range c.ids {
		c.start(id, 3)
	}
	c.waitLeader(20 * time.Second)
	for _, m := range c.running() {
		check(m)
	}
	for _, m := range c.running() {
		if _, _, err := m.Declare(ctx, "after-restart-"+m.NodeID(), reqresp(""), DeclareOptions{}); err != nil {
			t.Fatalf("write after restart on %s: %v", m.NodeID(), err)
		}
	}
}

// TestCorruptLogRefusesToStart: a node whose log file holds a corrupted
// entry does not start on it; it says so.
func TestCorruptLogRefusesToStart(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 30*time.Second)
	f := c.follower()
	if _, _, err := f.Declare(ctx, "x", reqresp(""), DeclareOptions{}); err != nil {
		t.Fatal(err)
	}
	id := f.NodeID()
	c.kill(id)
	s, err := openBoltStore(c.base + "/" + id + "/raft.db")
	if err != nil {
		t.Fatal(err)
	}
	last, _ := s.LastIndex()
	s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLogs).Put(key(last), []byte("not an entry"))
	})
	s.Close()
	rl, fl := c.tn.listen(t, id)
	_, err = New(Config{NodeID: id, Dir: c.base + "/" + id, Advertise: rl.Addr().String(), Stream: rl, Forward: fl, Log: testLogger()})
	if err == nil || !strings.Contains(err.Error(), "corrupt log entry") {
		t.Fatalf("start on a corrupted log: %v", err)
	}
	rl.Close()
	fl.Close()
}

// TestCatalogAcrossLeaderKill: declares and deletes made on followers
// while the leader is killed all return their true outcome, none an
// error: a command whose outcome the kill left unknown is retried on the
// new leader in its client session, and applied once. Each declare of a
// new name says it created it, each delete finds what its declare made.
func TestCatalogAcrossLeaderKill(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 120*time.Second)
	old := c.waitLeader(10 * time.Second)
	var followers []*Meta
	for _, m := range c.running() {
		if m != old {
			followers = append(followers, m)
		}
	}
	const workers = 12
	var (
		mu    sync.Mutex
		done  int
		errs  []error
		stop  = make(chan struct{})
		wg    sync.WaitGroup
		names []string
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := followers[w%len(followers)]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("k%d.%d", w, i)
				_, created, err := m.Declare(ctx, name, reqresp(""), DeclareOptions{})
				if err == nil && !created {
					err = fmt.Errorf("declare %s: not created", name)
				}
				if err == nil && i%2 == 1 {
					if err = m.Delete(ctx, name); err != nil {
						err = fmt.Errorf("delete %s: %w", name, err)
					}
				} else if err == nil {
					mu.Lock()
					names = append(names, name)
					mu.Unlock()
				}
				mu.Lock()
				done++
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return done }
	testutil.WaitForf(t, 30*time.Second, func() bool { return count() >= 50 }, "50 operations before the kill")
	c.kill(old.NodeID())
	lead := c.waitLeader(20 * time.Second)
	after := count()
	testutil.WaitForf(t, 30*time.Second, func() bool { return count() >= after+50 }, "50 operations after %s leads", lead.NodeID())
	close(stop)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	st := lead.State()
	for _, name := range names {
		if _, ok := st.Exchanges[name]; !ok {
			t.Errorf("%s was declared and is not there", name)
		}
	}
	for name := range st.Exchanges {
		var w, i int
		if _, err := fmt.Sscanf(name, "k%d.%d", &w, &i); err == nil && i%2 == 1 {
			t.Errorf("%s was deleted and is there", name)
		}
	}
	t.Logf("%d operations, %d before the kill", count(), after)
}

// TestHandOver: the leader hands the group's leadership over to another
// node and no longer leads when HandOver returns; another node leads and
// takes declares. On a follower HandOver does nothing.
func TestHandOver(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := testutil.Context(t, 60*time.Second)
	old := c.waitLeader(10 * time.Second)
	for _, m := range c.running() {
		if m != old {
			if err := m.HandOver(ctx); err != nil {
				t.Fatalf("HandOver on the follower %s: %v", m.NodeID(), err)
			}
		}
	}
	if err := old.HandOver(ctx); err != nil {
		t.Fatalf("HandOver on the leader %s: %v", old.NodeID(), err)
	}
	if old.IsLeader() {
		t.Fatalf("%s still leads after HandOver", old.NodeID())
	}
	var lead *Meta
	testutil.WaitForf(t, 10*time.Second, func() bool { lead = c.leader(); return lead != nil && lead != old }, "a leader other than %s", old.NodeID())
	if _, _, err := old.Declare(ctx, "after-handover", reqresp(""), DeclareOptions{}); err != nil {
		t.Fatalf("declare on %s after its hand-over: %v", old.NodeID(), err)
	}
}
