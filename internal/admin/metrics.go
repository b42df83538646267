package admin

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/store"
)

// Metrics follow rabbitmq_prometheus: /metrics holds node-wide figures,
// whose size does not grow with the number of objects, and
// /metrics/per-object one series per exchange and queue. Both read the
// live counters at scrape time.

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	mInfo         = desc("courier_node_info", "Always 1; the labels name the node and its version.", "node", "version")
	mConns        = desc("courier_connections", "Open connections, network and embedded.")
	mConnEnds     = desc("courier_connections_ended_total", "Network connections that ended otherwise than by the client's CLOSE or the server's, by reason: heartbeat (cut: nothing from the client for three heartbeats), slow_consumer (cut: the client did not read for the slow-consumer timeout), vanished (the client closed or reset the socket without CLOSE, as one that gives up on a connection to reconnect does). What was sent to such a subscriber meanwhile is lost.", "reason")
	mLinkCuts     = desc("courier_link_cuts_total", "Sessions of this node's links with a peer node that ended, by cause: silent (nothing heard, heartbeats included, for three link heartbeats), stalled (the peer took nothing for the slow-consumer timeout), broken (the connection failed), declared (memberlist declared the node dead or gone), other (the peer dialled again, the broker cut it, this node closed).", "peer", "reason")
	mLinkDropped  = desc("courier_link_frames_dropped_total", "Frames to a peer node refused because the link's outbox was past its offer limit; publications and requests wait for room instead.", "peer")
	mExchanges    = desc("courier_exchanges", "Exchanges.")
	mQueues       = desc("courier_queues", "Queues.")
	mAttachments  = desc("courier_attachments", "Attachments (handlers, subscribers, controllers) of every connection.")
	mPatterns     = desc("courier_patterns", "Subscription patterns of every subscriber, durable subscriptions included.")
	mPatternMem   = desc("courier_patterns_memory_bytes", "Estimated memory the subscription patterns take: topic tree nodes, pattern text, lists. Not part of the memory budget.")
	mReady        = desc("courier_queue_messages_ready", "Messages ready for delivery in every queue.")
	mUnacked      = desc("courier_queue_messages_unacked", "Messages delivered and not yet acknowledged in every queue.")
	mCompUp       = desc("courier_component_up", "1 while the supervised component runs, else 0.", "component")
	mCompFailed   = desc("courier_component_failed", "1 once the supervised component crashed more often than its restart intensity allows and was given up.", "component")
	mCompRestarts = desc("courier_component_restarts_total", "Restarts of the supervised component.", "component")
	mQPublishes   = desc("courier_queue_publishes_total", "Messages enqueued on every queue, deleted queues included.")
	mQDeliveries  = desc("courier_queue_deliveries_total", "Messages delivered from every queue (redeliveries included), deleted queues included.")
	mReqLatency   = desc("courier_request_duration_seconds", "Time from a request's arrival at the broker to its last response, over every request-response exchange; requests that found no handler or timed out are not counted.")
	mAlarm        = desc("courier_alarm", "1 while an alarm of the kind is on: memory (the queues reached the memory high watermark), disk (the store's disk is under its minimum free space), store (the store failed), component (a supervised component was given up).", "kind")
	mMemLimit     = desc("courier_memory_budget_bytes", "The node's memory budget: what durable queues keep in RAM before they page to disk.")
	mMemHigh      = desc("courier_memory_high_watermark_bytes", "The node's memory high watermark: what the queues may hold in RAM before publishers are slowed, then held (the memory alarm).")
	mMemUsed      = desc("courier_memory_budget_used_bytes", "Bytes the queues account against the memory budget: messages and index entries in RAM.")
	mMemPaged     = desc("courier_memory_paged_out_messages", "Messages whose body is only on disk (their index entry is in RAM).")
	mMemSpilled   = desc("courier_memory_spilled_messages", "Messages whose index entry is on disk too.")
	mMemPage      = desc("courier_memory_page_level", "How hard durable queues page to disk, from 0 (everything in RAM) to 1 (a small working set).")
	mMemThrottle  = desc("courier_memory_throttle_level", "How hard publishers are slowed for memory, from 0 to 1 (1 during the memory alarm).")
	mStoreSync    = desc("courier_store_sync_duration_seconds", "Latency of the store's fsyncs (one per group commit).")
	mStoreSegs    = desc("courier_store_segments", "Segment files of the store.")
	mStoreDisk    = desc("courier_store_disk_bytes", "Bytes in the store's segment files.")
	mStoreLive    = desc("courier_store_live_records", "Records appended to the store and not yet released.")
	mStoreLiveB   = desc("courier_store_live_bytes", "Bytes of the live records, headers included.")
	mStoreRecs    = desc("courier_store_records_total", "Records appended to the store, release records included.")
	mStoreApp     = desc("courier_store_appended_bytes_total", "Bytes appended to the store, headers included.")
	mStoreWrit    = desc("courier_store_written_bytes_total", "Bytes written to segment files.")
	mStoreCkpt    = desc("courier_store_checkpoints_total", "Checkpoints written.")
	mStoreRuns    = desc("courier_store_runs", "Run files (queue index pages spilled to disk).")
	mStoreFree    = desc("courier_store_disk_free_bytes", "Free space of the store's disk at the last check; absent when unknown.")
	mStoreDamR    = desc("courier_store_damaged_records", "Records of the store that fail their checksum, found since the node started (at start or by the background check).")
	mStoreDamB    = desc("courier_store_damaged_bytes", "Bytes of the damaged records.")
	mStoreScrub   = desc("courier_store_scrubbed_bytes_total", "Bytes the store's background check has verified since the node started.")
	mStoreScrubD  = desc("courier_store_scrub_done", "1 once the store's background check has read every record the start did not verify.")
	mTotals       = [nTotals]*prometheus.Desc{
		totRequest:  desc("courier_requests_total", "Requests routed through exchanges."),
		totPublish:  desc("courier_publishes_total", "Messages published to exchanges."),
		totDeliver:  desc("courier_deliveries_total", "Messages and requests delivered to connections."),
		totResponse: desc("courier_responses_total", "Responses sent by handlers."),
		totAck:      desc("courier_acks_total", "Messages acknowledged on queues."),
	}

	mExRequests    = desc("courier_exchange_requests_total", "Requests routed through the exchange.", "exchange")
	mExPublishes   = desc("courier_exchange_publishes_total", "Messages published to the exchange.", "exchange")
	mExMembers     = desc("courier_exchange_members", "Members (handlers or controllers) of the exchange.", "exchange")
	mExSubscribers = desc("courier_exchange_subscribers", "Subscribers of the exchange.", "exchange")
	mQReady        = desc("courier_queue_messages_ready", "Messages ready for delivery.", "queue")
	mQUnacked      = desc("courier_queue_messages_unacked", "Messages delivered and not yet acknowledged.", "queue")
	mQConsumers    = desc("courier_queue_consumers", "Consumers of the queue.", "queue")
	mQMemory       = desc("courier_queue_memory_bytes", "Bytes the queue keeps in RAM (index entries, bodies not paged out), as the memory budget accounts them.", "queue")
	mQPublish      = desc("courier_queue_publishes_total", "Messages published to the queue.", "queue")
	mQDeliver      = desc("courier_queue_deliveries_total", "Messages delivered from the queue.", "queue")
	mQAck          = desc("courier_queue_acks_total", "Messages acknowledged on the queue.", "queue")
	mExLatency     = desc("courier_exchange_request_duration_seconds", "Time from a request's arrival at the broker to its last response.", "exchange")
)

