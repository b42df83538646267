package admin

import (
	"context"
	"errors"
	"net/http"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/store"
)

// Listener is a listener the node serves, as the overview lists it.
type Listener struct {
	// Protocol is "courier" (or "courier+tls") for the client protocol,
	// "amqp" (or "amqps") for AMQP 0-9-1, or "http" for the management
	// API.
	Protocol string
	// Address is the address listened on, "host:port".
	Address string
}

// Component is a supervised part of the node (a listener, the broker's
// sweeper, the sampler), as the overview and the node list it.
type Component struct {
	// Name names it, such as "listener".
	Name string
	// State is "running", "restarting", "failed" or "stopped".
	State string
	// Critical says the node exits when it fails.
	Critical bool
	// Restarts counts its restarts since the node started.
	Restarts uint64
	// LastError is its last crash; "" for none.
	LastError string
}

func appendComponents(b []byte, cs []Component) []byte {
	b = append(b, '[')
	for i, c := range cs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = appendString(b, c.Name)
		b = append(b, `,"state":`...)
		b = appendString(b, c.State)
		b = append(b, `,"critical":`...)
		b = strconv.AppendBool(b, c.Critical)
		b = append(b, `,"restarts":`...)
		b = strconv.AppendUint(b, c.Restarts, 10)
		b = append(b, `,"last_error":`...)
		b = appendString(b, c.LastError)
		b = append(b, '}')
	}
	return append(b, ']')
}

// overview is the figures of GET /api/overview, read once per request.
type overview struct {
	s                                    *Server
	uptime                               time.Duration
	conns, exchanges, queues, atts       int
	ends                                 ConnEnds
	ready, unacked                       uint64
	queued                               [2]uint64 // by qPublished, qDelivered
	totals                               [nTotals]uint64
	rates                                [nTotals]float64
	history                              []tick // newest first, when asked
	listeners                            []Listener
	components                           []Component
	alarms                               []Alarm
	memUsed, heapLive, goroutines, procs uint64
	patterns                             broker.PatternStats
	store                                storeHealth
}

// storeHealth is the store's damage and background check, for the
// overview; zero without a store.
type storeHealth struct {
	damagedRecords, damagedBytes int64
	scrub                        string
	scrubBytes                   uint64
	scrubTotal                   int64
}

