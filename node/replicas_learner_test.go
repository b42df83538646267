package node

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/courier-mq/courier"
)

// TestReplicatedQueueLearnerPromoted: a replica whose log lost data (a
// byte flipped in its store while its node was down) rejoins as a
// learner and does not vote; the listing shows it as a learner, and
// `add-member` on its node makes it a voter again once it caught up.
func TestReplicatedQueueLearnerPromoted(t *testing.T) {
	nodes := startCluster3Live(t)
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	leader := func() *Node { return servingNode(t, nodes, "dmg") }
	c := nodes[0].Connect()
	defer c.Close()
	tk, err := declareTasks(ctx, t, c, "dmg")
	if err != nil {
		t.Fatal(err)
	}
	l := leader()
	var victim *Node
	for _, n := range nodes {
		if n != l && n != nodes[0] {
			victim = n
		}
	}
	body := make([]byte, 1024)
	for i := range 100 {
		if _, err := tk.Submit(ctx, courier.Task{Body: fmt.Appendf(body[:0:0], "%04d%s", i, body[4:])}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 30*time.Second, "the victim holds the 100", func() bool { return liveOn(victim, "dmg") == 100 })
	name, dir := victim.cfg.Name, victim.cfg.DataDir
	victim.Close()
	flipReplicaByte(t, filepath.Join(dir, replicaDirName))
	restarted, err := Start(Config{
		Name: name, DataDir: dir, Log: testLog(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0",
		Cluster: ClusterConfig{Listen: "127.0.0.1:0", Join: []string{l.ClusterAddr()}, Secret: clusterSecret},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restarted.Close() })
	nodes[slices.Index(nodes, victim)] = restarted
	waitUntil(t, 60*time.Second, "the damaged replica opens", func() bool { return restarted.replicas.group("dmg") != nil })
	if d := restarted.replicas.group("dmg").OpenDamage(); d == "" {
		t.Fatal("the flipped byte did not damage the replica")
	}
	id := replicaID(name)
	var last apiQueue
	defer func() {
		if t.Failed() {
			t.Logf("last listing: %+v", last)
			if g := restarted.replicas.group("dmg"); g != nil {
				st, err := g.Status()
				t.Logf("the restarted replica: %+v %v", st, err)
			}
		}
	}()
	waitUntil(t, 60*time.Second, "the leader makes it a learner, and the listing says so", func() bool {
		q := queueOn(t, nodes[0], "dmg")
		last = q
		for _, r := range q.Replicas {
			if r.Node == name {
				return r.Role == "learner" && !slices.Contains(q.Online, name)
			}
		}
		return false
	})
	var q apiQueue
	if code, body := apiCall(t, nodes[0], "POST", "/api/queues/dmg/members", map[string]string{"node": name}, &q); code != 200 {
		t.Fatalf("add-member on the learner's node: %d %s", code, body)
	}
	l = leader()
	waitUntil(t, 60*time.Second, "a voter again", func() bool {
		st, err := l.replicas.group("dmg").Status()
		return err == nil && slices.Contains(st.Voters, id) && settled(queueOn(t, restarted, "dmg"), l.cfg.Name, q.Members)
	})
	if n := liveOn(restarted, "dmg"); n != 100 {
		t.Fatalf("the promoted replica holds %d tasks, want 100", n)
	}
}

// flipReplicaByte flips a byte in the middle of a record's payload in
// the oldest segment of the replica log in dir that has records.
func flipReplicaByte(t *testing.T, dir string) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segment in %s: %v", dir, err)
	}
	slices.Sort(segs)
	for _, path := range segs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		// Records: crc u32, len u32, queue u32, kind u8, 3 zero bytes,
		// payload; after a 16-byte segment header (docs/storage-format.md).
		mid := int64(len(b) / 2)
		for off := int64(16); off+16 <= int64(len(b)); {
			n := int64(binary.LittleEndian.Uint32(b[off+4:]))
			if n > 64 && off+16+n > mid {
				b[off+16+n/2] ^= 0x40
				if err := os.WriteFile(path, b, 0o600); err != nil {
					t.Fatal(err)
				}
				return
			}
			if n == 0 {
				break
			}
			off += 16 + n
		}
	}
	t.Fatalf("no record to damage in %s", dir)
}
