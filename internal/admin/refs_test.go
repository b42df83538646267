package admin_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/admin"
)

// refQueues is a queue layer with refs ([admin.QueueRefs]): its counters
// change in place, and a version counts creations and deletions.
type refQueues struct {
	mu      sync.Mutex // guards q, version, walks
	q       map[string]*fakeRef
	version uint64
	walks   int // calls of AppendQueues and AppendQueueRefs
}

type fakeRef struct {
	rq   *refQueues
	info admin.QueueInfo
}

func (r *fakeRef) Counters() admin.QueueInfo {
	r.rq.mu.Lock()
	defer r.rq.mu.Unlock()
	info := r.info
	info.Name = "" // the API must not need it from here
	return info
}

func (f *refQueues) QueueVersion() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.version
}

func (f *refQueues) AppendQueueRefs(dst []admin.NamedQueueRef) []admin.NamedQueueRef {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.walks++
	for name, r := range f.q {
		dst = append(dst, admin.NamedQueueRef{Name: name, Ref: r})
	}
	return dst
}

func (f *refQueues) AppendQueues(dst []admin.QueueInfo) []admin.QueueInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.walks++
	for _, r := range f.q {
		dst = append(dst, r.info)
	}
	return dst
}

func (f *refQueues) Queue(name string) (admin.QueueInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.q[name]; r != nil {
		return r.info, true
	}
	return admin.QueueInfo{}, false
}

func (f *refQueues) CreateQueue(name string, _ admin.QueueSpec) (admin.QueueInfo, bool, error) {
	f.create(admin.QueueInfo{Name: name})
	return admin.QueueInfo{Name: name}, true, nil
}

func (f *refQueues) DeleteQueue(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.q, name)
	f.version++
	return nil
}

func (f *refQueues) PurgeQueue(string) (uint64, error) { return 0, nil }

// create adds a queue (a new one, even under the name of an old one).
func (f *refQueues) create(q admin.QueueInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.q[q.Name] = &fakeRef{rq: f, info: q}
	f.version++
}

// change edits a queue's counters in place, as a live queue does.
func (f *refQueues) change(name string, edit func(q *admin.QueueInfo)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	edit(&f.q[name].info)
}

func (f *refQueues) walked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.walks
}

// TestQueueRefs: with a source that has refs, a listing reads live
// counters through the refs of the last sample while no queue came or
// went (no walk over the source), and walks the source as soon as one
// did: figures are never those of the last sample, and a queue created
// or deleted shows at once.
func TestQueueRefs(t *testing.T) {
	rq := &refQueues{q: map[string]*fakeRef{}}
	h := start(t, func(c *admin.Config) { c.Queues = rq })
	rq.create(admin.QueueInfo{Name: "jobs", MessagesReady: 5, Publish: 5})
	rq.create(admin.QueueInfo{Name: "emails", MessagesReady: 9, Publish: 9})
	h.tick(time.Second)

	ready := func() map[string]float64 {
		t.Helper()
		var list []obj
		h.get("/api/queues?columns=name,messages_ready", &list)
		m := map[string]float64{}
		for _, q := range list {
			m[q["name"].(string)] = q.num("messages_ready")
		}
		return m
	}
	walks := rq.walked()
	rq.change("jobs", func(q *admin.QueueInfo) { q.MessagesReady, q.Publish = 7, 7 })
	if got := ready(); got["jobs"] != 7 || got["emails"] != 9 || len(got) != 2 {
		t.Errorf("after a change, before a sample: %v", got)
	}
	var o obj
	h.get("/api/overview", &o)
	if got := o.num("queue_totals.messages_ready"); got != 16 {
		t.Errorf("overview messages_ready %v, want 16", got)
	}
	if w := rq.walked(); w != walks {
		t.Errorf("%d walks over the queues while none came or went", w-walks)
	}

	rq.create(admin.QueueInfo{Name: "archive", MessagesReady: 1})
	if got := ready(); got["archive"] != 1 || len(got) != 3 {
		t.Errorf("a queue created since the sample: %v", got)
	}
	rq.DeleteQueue("jobs")
	if got := ready(); len(got) != 2 || got["jobs"] != 0 {
		t.Errorf("a queue deleted since the sample: %v", got)
	}
	h.tick(time.Second)

	// emails deleted and created again: a new queue under the old name,
	// whose rates count from the new one's counters.
	rq.DeleteQueue("emails")
	rq.create(admin.QueueInfo{Name: "emails", MessagesReady: 2, Publish: 2})
	h.tick(time.Second)
	rq.change("emails", func(q *admin.QueueInfo) { q.MessagesReady, q.Publish = 4, 4 })
	h.tick(time.Second)
	var list []obj
	h.get("/api/queues?columns=name,messages_ready,message_stats.publish_details.rate", &list)
	if n := names(list, "name"); !slices.Equal(n, []string{"archive", "emails"}) {
		t.Fatalf("queues %v", n)
	}
	if e := list[1]; e.num("messages_ready") != 4 || e.num("message_stats.publish_details.rate") != 2 {
		t.Errorf("emails after it was created again: %v", e)
	}
	// Idle for a sample: the rate falls back to 0 (the sampler writes
	// a rate only when it changes); busy again, it comes back.
	h.tick(time.Second)
	rate := func() float64 {
		t.Helper()
		h.get("/api/queues?columns=name,message_stats.publish_details.rate", &list)
		return list[1].num("message_stats.publish_details.rate")
	}
	if r := rate(); r != 0 {
		t.Errorf("emails idle for a sample: publish rate %v, want 0", r)
	}
	h.tick(time.Second)
	rq.change("emails", func(q *admin.QueueInfo) { q.Publish = 10 })
	h.tick(time.Second)
	if r := rate(); r != 6 {
		t.Errorf("emails busy again: publish rate %v, want 6", r)
	}
	walks = rq.walked()
	for range 3 {
		h.get("/api/queues", &list)
	}
	if w := rq.walked(); w != walks {
		t.Errorf("%d walks over the queues while none came or went", w-walks)
	}
}