func appendListeners(b []byte, ls []Listener) []byte {
	b = append(b, '[')
	for i, l := range ls {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"protocol":`...)
		b = appendString(b, l.Protocol)
		b = append(b, `,"address":`...)
		b = appendString(b, l.Address)
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendSamples encodes RabbitMQ's rate samples, newest first:
// [{"sample": cumulative count, "timestamp": ms since the epoch}].
func appendSamples(b []byte, hist []tick, i int) []byte {
	b = append(b, '[')
	for j, t := range hist {
		if j > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"sample":`...)
		b = strconv.AppendUint(b, t.totals[i], 10)
		b = append(b, `,"timestamp":`...)
		b = strconv.AppendInt(b, t.at.UnixMilli(), 10)
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendDepths encodes the history of queued messages as RabbitMQ's
// queue_totals samples, newest first: [{"sample": messages then,
// "timestamp": ms since the epoch}]; unacked picks the unacknowledged
// messages rather than the ready ones.
func appendDepths(b []byte, hist []tick, unacked bool) []byte {
	b = append(b, '[')
	for j, t := range hist {
		if j > 0 {
			b = append(b, ',')
		}
		v := t.ready
		if unacked {
			v = t.unacked
		}
		b = append(b, `{"sample":`...)
		b = strconv.AppendUint(b, v, 10)
		b = append(b, `,"timestamp":`...)
		b = strconv.AppendInt(b, t.at.UnixMilli(), 10)
		b = append(b, '}')
	}
	return append(b, ']')
}

// overviewSchema returns the overview's fields; with samples, every rate
// has its history too.
func overviewSchema(samples bool) *schema[overview] {
	f := []*field[overview]{
		strField("node", func(o *overview) string { return o.s.cfg.Node }),
		strField("courier_version", func(o *overview) string { return o.s.cfg.Version }),
		strField("go_version", func(*overview) string { return runtime.Version() }),
		intField("uptime", func(o *overview) int64 { return o.uptime.Milliseconds() }),
		intField("sample_interval", func(o *overview) int64 { return o.s.cfg.SampleInterval.Milliseconds() }),
		intField("object_totals.connections", func(o *overview) int64 { return int64(o.conns) }),
		intField("object_totals.exchanges", func(o *overview) int64 { return int64(o.exchanges) }),
		intField("object_totals.queues", func(o *overview) int64 { return int64(o.queues) }),
		intField("object_totals.attachments", func(o *overview) int64 { return int64(o.atts) }),
		intField("object_totals.patterns", func(o *overview) int64 { return o.patterns.Patterns }),
		uintField("queue_totals.messages", func(o *overview) uint64 { return o.ready + o.unacked }),
		uintField("queue_totals.messages_ready", func(o *overview) uint64 { return o.ready }),
		uintField("queue_totals.messages_unacknowledged", func(o *overview) uint64 { return o.unacked }),
	}
	if samples {
		f = append(f,
			rawField("queue_totals.messages_ready_details.samples",
				func(b []byte, o *overview) []byte { return appendDepths(b, o.history, false) }, nil),
			rawField("queue_totals.messages_unacknowledged_details.samples",
				func(b []byte, o *overview) []byte { return appendDepths(b, o.history, true) }, nil))
	}
	for i, name := range totalNames {
		f = append(f,
			uintField("message_stats."+name, func(o *overview) uint64 { return o.totals[i] }),
			rateField("message_stats."+name, func(o *overview) float64 { return o.rates[i] }))
		if samples {
			f = append(f, rawField("message_stats."+name+"_details.samples",
				func(b []byte, o *overview) []byte { return appendSamples(b, o.history, i) }, nil))
		}
	}
	f = append(f,
		intField("store.damaged_records", func(o *overview) int64 { return o.store.damagedRecords }),
		intField("store.damaged_bytes", func(o *overview) int64 { return o.store.damagedBytes }),
		strField("store.scrub", func(o *overview) string { return o.store.scrub }),
		uintField("store.scrub_bytes", func(o *overview) uint64 { return o.store.scrubBytes }),
		intField("store.scrub_total", func(o *overview) int64 { return o.store.scrubTotal }))
	f = append(f, rawField("listeners", func(b []byte, o *overview) []byte { return appendListeners(b, o.listeners) }, nil),
		rawField("components", func(b []byte, o *overview) []byte { return appendComponents(b, o.components) }, nil),
		rawField("alarms", func(b []byte, o *overview) []byte { return appendAlarms(b, o.alarms) }, nil))
	return newSchema("node", f...)
}

var (
	overviewPlain   = overviewSchema(false)
	overviewSamples = overviewSchema(true)
)

// readOverview gathers the overview's figures: counts and totals from
// live counters, rates from the last sample.
func (s *Server) readOverview() *overview {
	o := &overview{s: s, uptime: s.cfg.now().Sub(s.started), listeners: s.listeners()}
	if s.cfg.Components != nil {
		o.components = s.cfg.Components()
	}
	o.alarms = s.alarms(o.components)
	c := s.smp.count(nil, nil)
	o.totals, o.exchanges, o.queues, o.ready, o.unacked, o.queued = c.totals, c.exchanges, c.queues, c.ready, c.unacked, c.queued
	o.rates = s.smp.lastTick().rates
	o.conns = s.b.SessionCount()
	if s.cfg.ConnEnds != nil {
		o.ends = s.cfg.ConnEnds()
	}
	o.atts = s.b.AttachmentCount()
	o.patterns = s.b.PatternStats()
	o.store.scrub = store.ScrubOff
	if l := s.b.Store(); l != nil {
		st := l.Stats()
		o.store = storeHealth{damagedRecords: st.DamagedRecords, damagedBytes: st.DamagedBytes,
			scrub: st.Scrub, scrubBytes: st.ScrubBytes, scrubTotal: st.ScrubTotal}
	}
	return o
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, "GET")
		return
	}
	v := r.URL.Query()
	o := s.readOverview()
	sch := overviewPlain
	if age := v.Get("msg_rates_age"); age != "" {
		ageSec, err := strconv.Atoi(age)
		if err != nil || ageSec < 1 {
			writeError(w, badRequest("msg_rates_age=%q: want seconds, 1 or more", age))
			return
		}
		incrSec := 1
		if incr := v.Get("msg_rates_incr"); incr != "" {
			if incrSec, err = strconv.Atoi(incr); err != nil || incrSec < 1 {
				writeError(w, badRequest("msg_rates_incr=%q: want seconds, 1 or more", incr))
				return
			}
		}
		every := max(s.cfg.SampleInterval, time.Millisecond)
		step := max(int(time.Duration(incrSec)*time.Second/every), 1)
		count := ageSec/incrSec + 1
		o.history = s.smp.history(count, step)
		sch = overviewSamples
	} else if v.Get("msg_rates_incr") != "" {
		writeError(w, badRequest("msg_rates_incr needs msg_rates_age"))
		return
	}
	serveObject(w, r, sch, o, http.StatusOK)
}

