package admin

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/courier-mq/courier/internal/broker"
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
	mExchanges    = desc("courier_exchanges", "Exchanges.")
	mQueues       = desc("courier_queues", "Queues.")
	mAttachments  = desc("courier_attachments", "Attachments (handlers, subscribers, controllers) of every connection.")
	mReady        = desc("courier_queue_messages_ready", "Messages ready for delivery in every queue.")
	mUnacked      = desc("courier_queue_messages_unacked", "Messages delivered and not yet acknowledged in every queue.")
	mCompUp       = desc("courier_component_up", "1 while the supervised component runs, else 0.", "component")
	mCompFailed   = desc("courier_component_failed", "1 once the supervised component crashed more often than its restart intensity allows and was given up.", "component")
	mCompRestarts = desc("courier_component_restarts_total", "Restarts of the supervised component.", "component")
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
	mQMemory       = desc("courier_queue_memory_bytes", "Bytes the queue holds in memory.", "queue")
	mQPublish      = desc("courier_queue_publishes_total", "Messages published to the queue.", "queue")
	mQDeliver      = desc("courier_queue_deliveries_total", "Messages delivered from the queue.", "queue")
	mQAck          = desc("courier_queue_acks_total", "Messages acknowledged on the queue.", "queue")
)

// nodeCollector collects the node-wide metrics.
type nodeCollector struct{ s *Server }

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mInfo, mConns, mExchanges, mQueues, mAttachments, mReady, mUnacked, mCompUp, mCompFailed, mCompRestarts} {
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
	gauge(mExchanges, float64(o.exchanges))
	gauge(mQueues, float64(o.queues))
	gauge(mAttachments, float64(o.atts))
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
}

// objectCollector collects one series per exchange and queue.
type objectCollector struct{ s *Server }

func (c objectCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mExRequests, mExPublishes, mExMembers, mExSubscribers,
		mQReady, mQUnacked, mQConsumers, mQMemory, mQPublish, mQDeliver, mQAck} {
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
		return true
	})
	if c.s.cfg.Queues == nil {
		return
	}
	for _, q := range c.s.cfg.Queues.AppendQueues(nil) {
		metric(mQReady, prometheus.GaugeValue, float64(q.MessagesReady), q.Name)
		metric(mQUnacked, prometheus.GaugeValue, float64(q.MessagesUnacked), q.Name)
		metric(mQConsumers, prometheus.GaugeValue, float64(q.Consumers), q.Name)
		metric(mQMemory, prometheus.GaugeValue, float64(q.Memory), q.Name)
		metric(mQPublish, prometheus.CounterValue, float64(q.Publish), q.Name)
		metric(mQDeliver, prometheus.CounterValue, float64(q.Deliver), q.Name)
		metric(mQAck, prometheus.CounterValue, float64(q.Ack), q.Name)
	}
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
