package admin_test

import (
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// TestAlarms: the memory budget's alarm, the store's disk alarm and a
// failed component show in /api/overview's alarms, in /api/nodes and in
// courier_alarm{kind}, while they are on and not after.
func TestAlarms(t *testing.T) {
	mem := queue.NewMemory(64 << 20)
	b := broker.New(broker.Config{Log: quiet, Memory: mem})
	fs := store.NewMemFS()
	fs.SetFreeSpace(1 << 30)
	opts := store.DefaultOptions()
	opts.MinFreeDisk, opts.DiskCheckInterval = 8<<20, 5*time.Millisecond
	if _, err := b.OpenStore(broker.StoreConfig{Dir: "store", FS: fs, Options: &opts}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	var mu sync.Mutex
	comps := []admin.Component{{Name: "listener", State: "running", Critical: true}}
	h := serve(t, admin.Config{Broker: b, Log: quiet, SampleInterval: time.Hour, Components: func() []admin.Component {
		mu.Lock()
		defer mu.Unlock()
		return append([]admin.Component(nil), comps...)
	}})

	// alarms returns the kinds in /api/overview, checking that /metrics
	// and /api/nodes agree.
	alarms := func() []string {
		t.Helper()
		var o struct {
			Alarms []struct{ Kind, Resource, Message string } `json:"alarms"`
		}
		h.get("/api/overview?columns=alarms", &o)
		var kinds []string
		on := map[string]bool{}
		for _, a := range o.Alarms {
			kinds = append(kinds, a.Kind)
			on[a.Kind] = true
			if a.Message == "" || (a.Kind == admin.AlarmComponent) != (a.Resource != "") {
				t.Errorf("alarm %+v", a)
			}
		}
		_, _, body := h.do("GET", "/metrics", "")
		for _, kind := range []string{"memory", "disk", "store", "component"} {
			want := "0"
			if on[kind] {
				want = "1"
			}
			re := regexp.MustCompile(`(?m)^courier_alarm\{kind="` + kind + `"\} ` + want + `$`)
			if !re.Match(body) {
				t.Errorf("/metrics has no courier_alarm{kind=%q} %s", kind, want)
			}
		}
		var nodes []obj
		h.get("/api/nodes?columns=mem_alarm,disk_free_alarm,mem_budget_limit", &nodes)
		if len(nodes) != 1 || nodes[0]["mem_alarm"] != on["memory"] || nodes[0]["disk_free_alarm"] != on["disk"] {
			t.Errorf("nodes %v with alarms %v", nodes, kinds)
		}
		return kinds
	}
	if k := alarms(); len(k) != 0 {
		t.Fatalf("alarms at start: %v", k)
	}

	// Memory: 64 messages of 16 KiB in a transient queue, then a budget
	// they fill.
	var spec broker.Spec
	spec.Pattern, spec.Transient = wire.PatternTasks, true
	if _, err := b.Declare("jobs", spec); err != nil {
		t.Fatal(err)
	}
	q := b.Queue("jobs")
	for range 64 {
		if _, err := q.Enqueue(queue.Message{Body: make([]byte, 16<<10)}, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	mem.SetLimit(mem.Used() / 2)
	if k := alarms(); strings.Join(k, ",") != "memory" {
		t.Fatalf("alarms over the budget: %v", k)
	}
	mem.SetLimit(64 << 20)
	if k := alarms(); len(k) != 0 {
		t.Fatalf("alarms after the budget grew: %v", k)
	}

	// Disk: free space under the minimum, then back.
	fs.SetFreeSpace(1 << 20)
	testutil.WaitFor(t, 10*time.Second, func() bool { return b.Store().DiskAlarm() })
	if k := alarms(); strings.Join(k, ",") != "disk" {
		t.Fatalf("alarms with a full disk: %v", k)
	}
	fs.SetFreeSpace(1 << 30)
	testutil.WaitFor(t, 10*time.Second, func() bool { return !b.Store().DiskAlarm() })

	// A component given up.
	mu.Lock()
	comps[0].State, comps[0].LastError = "failed", "accept: too many open files"
	mu.Unlock()
	if k := alarms(); strings.Join(k, ",") != "component" {
		t.Fatalf("alarms with a failed component: %v", k)
	}
	var o struct {
		Alarms []struct{ Kind, Resource, Message string } `json:"alarms"`
	}
	h.get("/api/overview", &o)
	if a := o.Alarms[0]; a.Resource != "listener" || !strings.Contains(a.Message, "too many open files") {
		t.Errorf("component alarm %+v", a)
	}
}