// nodeInfo is one node of GET /api/nodes.
type nodeInfo struct {
	o *overview
	// The memory budget's limit (high watermark), use and budget (0
	// without one), and the free space of the store's disk (-1 when
	// unknown).
	memLimit, memBudget, memPage, diskFree int64
	// c is the node as the cluster sees it; nil on a single node. For
	// another node than this one, o describes this one: only the
	// fields read through c describe the other.
	c *ClusterNode
}

// remote reports whether the row is another node than this one.
func (n *nodeInfo) remote() bool { return n.c != nil && !n.c.Self }

func (n *nodeInfo) name() string {
	if n.c != nil {
		return n.c.Name
	}
	return n.o.s.cfg.Node
}

func (n *nodeInfo) state() string {
	if n.c != nil {
		return n.c.State
	}
	return "alive"
}

// local returns get for this node's row and zero for the others: what
// only the node itself knows.
func local[T any](get func(*nodeInfo) T) func(*nodeInfo) T {
	return func(n *nodeInfo) T {
		if n.remote() {
			var zero T
			return zero
		}
		return get(n)
	}
}

var runtimeMetrics = []string{
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/gc/heap/live:bytes",
	"/sched/goroutines:goroutines",
}

// readRuntime reads the Go runtime's memory and goroutine figures; it
// does not stop the world.
func (o *overview) readRuntime() {
	samples := make([]metrics.Sample, len(runtimeMetrics))
	for i, name := range runtimeMetrics {
		samples[i].Name = name
	}
	metrics.Read(samples)
	u := func(i int) uint64 {
		if samples[i].Value.Kind() == metrics.KindUint64 {
			return samples[i].Value.Uint64()
		}
		return 0
	}
	o.memUsed = u(0) - min(u(1), u(0))
	o.heapLive = u(2)
	o.goroutines = u(3)
	o.procs = uint64(runtime.GOMAXPROCS(0))
}

