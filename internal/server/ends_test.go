package server_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

func httpBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestConnEndsCounted: a client cut for silence and one that closes its
// socket without CLOSE are counted in /metrics and /api/nodes, so that an
// operator sees the subscribers that lost messages that way; a client
// that says CLOSE is not.
func TestConnEndsCounted(t *testing.T) {
	n, err := node.Start(node.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", Heartbeat: 5 * time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })

	silent := dialRaw(t, n)
	silent.helloAsking(100 * time.Millisecond)
	silent.expectFatal(wire.CodeHeartbeat)

	gone := dialRaw(t, n)
	gone.hello()
	gone.nc.Close()

	polite := dialRaw(t, n)
	polite.hello()
	polite.send(&wire.Frame{Type: wire.TypeClose, Tag: "bye"})
	if f := polite.next(); f != nil {
		t.Fatalf("want the end after CLOSE, got %+v", f)
	}

	want := []string{
		`courier_connections_ended_total{reason="heartbeat"} 1`,
		`courier_connections_ended_total{reason="slow_consumer"} 0`,
		`courier_connections_ended_total{reason="vanished"} 1`,
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := httpBody(t, n.HTTPURL()+"/metrics")
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(m, w)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q:\n%s", want, m)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var nodes []struct {
		Ended struct {
			Heartbeat    uint64 `json:"heartbeat"`
			SlowConsumer uint64 `json:"slow_consumer"`
			Vanished     uint64 `json:"vanished"`
		} `json:"connections_ended"`
	}
	if err := json.Unmarshal([]byte(httpBody(t, n.HTTPURL()+"/api/nodes")), &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].Ended.Heartbeat != 1 || nodes[0].Ended.Vanished != 1 || nodes[0].Ended.SlowConsumer != 0 {
		t.Fatalf("/api/nodes connections_ended = %+v, want heartbeat 1, vanished 1", nodes)
	}
}