// latencyBounds are the upper bounds of the request latency buckets, in
// seconds.
var latencyBounds = func() []float64 {
	b := make([]float64, broker.LatencyBuckets)
	for i := range b {
		b[i] = broker.LatencyBound(i).Seconds()
	}
	return b
}()

// latencyHistogram turns a latency snapshot into a Prometheus histogram.
func latencyHistogram(d *prometheus.Desc, h *broker.LatencySnapshot, labels ...string) prometheus.Metric {
	return constHistogram(d, latencyBounds, h.Counts[:], h.Sum.Seconds(), labels...)
}

// syncBounds are the upper bounds of the store's fsync buckets, in
// seconds.
var syncBounds = func() []float64 {
	b := make([]float64, len(store.SyncBuckets))
	for i, d := range store.SyncBuckets {
		b[i] = d.Seconds()
	}
	return b
}()

// constHistogram makes a Prometheus histogram of per-bucket counts:
// counts[i] for the bucket up to bounds[i], one more for what is above
// every bound.
func constHistogram(d *prometheus.Desc, bounds []float64, counts []uint64, sum float64, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(bounds))
	var cum uint64
	for i, le := range bounds {
		cum += counts[i]
		buckets[le] = cum
	}
	return prometheus.MustNewConstHistogram(d, cum+counts[len(bounds)], sum, buckets, labels...)
}

