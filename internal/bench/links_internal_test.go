package bench

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeNodes serves GET /api/nodes in the shape of RabbitMQ's: node n1
// with links to n2 and n3 whose message counters move by one per
// publication, and a heartbeat counter that moves by itself.
func fakeNodes(t *testing.T, published, beats *atomic.Int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/nodes" {
			http.NotFound(w, r)
			return
		}
		if u, p, ok := r.BasicAuth(); ok && (u != "admin" || p != "pw") {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		b := beats.Add(1)
		p := published.Load()
		fmt.Fprintf(w, `[{"name":"n1","uptime":%d,"exchanges":3,"cluster_links":[
			{"name":"n2","send_msgs":%d,"heartbeats":%d,"state":"up"},
			{"name":"n3","send_msgs":%d,"heartbeats":%d}]}]`, b*100, 10+p, b, 20+p, b)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestMeasureLinks(t *testing.T) {
	var published, beats atomic.Int64
	srv := fakeNodes(t, &published, &beats)
	rep, err := measureLinks(context.Background(), []string{srv.URL}, 10*time.Millisecond, 4, func() error {
		published.Add(4)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]LinkCounter{}
	for _, c := range rep.Counters {
		got[c.Path] = c
	}
	for path, want := range map[string][2]float64{
		"n1.cluster_links[n2].send_msgs":  {4, 0},
		"n1.cluster_links[n3].send_msgs":  {4, 0},
		"n1.cluster_links[n2].heartbeats": {1, 1},
	} {
		c, ok := got[path]
		if !ok || c.Delta != want[0] || c.Idle != want[1] {
			t.Errorf("%s: %+v, want delta %v, idle %v", path, c, want[0], want[1])
		}
	}
	if _, ok := got["n1.uptime"]; ok {
		t.Errorf("uptime taken for a link counter")
	}
	if rep.Found != 4 || len(rep.Notes) != 0 {
		t.Errorf("found %d link fields, notes %q; want 4, none", rep.Found, rep.Notes)
	}
	text := strings.Join(rep.Lines(), "\n")
	if !strings.Contains(text, "n1.cluster_links[n2].send_msgs  +4  (idle +0)") ||
		!strings.Contains(text, "over 4 publications") || !strings.Contains(text, "4 link fields, 2 moved beyond heartbeats") ||
		strings.Contains(text, "].heartbeats") || !strings.Contains(text, "by node: n1 +2") {
		t.Errorf("lines:\n%s", text)
	}
}

func TestReadNodes(t *testing.T) {
	var published, beats atomic.Int64
	srv := fakeNodes(t, &published, &beats)
	withAuth := strings.Replace(srv.URL, "http://", "http://admin:pw@", 1)
	if _, _, err := readNodes(context.Background(), withAuth); err != nil {
		t.Errorf("with credentials: %v", err)
	}
	bad := strings.Replace(srv.URL, "http://", "http://admin:nope@", 1)
	if _, _, err := readNodes(context.Background(), bad); err == nil || strings.Contains(err.Error(), "nope") {
		t.Errorf("bad credentials: %v (the error must not show the password)", err)
	}
	// A node that is not there, or answers something else, is a note.
	rep, err := measureLinks(context.Background(), []string{"http://127.0.0.1:1", srv.URL + "/x"}, time.Millisecond, 1, func() error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Notes) != 2 || rep.Found != 0 {
		t.Errorf("notes %q, found %d", rep.Notes, rep.Found)
	}
}

func TestFlattenJSON(t *testing.T) {
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("["))
		chunk := []byte(strings.Repeat(" ", 1<<20))
		for range maxNodesDoc>>20 + 1 {
			w.Write(chunk)
		}
	}))
	defer big.Close()
	if _, _, err := readNodes(context.Background(), big.URL); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("an oversized document: %v", err)
	}
	deep := strings.Repeat("[", 100) + "1" + strings.Repeat("]", 100)
	m, err := flattenJSON([]byte(deep))
	if err != nil || len(m) != 0 {
		t.Errorf("a deep document: %v, %v", m, err)
	}
	m, err = flattenJSON([]byte(`[{"name":"a","links":[{"peer":"b","n":2},{"x":1}]}]`))
	if err != nil || m["a.links[b].n"] != 2 || m["a.links[1].x"] != 1 {
		t.Errorf("flatten: %v, %v", m, err)
	}
	for path, want := range map[string]bool{"n1.cluster_links[n2].send_bytes": true, "n1.routes[0].out_msgs": true, "n1.peers": true, "n1.exchanges": false,
		"n1.links[n2].rtt_ms": false, "n1.links[n2].since": false, "n1.routes[0].latency_us": false} {
		if isLinkPath(path) != want {
			t.Errorf("isLinkPath(%q) = %v", path, !want)
		}
	}
}