var nodeSchema = newSchema("name",
	strField("name", (*nodeInfo).name),
	strField("type", func(*nodeInfo) string { return "disc" }),
	boolField("running", func(n *nodeInfo) bool { return running(n.state()) }),
	strField("state", (*nodeInfo).state),
	intField("state_since", func(n *nodeInfo) int64 {
		if n.c != nil {
			return unixMilli(n.c.Since)
		}
		return unixMilli(n.o.s.started)
	}),
	strField("courier_version", func(n *nodeInfo) string {
		if n.remote() {
			return n.c.Version
		}
		return n.o.s.cfg.Version
	}),
	strField("go_version", local(func(*nodeInfo) string { return runtime.Version() })),
	intField("os_pid", local(func(*nodeInfo) int64 { return int64(os.Getpid()) })),
	intField("uptime", func(n *nodeInfo) int64 {
		if !n.remote() {
			return n.o.uptime.Milliseconds()
		}
		if !running(n.c.State) || n.c.Started.IsZero() {
			return 0
		}
		return max(n.o.s.cfg.now().Sub(n.c.Started).Milliseconds(), 0)
	}),
	strField("cluster_address", func(n *nodeInfo) string {
		if n.c == nil {
			return ""
		}
		return n.c.ClusterAddr
	}),
	strField("client_url", func(n *nodeInfo) string {
		if n.c == nil {
			return n.o.s.clientURL()
		}
		return n.c.ClientURL
	}),
	strField("http_url", func(n *nodeInfo) string {
		if n.c == nil {
			return n.o.s.httpURL()
		}
		return n.c.HTTPURL
	}),
	boolField("meta_leader", func(n *nodeInfo) bool { return n.c != nil && n.c.MetaLeader }),
	uintField("processors", local(func(n *nodeInfo) uint64 { return n.o.procs })),
	uintField("goroutines", local(func(n *nodeInfo) uint64 { return n.o.goroutines })),
	uintField("mem_used", local(func(n *nodeInfo) uint64 { return n.o.memUsed })),
	uintField("mem_heap_live", local(func(n *nodeInfo) uint64 { return n.o.heapLive })),
	intField("connections", func(n *nodeInfo) int64 {
		if n.remote() {
			return int64(n.c.Connections)
		}
		return int64(n.o.conns)
	}),
	rawField("connections_ended", func(b []byte, n *nodeInfo) []byte {
		var e ConnEnds
		if !n.remote() {
			e = n.o.ends
		}
		b = append(b, `{"heartbeat":`...)
		b = strconv.AppendUint(b, e.Heartbeat, 10)
		b = append(b, `,"slow_consumer":`...)
		b = strconv.AppendUint(b, e.SlowConsumer, 10)
		b = append(b, `,"vanished":`...)
		b = strconv.AppendUint(b, e.Vanished, 10)
		return append(b, '}')
	}, nil),
	intField("exchanges", func(n *nodeInfo) int64 {
		if n.remote() {
			return int64(n.c.Exchanges)
		}
		return int64(n.o.exchanges)
	}),
	intField("queues", func(n *nodeInfo) int64 {
		if n.remote() {
			return int64(n.c.Queues)
		}
		return int64(n.o.queues)
	}),
	intField("attachments", local(func(n *nodeInfo) int64 { return int64(n.o.atts) })),
	intField("patterns", local(func(n *nodeInfo) int64 { return n.o.patterns.Patterns })),
	intField("mem_patterns", local(func(n *nodeInfo) int64 { return n.o.patterns.Bytes })),
	intField("mem_budget_limit", local(func(n *nodeInfo) int64 { return n.memLimit })),
	intField("mem_budget_used", local(func(n *nodeInfo) int64 { return n.memBudget })),
	intField("mem_budget", local(func(n *nodeInfo) int64 { return n.memPage })),
	boolField("mem_alarm", local(func(n *nodeInfo) bool { return n.o.has(AlarmMemory) })),
	intField("disk_free", func(n *nodeInfo) int64 {
		if n.remote() {
			return -1
		}
		return n.diskFree
	}),
	boolField("disk_free_alarm", local(func(n *nodeInfo) bool { return n.o.has(AlarmDisk) })),
	rawField("links", func(b []byte, n *nodeInfo) []byte {
		if n.c == nil {
			return append(b, "[]"...)
		}
		return appendLinks(b, n.c.Links)
	}, nil),
	rawField("listeners", func(b []byte, n *nodeInfo) []byte {
		if n.remote() {
			return append(b, "[]"...)
		}
		return appendListeners(b, n.o.listeners)
	}, nil),
	rawField("components", func(b []byte, n *nodeInfo) []byte {
		if n.remote() {
			return append(b, "[]"...)
		}
		return appendComponents(b, n.o.components)
	}, nil),
	rawField("alarms", func(b []byte, n *nodeInfo) []byte {
		if n.remote() {
			return append(b, "[]"...)
		}
		return appendAlarms(b, n.o.alarms)
	}, nil),
)