// collectLinks collects the counters of this node's links with the other
// nodes of its cluster (none on a single node).
func (c nodeCollector) collectLinks(ch chan<- prometheus.Metric) {
	if c.s.cfg.Cluster == nil {
		return
	}
	for _, n := range c.s.cfg.Cluster() {
		if !n.Self {
			continue
		}
		for _, l := range n.Links {
			counter := func(d *prometheus.Desc, v uint64, labels ...string) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
			}
			counter(mLinkCuts, l.Cuts.Silent, l.Peer, "silent")
			counter(mLinkCuts, l.Cuts.Stalled, l.Peer, "stalled")
			counter(mLinkCuts, l.Cuts.Broken, l.Peer, "broken")
			counter(mLinkCuts, l.Cuts.Declared, l.Peer, "declared")
			counter(mLinkCuts, l.Cuts.Other, l.Peer, "other")
			counter(mLinkDropped, l.Dropped, l.Peer)
		}
	}
}

// nodeCollector collects the node-wide metrics.
type nodeCollector struct{ s *Server }

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mInfo, mConns, mConnEnds, mLinkCuts, mLinkDropped, mExchanges, mQueues, mAttachments, mPatterns, mPatternMem, mReady, mUnacked, mCompUp, mCompFailed, mCompRestarts,
		mQPublishes, mQDeliveries, mReqLatency, mAlarm, mMemLimit, mMemHigh, mMemUsed, mMemPaged, mMemSpilled, mMemPage, mMemThrottle,
		mStoreSync, mStoreSegs, mStoreDisk, mStoreLive, mStoreLiveB, mStoreRecs, mStoreApp, mStoreWrit, mStoreCkpt, mStoreRuns, mStoreFree,
		mStoreDamR, mStoreDamB, mStoreScrub, mStoreScrubD} {
		ch <- d
	}
	for _, d := range mTotals {
		ch <- d
	}
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	o := c.s.readOverview()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(mInfo, 1, c.s.cfg.Node, c.s.cfg.Version)
	gauge(mConns, float64(o.conns))
	for _, e := range []struct {
		reason string
		n      uint64
	}{{"heartbeat", o.ends.Heartbeat}, {"slow_consumer", o.ends.SlowConsumer}, {"vanished", o.ends.Vanished}} {
		ch <- prometheus.MustNewConstMetric(mConnEnds, prometheus.CounterValue, float64(e.n), e.reason)
	}
	c.collectLinks(ch)
	gauge(mExchanges, float64(o.exchanges))
	gauge(mQueues, float64(o.queues))
	gauge(mAttachments, float64(o.atts))
	gauge(mPatterns, float64(o.patterns.Patterns))
	gauge(mPatternMem, float64(o.patterns.Bytes))
	gauge(mReady, float64(o.ready))
	gauge(mUnacked, float64(o.unacked))
	for i, d := range mTotals {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(o.totals[i]))
	}
	flag := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, comp := range o.components {
		gauge(mCompUp, flag(comp.State == "running"), comp.Name)
		gauge(mCompFailed, flag(comp.State == "failed"), comp.Name)
		ch <- prometheus.MustNewConstMetric(mCompRestarts, prometheus.CounterValue, float64(comp.Restarts), comp.Name)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	counter(mQPublishes, float64(o.queued[qPublished]))
	counter(mQDeliveries, float64(o.queued[qDelivered]))
	lat := c.s.smp.requestLatency()
	ch <- latencyHistogram(mReqLatency, &lat)
	for _, kind := range alarmKinds {
		gauge(mAlarm, flag(o.has(kind)), kind)
	}
	if m := c.s.b.Memory(); m != nil {
		st := m.Stats()
		gauge(mMemLimit, float64(st.Budget))
		gauge(mMemHigh, float64(st.Limit))
		gauge(mMemUsed, float64(st.Used))
		gauge(mMemPaged, float64(st.PagedOut))
		gauge(mMemSpilled, float64(st.Spilled))
		gauge(mMemPage, st.PageLevel)
		gauge(mMemThrottle, st.Throttle)
	}
	if l := c.s.b.Store(); l != nil {
		st := l.Stats()
		ch <- constHistogram(mStoreSync, syncBounds, st.SyncHist[:], st.SyncTime.Seconds())
		gauge(mStoreSegs, float64(st.Segments))
		gauge(mStoreDisk, float64(st.DiskBytes))
		gauge(mStoreLive, float64(st.LiveRecords))
		gauge(mStoreLiveB, float64(st.LiveBytes))
		gauge(mStoreRuns, float64(st.Runs))
		counter(mStoreRecs, float64(st.Records))
		counter(mStoreApp, float64(st.AppendedBytes))
		counter(mStoreWrit, float64(st.WrittenBytes))
		counter(mStoreCkpt, float64(st.Checkpoints))
		if st.DiskFree >= 0 {
			gauge(mStoreFree, float64(st.DiskFree))
		}
		gauge(mStoreDamR, float64(st.DamagedRecords))
		gauge(mStoreDamB, float64(st.DamagedBytes))
		counter(mStoreScrub, float64(st.ScrubBytes))
		gauge(mStoreScrubD, flag(st.Scrub == store.ScrubDone))
	}
}