// The shape of the fabric branch's /api/nodes: a row per node, each
// with this node's links to it (the own row: to every other node), and
// control and data counters apart. Only the own row counts.
func TestLinkCopies(t *testing.T) {
	doc := func(data, control int) string {
		return fmt.Sprintf(`[{"name":"n1","http_url":"http://127.0.0.1:7481","links":[
			{"peer":"n2","up":true,"rtt_ms":0.2,"control":{"frames_out":%d,"bytes_out":%d},"data":{"frames_out":%d,"frames_in":0,"bytes_out":%d}},
			{"peer":"n3","up":true,"rtt_ms":0.3,"control":{"frames_out":%d},"data":{"frames_out":%d}}]},
			{"name":"n2","http_url":"http://127.0.0.1:7482","links":[{"peer":"n2","control":{"frames_out":%d},"data":{"frames_out":%d}}]}]`,
			control, control*40, data, data*200, control, data, control, data)
	}
	// Over 10 publications: data +13 (10 copies, 3 heartbeats), control
	// +3 (the same heartbeats); idle: data +2, control +2. The control
	// link's move, not the idle window's, is the data link's heartbeats.
	reads := []string{doc(100, 50), doc(113, 53), doc(115, 55)}
	rep := &LinkReport{Publications: 10}
	var snaps []map[string]float64
	var self string
	for _, d := range reads {
		m, s, err := parseNodes([]byte(d), "127.0.0.1:7481")
		if err != nil {
			t.Fatal(err)
		}
		snaps, self = append(snaps, m), s
	}
	if self != "n1" {
		t.Fatalf("own row %q, want n1", self)
	}
	// Two management URLs of one node: a field is counted once.
	rep.add("http://a", self, snaps[0], snaps[1], snaps[2])
	rep.add("http://b", self, snaps[0], snaps[1], snaps[2])
	for _, c := range rep.Counters {
		if strings.HasPrefix(c.Path, "n2.") {
			t.Errorf("another node's row counted: %s", c.Path)
		}
	}
	copies := rep.Copies()
	if len(copies) != 1 || copies["n1"] != 2 {
		t.Errorf("copies %v, want n1: 2 (one per peer and publication, control links left out)", copies)
	}
	text := strings.Join(rep.Lines(), "\n")
	if !strings.Contains(text, "by node: n1 +2") || !strings.Contains(text, "n1.links[n2].data.frames_out  +13  (heartbeats +3, idle +2)") ||
		!strings.Contains(text, "by link (those not 0): n1.links[n2].data.frames_out +1, n1.links[n3].data.frames_out +1") ||
		strings.Contains(text, "control.frames_out  +") || strings.Contains(text, "control.frames_out +") {
		t.Errorf("lines:\n%s", text)
	}
	for path, want := range map[string]bool{"n1.links[n2].data.frames_out": true, "n1.links[n2].control.frames_out": false,
		"n1.cluster_links[n2].send_msgs": true, "n1.links[n2].data.bytes_out": false, "n1.frames_out": false} {
		if isCopyPath(path) != want {
			t.Errorf("isCopyPath(%q) = %v", path, !want)
		}
	}
}
