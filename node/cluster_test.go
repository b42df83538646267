package node

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/cluster"
)

var clusterSecret = []byte("a cluster secret of 32 bytes!!!!")

func startClusterNode(t *testing.T, name string, join ...string) *Node {
	t.Helper()
	n, err := Start(Config{
		Name: name, DataDir: t.TempDir(), Log: testLog(),
		Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0",
		Cluster: ClusterConfig{Listen: "127.0.0.1:0", Join: join, Secret: clusterSecret},
	})
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// apiNode is a row of /api/nodes, as its JSON reads.
type apiNode struct {
	Name           string `json:"name"`
	Type           string `json:"type"`
	Running        bool   `json:"running"`
	Uptime         int64  `json:"uptime"`
	State          string `json:"state"`
	ClusterAddress string `json:"cluster_address"`
	ClientURL      string `json:"client_url"`
	HTTPURL        string `json:"http_url"`
	MetaLeader     bool   `json:"meta_leader"`
	Connections    int    `json:"connections"`
	Exchanges      int    `json:"exchanges"`
	Links          []struct {
		Peer  string  `json:"peer"`
		Up    bool    `json:"up"`
		RTT   float64 `json:"rtt_ms"`
		Data  struct{ FramesOut, BytesOut uint64 }
		Ctrl  map[string]uint64 `json:"control"`
		Since int64             `json:"since"`
	} `json:"links"`
}

func getNodes(t *testing.T, n *Node) []apiNode {
	t.Helper()
	resp, err := http.Get(n.HTTPURL() + "/api/nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []apiNode
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClusterNodes: three embedded nodes of one cluster each list the
// three in /api/nodes, with their URLs and links.
func TestClusterNodes(t *testing.T) {
	a := startClusterNode(t, "a")
	b := startClusterNode(t, "b", a.ClusterAddr())
	c := startClusterNode(t, "c", a.ClusterAddr())
	// c hosts something, and gossips it.
	conn := c.Connect()
	defer conn.Close()
	nodes := []*Node{a, b, c}
	for _, n := range nodes {
		waitUntil(t, 20*time.Second, n.Name()+" lists a, b and c alive with links up", func() bool {
			rows := getNodes(t, n)
			if len(rows) != 3 {
				return false
			}
			for _, r := range rows {
				if r.State != "alive" || !r.Running || r.Type != "disc" {
					return false
				}
				if r.Name == n.Name() {
					if len(r.Links) != 2 {
						return false
					}
					continue
				}
				if len(r.Links) != 1 || !r.Links[0].Up || r.Links[0].Peer != r.Name {
					return false
				}
			}
			return true
		})
	}
	rows := getNodes(t, b)
	for i, r := range rows {
		want := nodes[i]
		if r.Name != want.Name() || r.ClusterAddress != want.ClusterAddr() || r.ClientURL != want.URL() || r.HTTPURL != want.HTTPURL() {
			t.Errorf("row %d: %+v, want node %s at %s, %s, %s", i, r, want.Name(), want.ClusterAddr(), want.URL(), want.HTTPURL())
		}
		if r.Uptime <= 0 {
			t.Errorf("row %s: uptime %d", r.Name, r.Uptime)
		}
	}
	ok := false
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && !ok; time.Sleep(50 * time.Millisecond) {
		ok = getNodes(t, b)[2].Connections == 1
	}
	if !ok {
		t.Fatalf("b does not see c's connection: b sees %+v; c sees itself %+v", getNodes(t, b)[2], getNodes(t, c)[2])
	}
	resp, err := http.Get(b.HTTPURL() + "/api/nodes/c")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/api/nodes/c on b: %s", resp.Status)
	}
}

// TestSingleNodeUnchanged: without a cluster address nothing of the
// cluster runs, and /api/nodes lists the node alone.
func TestSingleNodeUnchanged(t *testing.T) {
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, HTTP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Fabric() != nil || n.ClusterAddr() != "" {
		t.Fatal("a fabric runs on a single node")
	}
	rows := getNodes(t, n)
	if len(rows) != 1 || rows[0].State != "alive" || rows[0].ClusterAddress != "" || len(rows[0].Links) != 0 {
		t.Errorf("single node: %+v", rows)
	}
}

func TestClusterRefusedWithoutSecret(t *testing.T) {
	_, err := Start(Config{DataDir: t.TempDir(), Log: quiet, Cluster: ClusterConfig{Listen: "0.0.0.0:0"}})
	if !errors.Is(err, cluster.ErrInsecure) {
		t.Fatalf("a cluster address beyond loopback without a secret: %v, want ErrInsecure", err)
	}
	if !strings.Contains(err.Error(), "--cluster-secret-file") {
		t.Errorf("the refusal does not say the remedy: %v", err)
	}
	// A secret file readable by others is refused.
	f := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(f, clusterSecret, 0o644)
	_, err = Start(Config{DataDir: t.TempDir(), Log: quiet, Cluster: ClusterConfig{Listen: "127.0.0.1:0", SecretFile: f}})
	if err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Errorf("a secret file of mode 644: %v", err)
	}
	if _, err := Start(Config{DataDir: t.TempDir(), Log: quiet, Cluster: ClusterConfig{Join: []string{"127.0.0.1:1"}}}); err == nil {
		t.Error("join without a cluster address was accepted")
	}
}

func testLog() *slog.Logger {
	if os.Getenv("COURIER_TEST_LOG") != "" {
		return slog.Default()
	}
	return quiet
}