// objectCollector collects one series per exchange and queue.
type objectCollector struct{ s *Server }

func (c objectCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mExRequests, mExPublishes, mExMembers, mExSubscribers,
		mQReady, mQUnacked, mQConsumers, mQMemory, mQPublish, mQDeliver, mQAck, mExLatency} {
		ch <- d
	}
}

func (c objectCollector) Collect(ch chan<- prometheus.Metric) {
	metric := func(d *prometheus.Desc, t prometheus.ValueType, v float64, label string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, label)
	}
	c.s.b.RangeExchanges(func(ex *broker.Exchange) bool {
		n := ex.Name()
		metric(mExRequests, prometheus.CounterValue, float64(ex.Requests()), n)
		metric(mExPublishes, prometheus.CounterValue, float64(ex.Publishes()), n)
		metric(mExMembers, prometheus.GaugeValue, float64(ex.MemberCount()), n)
		metric(mExSubscribers, prometheus.GaugeValue, float64(ex.Subscribers()), n)
		if h := ex.Latency(); h != nil {
			var snap broker.LatencySnapshot
			h.AddTo(&snap)
			ch <- latencyHistogram(mExLatency, &snap, n)
		}
		return true
	})
	if c.s.cfg.Queues == nil {
		return
	}
	c.s.smp.rangeQueues(func(q *QueueInfo) {
		metric(mQReady, prometheus.GaugeValue, float64(q.MessagesReady), q.Name)
		metric(mQUnacked, prometheus.GaugeValue, float64(q.MessagesUnacked), q.Name)
		metric(mQConsumers, prometheus.GaugeValue, float64(q.Consumers), q.Name)
		metric(mQMemory, prometheus.GaugeValue, float64(q.Memory), q.Name)
		metric(mQPublish, prometheus.CounterValue, float64(q.Publish), q.Name)
		metric(mQDeliver, prometheus.CounterValue, float64(q.Deliver), q.Name)
		metric(mQAck, prometheus.CounterValue, float64(q.Ack), q.Name)
	})
}

// metricsHandlers returns the handlers of /metrics and
// /metrics/per-object. /metrics also has the Go runtime's and the
// process's collectors, and a histogram of the management API's own
// response times.
func (s *Server) metricsHandlers() (node, perObject http.Handler) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		nodeCollector{s},
		s.apiLatency,
	)
	objs := prometheus.NewRegistry()
	objs.MustRegister(objectCollector{s})
	opts := promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}
	return promhttp.HandlerFor(reg, opts), promhttp.HandlerFor(objs, opts)
}
