package broker

import (
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/courier-mq/courier/wire"
)

func TestValidNodeName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"n1", true},
		{"web-01_a", true},
		{"9lives", true},
		{strings.Repeat("a", MaxNodeName), true},
		{strings.Repeat("a", MaxNodeName+1), false},
		{"", false},
		{"-n1", false},
		{"_n1", false},
		{"n.1", false},
		{"n/1", false},
		{"rabbit@host", false},
		{"n 1", false},
		{"n:1", false},
		{"nœud", false},
	} {
		if got := ValidNodeName(tc.name); got != tc.ok {
			t.Errorf("ValidNodeName(%q) = %v, want %v", tc.name, got, tc.ok)
		}
	}
}

func TestNodeNameFrom(t *testing.T) {
	for _, tc := range []struct{ host, want string }{
		{"web1", "web1-3fa2"},
		{"Web1.example.com", "web1-3fa2"},
		{"my host+box", "my-host-box-3fa2"},
		{"", "node-3fa2"},
		{"...", "node-3fa2"},
		{"-_x_-", "x-3fa2"},
		{strings.Repeat("h", 100), strings.Repeat("h", MaxNodeName-5) + "-3fa2"},
	} {
		got := nodeNameFrom(tc.host, "3fa2")
		if got != tc.want || !ValidNodeName(got) {
			t.Errorf("nodeNameFrom(%q) = %q (valid %v), want %q", tc.host, got, ValidNodeName(got), tc.want)
		}
	}
	if a, b := NewNodeName(), NewNodeName(); !ValidNodeName(a) || a == b && NewNodeName() == a {
		t.Errorf("NewNodeName gave %q and %q", a, b)
	}
}

func TestConnIDs(t *testing.T) {
	for _, tc := range []struct {
		node        string
		boot, n     uint64
		want, want2 string
	}{
		{"n1", 0, 7, "n1/c7", "n1"},
		{"n1", 1, 7, "n1/c7", "n1"},
		{"web-3fa2", 3, 12, "web-3fa2/c3-12", "web-3fa2"},
	} {
		id := connID(tc.node, tc.boot, tc.n)
		if id != tc.want {
			t.Errorf("connID(%q, %d, %d) = %q, want %q", tc.node, tc.boot, tc.n, id, tc.want)
		}
		node, n, ok := parseConnID(id)
		if !ok || node != tc.node || n != tc.n {
			t.Errorf("parseConnID(%q) = %q, %d, %v", id, node, n, ok)
		}
		if got := NodeOf(id + ".2"); got != tc.want2 {
			t.Errorf("NodeOf(%q) = %q, want %q", id+".2", got, tc.want2)
		}
	}
	for _, bad := range []string{"c7", "n1/7", "n1/c", "n1/cx", "n.1/c7", "/c7", "n1/c3-", "n1/c-7x", "n1/c07", "n1/c0", "n1/cx-7", "n1/c1-7", "n1/c+7", "n1/c3-07"} {
		if _, _, ok := parseConnID(bad); ok {
			t.Errorf("parseConnID(%q) accepted it", bad)
		}
	}
	if NodeOf("c7.2") != "" || NodeOf("a.b/c7") != "" {
		t.Error("NodeOf found a node in an id without one")
	}
}

// eventSink keeps copies of the frames delivered to it.
type eventSink struct {
	mu     sync.Mutex
	frames []wire.Frame
}

func (s *eventSink) Deliver(f *wire.Frame) {
	s.mu.Lock()
	s.frames = append(s.frames, wire.Frame{Type: f.Type, Attach: f.Attach, Aux: f.Aux, Name: f.Name, Body: append([]byte(nil), f.Body...)})
	s.mu.Unlock()
	f.Release()
}

func (s *eventSink) requests() []wire.Frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []wire.Frame
	for _, f := range s.frames {
		if f.Type == wire.TypeRequest {
			out = append(out, f)
		}
	}
	return out
}

func (s *eventSink) reset() {
	s.mu.Lock()
	s.frames = nil
	s.mu.Unlock()
}

func (s *eventSink) events(kind uint64) []wire.Frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []wire.Frame
	for _, f := range s.frames {
		if f.Type == wire.TypeEvent && f.Aux == kind {
			out = append(out, f)
		}
	}
	return out
}

// TestIDsCarryTheNodeAndBoot: connection and member ids, those of
// leader and member-up events included, name the node, and from its
// second start the boot; SessionByID finds a session by them.
func TestIDsCarryTheNodeAndBoot(t *testing.T) {
	for _, tc := range []struct {
		boot   uint64
		prefix string
	}{{1, "n7/c"}, {4, "n7/c4-"}} {
		b := New(Config{Node: "n7", Boot: tc.boot, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: Leader})
		b.Open(dropSink{}, "admin").Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "jobs", Body: cfg})
		var first, second eventSink
		s1, s2 := b.Open(&first, "a"), b.Open(&second, "b")
		for _, s := range []*Session{s1, s2} {
			if !strings.HasPrefix(s.ID(), tc.prefix) {
				t.Errorf("boot %d: session id %q, want prefix %q", tc.boot, s.ID(), tc.prefix)
			}
			if got := b.SessionByID(s.ID()); got != s {
				t.Errorf("SessionByID(%q) = %v", s.ID(), got)
			}
			s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 2, Attach: 3, Name: "jobs", Aux: wire.RoleHandler})
		}
		ups := first.events(wire.EventMemberUp)
		if len(ups) != 1 {
			t.Fatalf("boot %d: member-up events %d, want 1", tc.boot, len(ups))
		}
		var ev wire.EventBody
		if err := json.Unmarshal(ups[0].Body, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Leader != s1.ID()+".3" || ev.Member == nil || ev.Member.ID != s2.ID()+".3" || NodeOf(ev.Member.ID) != "n7" {
			t.Errorf("boot %d: member-up %s, want leader %s.3 and member %s.3", tc.boot, ups[0].Body, s1.ID(), s2.ID())
		}
		if b.SessionByID("n8"+strings.TrimPrefix(s1.ID(), "n7")) != nil {
			t.Error("SessionByID found a session under another node's name")
		}
		if other := connID("n7", tc.boot+1, s1.Number()); b.SessionByID(other) != nil {
			t.Errorf("SessionByID(%q) found a session of another start", other)
		}
		b.Close()
	}
}

// FuzzParseConnID: ids come from URLs and frames; parsing any string
// neither panics nor accepts what it would not give out.
func FuzzParseConnID(f *testing.F) {
	for _, id := range []string{"n1/c7", "web-3fa2/c3-12", "c7", "n1/c", "n.1/c7", "n1/c-", "n1/c1-2-3", "/c1"} {
		f.Add(id)
	}
	f.Fuzz(func(t *testing.T, id string) {
		node, n, ok := parseConnID(id)
		if !ok {
			return
		}
		if !ValidNodeName(node) || NodeOf(id) != node {
			t.Fatalf("parseConnID(%q) = %q, %d: node invalid or not NodeOf's %q", id, node, n, NodeOf(id))
		}
		_, rest, _ := strings.Cut(id, "/c")
		boot := uint64(1)
		if b, _, qualified := strings.Cut(rest, "-"); qualified {
			boot, _ = strconv.ParseUint(b, 10, 64)
		}
		if again := connID(node, boot, n); again != id {
			t.Fatalf("parseConnID(%q) = %q, %d, which connID writes %q", id, node, n, again)
		}
	})
}