// has reports whether an alarm of kind is on.
func (o *overview) has(kind string) bool {
	for _, a := range o.alarms {
		if a.Kind == kind {
			return true
		}
	}
	return false
}

func (s *Server) readNode() *nodeInfo {
	o := s.readOverview()
	o.readRuntime()
	n := &nodeInfo{o: o, diskFree: -1}
	if m := s.b.Memory(); m != nil {
		n.memLimit, n.memBudget, n.memPage = m.Limit(), m.Used(), m.Budget()
	}
	if l := s.b.Store(); l != nil {
		n.diskFree = l.DiskFree()
	}
	return n
}

// readNodes returns every node: this one alone, or the cluster as this
// node sees it.
func (s *Server) readNodes() []nodeInfo {
	self := s.readNode()
	var cn []ClusterNode
	if s.cfg.Cluster != nil {
		cn = s.cfg.Cluster()
	}
	if len(cn) == 0 {
		return []nodeInfo{*self}
	}
	rows := make([]nodeInfo, 0, len(cn))
	for i := range cn {
		r := *self
		r.c = &cn[i]
		rows = append(rows, r)
	}
	return rows
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, "GET")
		return
	}
	serveList(w, r, nodeSchema, s.readNodes(), (*nodeInfo).name)
}

func (s *Server) node(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if r.Method == http.MethodDelete && s.cfg.ForgetNode != nil {
		s.forgetNode(w, r, name)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if s.cfg.ForgetNode != nil {
			methodNotAllowed(w, "GET, DELETE")
		} else {
			methodNotAllowed(w, "GET")
		}
		return
	}
	var names []string
	for _, n := range s.readNodes() {
		if n.name() == name {
			serveObject(w, r, nodeSchema, &n, http.StatusOK)
			return
		}
		names = append(names, n.name())
	}
	writeError(w, notFound("node %q not found; the nodes are %s", name, strings.Join(names, ", ")))
}

// forgetNode removes node name from the cluster for good, as RabbitMQ's
// forget_cluster_node: 204, 404 for a node the cluster does not know, 503
// without a quorum.
func (s *Server) forgetNode(w http.ResponseWriter, r *http.Request, name string) {
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	if err := s.cfg.ForgetNode(ctx, name); err != nil {
		writeError(w, forgetError(name, err))
		return
	}
	s.log.Info("node forgotten through the management API", "node", name, "by", requester(r))
	w.WriteHeader(http.StatusNoContent)
}

// ErrUnknownNode and ErrUnavailable are what ForgetNode returns (wrapped)
// for a node the cluster does not know, and when the cluster cannot
// decide now.
var (
	ErrUnknownNode = errors.New("unknown node")
	ErrUnavailable = errors.New("unavailable")
)

func forgetError(name string, err error) error {
	switch {
	case errors.Is(err, ErrUnknownNode):
		return notFound("node %q is not a member of the cluster", name)
	case errors.Is(err, ErrUnavailable):
		return &apiError{http.StatusServiceUnavailable, "unavailable", err.Error()}
	}
	return &apiError{http.StatusInternalServerError, "internal_error", err.Error()}
}
