package admin

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/internal/broker"
)

// The sampler is one goroutine that wakes every sample interval, reads
// every counter once (atomic loads), and publishes per-second rates. It
// also keeps, for each kind of object, the objects sorted in their
// natural order (exchanges and queues by name, connections by number), so
// that a request only merges in what changed since the last sample
// instead of sorting everything.
//
// Requests never wait for it: they read live counters themselves and take
// only the rates and the last order from it, through atomic pointers.

// entry follows one object between samples.
type entry[K comparable] struct {
	key  K
	name []byte           // the object's name, JSON-quoted, for listings
	prev [4]uint64        // counters at the last sample; owned by the sampler
	rate [4]atomic.Uint64 // per-second rates as float64 bits
	// ref reads a queue's counters, for a source with [QueueRefs]; set
	// before the entry is published and never changed (a queue
	// recreated under the same name gets a new entry).
	ref QueueRef
}

// rateOf returns the rate of counter i, 0 for an object not sampled yet.
func (e *entry[K]) rateOf(i int) float64 {
	if e == nil {
		return 0
	}
	return math.Float64frombits(e.rate[i].Load())
}

// quotedName returns the JSON-quoted name, nil for no entry.
func (e *entry[K]) quotedName() []byte {
	if e == nil {
		return nil
	}
	return e.name
}

// update sets the rates from the counters now, dt seconds after the last
// sample. A counter that went down (an object recreated under the same
// name) counts from zero.
//
// An idle object's rates stay at 0: they are written only when they
// change, since most of 100,000 queues are idle and a store is a locked
// instruction that also takes the line from the readers' caches.
func (e *entry[K]) update(cur [4]uint64, dt float64) {
	if cur == e.prev {
		for i := range e.rate {
			if e.rate[i].Load() != 0 {
				e.rate[i].Store(0)
			}
		}
		return
	}
	for i, c := range cur {
		d := c - e.prev[i]
		if c < e.prev[i] {
			d = c
		}
		r := 0.0
		if dt > 0 {
			r = float64(d) / dt
		}
		if bits := math.Float64bits(r); e.rate[i].Load() != bits {
			e.rate[i].Store(bits)
		}
	}
	e.prev = cur
}

// order is an immutable list of the objects of one kind in their natural
// order, as of a sample, with their positions by key.
type order[K comparable] struct {
	list  []*entry[K]
	index map[K]int32
	// version is the broker's ExchangeVersion when an exchange order was
	// built (0: unknown), or the source's QueueVersion when a queue order
	// was built with refs (complete then); while it holds, list is the
	// whole set.
	version  uint64
	complete bool
}

func newOrder[K comparable](list []*entry[K]) *order[K] {
	o := &order[K]{list: list, index: make(map[K]int32, len(list))}
	for i, e := range list {
		o.index[e.key] = int32(i)
	}
	return o
}

// row is a live object with its entry, nil if no sample has seen it yet.
type row[K comparable, T any] struct {
	item T
	e    *entry[K]
}

// merge returns items (live objects in any order) in natural order: those
// o knows keep o's order, the others are sorted by cmp and merged in. It
// also returns the entries of o whose objects are gone. It costs one map
// lookup per item, plus sorting only the new ones.
func merge[K comparable, T any](o *order[K], items []T, key func(T) K, cmp func(a, b T) int) (rows []row[K, T], gone []*entry[K]) {
	at := make([]int32, len(o.list)) // 1 + the item at each position; 0: gone
	var fresh []int32
	for i, it := range items {
		if p, ok := o.index[key(it)]; ok {
			at[p] = int32(i) + 1
		} else {
			fresh = append(fresh, int32(i))
		}
	}
	slices.SortFunc(fresh, func(a, b int32) int { return cmp(items[a], items[b]) })
	rows = make([]row[K, T], 0, len(items))
	f := 0
	for p, ip := range at {
		if ip == 0 {
			gone = append(gone, o.list[p])
			continue
		}
		it := items[ip-1]
		for f < len(fresh) && cmp(items[fresh[f]], it) < 0 {
			rows = append(rows, row[K, T]{item: items[fresh[f]]})
			f++
		}
		rows = append(rows, row[K, T]{item: it, e: o.list[p]})
	}
	for ; f < len(fresh); f++ {
		rows = append(rows, row[K, T]{item: items[fresh[f]]})
	}
	return rows, gone
}

// Counters of each kind, by slot in entry.prev and entry.rate.
const (
	exRequests  = 0
	exPublishes = 1

	connRequests  = 0
	connPublishes = 1
	connDelivered = 2
	connResponses = 3

	qPublish = 0
	qDeliver = 1
	qAck     = 2
)

// Node-wide message totals.
const (
	totRequest = iota
	totPublish
	totDeliver
	totResponse
	totAck
	nTotals
)

// totalNames are the keys of the totals in message_stats.
var totalNames = [nTotals]string{"request", "publish", "deliver", "response", "ack"}

// tick is what one sample measured of the whole node.
type tick struct {
	at     time.Time
	totals [nTotals]uint64
	rates  [nTotals]float64
	// ready and unacked are the messages in every queue then, for the
	// overview's history of queued messages.
	ready, unacked uint64
}

type sampler struct {
	b      *broker.Broker
	queues QueueSource
	refs   QueueRefs // queues, if it has refs; else nil
	now    func() time.Time

	exchanges atomic.Pointer[order[*broker.Exchange]]
	conns     atomic.Pointer[order[*broker.Session]]
	queueOrd  atomic.Pointer[order[string]]
	last      atomic.Pointer[tick]

	// retired holds the final counters of objects that are gone, so that
	// totals never go down when a connection closes or an exchange is
	// deleted. Requests load it before they range over live objects.
	retired [nTotals]atomic.Uint64
	// reported is the highest total returned so far: a total read while an
	// object is between "gone" and "retired" is held at it.
	reported [nTotals]atomic.Uint64
	// retiredQ and reportedQ do the same for the queues' publish and
	// deliver counters (qPublished, qDelivered).
	retiredQ, reportedQ [2]atomic.Uint64

	latMu sync.Mutex // guards retiredLat, reportedLat
	// retiredLat holds the request latencies of deleted exchanges;
	// reportedLat the highest histogram returned, as for reported.
	retiredLat, reportedLat broker.LatencySnapshot

	mu   sync.Mutex // guards hist, next, n
	hist []tick     // ring of the last len(hist) samples
	next int        // where the next sample goes
	n    int        // samples held
}

func newSampler(b *broker.Broker, queues QueueSource, history int, now func() time.Time) *sampler {
	s := &sampler{b: b, queues: queues, now: now, hist: make([]tick, history)}
	s.refs, _ = queues.(QueueRefs)
	s.exchanges.Store(newOrder[*broker.Exchange](nil))
	s.conns.Store(newOrder[*broker.Session](nil))
	s.queueOrd.Store(newOrder[string](nil))
	return s
}

// run samples every interval until stop is closed.
func (s *sampler) run(ctx context.Context, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
			s.sample(s.now())
		}
	}
}

func exchangeName(ex *broker.Exchange) string          { return ex.Name() }
func exchangeKey(ex *broker.Exchange) *broker.Exchange { return ex }
func byExchangeName(a, b *broker.Exchange) int         { return cmp.Compare(a.Name(), b.Name()) }
func sessionKey(s *broker.Session) *broker.Session     { return s }
func bySessionNumber(a, b *broker.Session) int         { return cmp.Compare(a.Number(), b.Number()) }
func queueKey(q queueItem) string                      { return q.Name }
func queueName(q queueItem) string                     { return q.Name }
func queueRefOf(q queueItem) QueueRef                  { return q.ref }
func byQueueName(a, b queueItem) int                   { return cmp.Compare(a.Name, b.Name) }

// liveExchanges returns every exchange in name order with its entry.
func (s *sampler) liveExchanges() []row[*broker.Exchange, *broker.Exchange] {
	o := s.exchanges.Load()
	if o.version != 0 && o.version == s.b.ExchangeVersion() {
		// Nothing declared or deleted since the last sample: its order is
		// the set, without walking the broker's map.
		rows := make([]row[*broker.Exchange, *broker.Exchange], len(o.list))
		for i, e := range o.list {
			rows[i] = row[*broker.Exchange, *broker.Exchange]{item: e.key, e: e}
		}
		return rows
	}
	items := s.rangeExchanges(len(o.list))
	rows, _ := merge(o, items, exchangeKey, byExchangeName)
	return rows
}

// rangeExchanges returns every exchange. hint is how many there were at
// the last sample: sizing the slice up front saves the garbage (and the
// GC assists) of growing it.
func (s *sampler) rangeExchanges(hint int) []*broker.Exchange {
	items := make([]*broker.Exchange, 0, hint+hint/16+16)
	s.b.RangeExchanges(func(ex *broker.Exchange) bool {
		items = append(items, ex)
		return true
	})
	return items
}

// liveConns returns every session in number order with its entry.
func (s *sampler) liveConns() []row[*broker.Session, *broker.Session] {
	rows, _ := merge(s.conns.Load(), s.b.Sessions(nil), sessionKey, bySessionNumber)
	return rows
}

// liveQueues appends every queue in name order with its entry to dst
// and returns it. While no queue came or went since the last sample, it
// reads the counters through the sample's refs, in its order: no walk
// over the queue layer, no lookup, no sorting.
func (s *sampler) liveQueues(dst []queueRow) []queueRow {
	if s.queues == nil {
		return dst
	}
	o := s.queueOrd.Load()
	if o.complete && o.version == s.refs.QueueVersion() {
		dst = slices.Grow(dst, len(o.list))
		// The counters are read a batch at a time into a small buffer,
		// then copied into the rows: a tight loop of reads keeps several
		// cache misses in flight, where reading each into its row as
		// the row is built waits for them one by one (with 100,000
		// queues: 13 ms a listing rather than 15 to 17 here).
		var infos [32]QueueInfo
		for i := 0; i < len(o.list); i += len(infos) {
			part := o.list[i:min(i+len(infos), len(o.list))]
			for k, e := range part {
				infos[k] = e.ref.Counters()
			}
			for k, e := range part {
				it := queueItem{QueueInfo: infos[k], ref: e.ref}
				it.Name = e.key
				dst = append(dst, queueRow{item: it, e: e})
			}
		}
		return dst
	}
	rows, _ := merge(o, s.queueItems(len(o.list)), queueKey, byQueueName)
	return append(dst, rows...)
}

// refItem reads the queue of an entry with a ref.
func refItem(e *entry[string]) queueItem {
	it := queueItem{QueueInfo: e.ref.Counters(), ref: e.ref}
	it.Name = e.key
	return it
}

// queueItems returns every queue, with its ref when the source has
// refs. hint is how many there were at the last sample.
func (s *sampler) queueItems(hint int) []queueItem {
	items := make([]queueItem, 0, hint+hint/16+16)
	if s.refs == nil {
		for _, q := range s.queues.AppendQueues(make([]QueueInfo, 0, cap(items))) {
			items = append(items, queueItem{QueueInfo: q})
		}
		return items
	}
	for _, r := range s.refs.AppendQueueRefs(make([]NamedQueueRef, 0, cap(items))) {
		it := queueItem{QueueInfo: r.Ref.Counters(), ref: r.Ref}
		it.Name = r.Name
		items = append(items, it)
	}
	return items
}

// rangeQueues calls fn with every queue's figures: through the last
// sample's refs while no queue came or went, else from the source.
func (s *sampler) rangeQueues(fn func(q *QueueInfo)) {
	o := s.queueOrd.Load()
	if o.complete && o.version == s.refs.QueueVersion() {
		for _, e := range o.list {
			q := refItem(e)
			fn(&q.QueueInfo)
		}
		return
	}
	for _, q := range s.queueItems(len(o.list)) {
		fn(&q.QueueInfo)
	}
}

// exchangeEntry returns the entry of ex, or nil.
func (s *sampler) exchangeEntry(ex *broker.Exchange) *entry[*broker.Exchange] {
	o := s.exchanges.Load()
	if p, ok := o.index[ex]; ok {
		return o.list[p]
	}
	return nil
}

func (s *sampler) connEntry(sess *broker.Session) *entry[*broker.Session] {
	o := s.conns.Load()
	if p, ok := o.index[sess]; ok {
		return o.list[p]
	}
	return nil
}

func (s *sampler) queueEntry(name string) *entry[string] {
	o := s.queueOrd.Load()
	if p, ok := o.index[name]; ok {
		return o.list[p]
	}
	return nil
}

func exchangeCounters(ex *broker.Exchange) [4]uint64 {
	return [4]uint64{exRequests: ex.Requests(), exPublishes: ex.Publishes()}
}

func connCounters(sess *broker.Session) [4]uint64 {
	st := sess.Stats()
	return [4]uint64{
		connRequests: st.Requests.Load(), connPublishes: st.Publishes.Load(),
		connDelivered: st.Delivered.Load(), connResponses: st.Responses.Load(),
	}
}

func queueCounters(q queueItem) [4]uint64 {
	return [4]uint64{qPublish: q.Publish, qDeliver: q.Deliver, qAck: q.Ack}
}

// track updates the entries of one kind of object and returns the order
// to publish: the old one when no object came or went.
//
// New entries and their quoted names are allocated side by side, in name
// order, so that a listing reads them from contiguous memory rather than
// visiting every object.
//
// ref, if not nil, gives an item's [QueueRef]: an entry whose ref is not
// the item's (a queue deleted and created again under its name) is
// replaced by a new one, and the old one counts as gone.
func track[K comparable, T any](o *order[K], items []T, key func(T) K, cmp func(a, b T) int, name func(T) string,
	counters func(T) [4]uint64, ref func(T) QueueRef, dt float64, first bool) (*order[K], []*entry[K]) {
	rows, gone := merge(o, items, key, cmp)
	if ref != nil {
		for i := range rows {
			if e := rows[i].e; e != nil && e.ref != ref(rows[i].item) {
				gone = append(gone, e)
				rows[i].e = nil
			}
		}
	}
	fresh := 0
	for i := range rows {
		if rows[i].e == nil {
			fresh++
		}
	}
	changed := len(gone) > 0 || fresh > 0
	var list []*entry[K]
	var slab []entry[K]
	var arena []byte
	if changed {
		list = make([]*entry[K], len(rows))
		slab = make([]entry[K], fresh)
	}
	for i, r := range rows {
		cur := counters(r.item)
		e := r.e
		if e == nil {
			// New since the last sample: its counters started at zero
			// within the interval, except for what existed at start-up.
			e = &slab[0]
			slab = slab[1:]
			e.key = key(r.item)
			n := name(r.item)
			if len(arena)+2*len(n)+8 > cap(arena) {
				arena = make([]byte, 0, max(64<<10, 6*len(n)+8))
			}
			start := len(arena)
			arena = appendString(arena, n)
			e.name = arena[start:len(arena):len(arena)]
			if ref != nil {
				e.ref = ref(r.item)
			}
			if first {
				e.prev = cur
			}
		}
		e.update(cur, dt)
		if changed {
			list[i] = e
		}
	}
	if changed {
		o = newOrder(list)
	}
	return o, gone
}

// sample reads every counter once and publishes rates, orders and a tick.
func (s *sampler) sample(now time.Time) {
	prev := s.last.Load()
	first := prev == nil
	dt := 0.0
	if !first {
		dt = now.Sub(prev.at).Seconds()
	}

	ex := s.sampleExchanges(dt, first)

	co, cgone := track(s.conns.Load(), s.b.Sessions(nil), sessionKey, bySessionNumber, (*broker.Session).ID, connCounters, nil, dt, first)
	s.conns.Store(co)
	for _, e := range cgone {
		st := e.key.Stats()
		s.retired[totDeliver].Add(st.Delivered.Load())
		s.retired[totResponse].Add(st.Responses.Load())
	}

	var qs *census
	if s.queues != nil {
		c := s.sampleQueues(dt, first)
		qs = &c
	}

	c := s.count(&ex, qs)
	t := &tick{at: now, totals: c.totals, ready: c.ready, unacked: c.unacked}
	if !first && dt > 0 {
		for i := range t.rates {
			t.rates[i] = float64(t.totals[i]-prev.totals[i]) / dt
		}
	}
	s.last.Store(t)
	s.mu.Lock()
	s.hist[s.next] = *t
	s.next = (s.next + 1) % len(s.hist)
	s.n = min(s.n+1, len(s.hist))
	s.mu.Unlock()
}

// sampleExchanges updates the exchanges' rates and returns their part
// of the census. While no exchange came or went since the last sample it
// reads them through the order it keeps; otherwise it walks the broker
// and rebuilds the order.
func (s *sampler) sampleExchanges(dt float64, first bool) census {
	var c census
	o := s.exchanges.Load()
	version := s.b.ExchangeVersion() // before the walk: see order.version
	if o.version == 0 || o.version != version {
		eo, gone := track(o, s.rangeExchanges(len(o.list)), exchangeKey, byExchangeName, exchangeName, exchangeCounters, nil, dt, first)
		if eo == o {
			eo = &order[*broker.Exchange]{list: eo.list, index: eo.index} // never change a published order
		}
		eo.version = version
		s.exchanges.Store(eo)
		for _, e := range gone {
			// The exchange is unreachable but its counters are final.
			s.retired[totRequest].Add(e.key.Requests())
			s.retired[totPublish].Add(e.key.Publishes())
			if h := e.key.Latency(); h != nil {
				s.latMu.Lock()
				h.AddTo(&s.retiredLat)
				s.latMu.Unlock()
			}
		}
		for _, e := range eo.list { // prev holds what this sample read
			c.totals[totRequest] += e.prev[exRequests]
			c.totals[totPublish] += e.prev[exPublishes]
		}
		c.exchanges = len(eo.list)
		return c
	}
	var cur [32][4]uint64 // read a batch at a time: see liveQueues
	for i := 0; i < len(o.list); i += len(cur) {
		part := o.list[i:min(i+len(cur), len(o.list))]
		for k, e := range part {
			cur[k] = exchangeCounters(e.key)
		}
		for k, e := range part {
			e.update(cur[k], dt)
			c.totals[totRequest] += cur[k][exRequests]
			c.totals[totPublish] += cur[k][exPublishes]
		}
	}
	c.exchanges = len(o.list)
	return c
}

// exchangeSums returns the exchanges' part of the census: through the
// last sample's order while no exchange came or went, else by a walk.
func (s *sampler) exchangeSums() census {
	var c census
	s.rangeExchangesFast(func(ex *broker.Exchange) {
		c.totals[totRequest] += ex.Requests()
		c.totals[totPublish] += ex.Publishes()
		c.exchanges++
	})
	return c
}

// rangeExchangesFast calls fn with every exchange: through the last
// sample's order while no exchange came or went, else by a walk.
func (s *sampler) rangeExchangesFast(fn func(*broker.Exchange)) {
	if o := s.exchanges.Load(); o.version != 0 && o.version == s.b.ExchangeVersion() {
		for _, e := range o.list {
			fn(e.key)
		}
		return
	}
	s.b.RangeExchanges(func(ex *broker.Exchange) bool {
		fn(ex)
		return true
	})
}

// sampleQueues updates the queues' rates and returns their part of the
// census. While no queue came or went since the last sample it reads
// them through the refs it keeps; otherwise it walks the source and
// rebuilds the order.
func (s *sampler) sampleQueues(dt float64, first bool) census {
	var c census
	o := s.queueOrd.Load()
	if o.complete && o.version == s.refs.QueueVersion() {
		var infos [32]QueueInfo // read a batch at a time: see liveQueues
		for i := 0; i < len(o.list); i += len(infos) {
			part := o.list[i:min(i+len(infos), len(o.list))]
			for k, e := range part {
				infos[k] = e.ref.Counters()
			}
			for k, e := range part {
				q := &infos[k]
				e.update([4]uint64{qPublish: q.Publish, qDeliver: q.Deliver, qAck: q.Ack}, dt)
				c.addQueue(q)
			}
		}
		return c
	}
	var version uint64
	var ref func(queueItem) QueueRef
	if s.refs != nil {
		version = s.refs.QueueVersion() // before the walk: see order.version
		ref = queueRefOf
	}
	items := s.queueItems(len(o.list))
	for i := range items {
		c.addQueue(&items[i].QueueInfo)
	}
	qo, gone := track(o, items, queueKey, byQueueName, queueName, queueCounters, ref, dt, first)
	if qo == o {
		qo = &order[string]{list: o.list, index: o.index} // never change a published order
	}
	qo.version, qo.complete = version, s.refs != nil
	s.queueOrd.Store(qo)
	for _, e := range gone {
		// A deleted queue's last counters are those of the last sample.
		s.retired[totAck].Add(e.prev[qAck])
		s.retiredQ[qPublished].Add(e.prev[qPublish])
		s.retiredQ[qDelivered].Add(e.prev[qDeliver])
	}
	return c
}

// census is what one pass over every object counts.
type census struct {
	totals         [nTotals]uint64
	exchanges      int
	queues         int
	ready, unacked uint64
	// queued counts what the queues published and delivered, by
	// qPublished and qDelivered.
	queued [2]uint64
}

// Slots of census.queued.
const (
	qPublished = 0
	qDelivered = 1
)

// addQueue counts a queue in the census.
func (c *census) addQueue(q *QueueInfo) {
	c.totals[totAck] += q.Ack
	c.queues++
	c.ready += q.MessagesReady
	c.unacked += q.MessagesUnacked
	c.queued[qPublished] += q.Publish
	c.queued[qDelivered] += q.Deliver
}

// count returns the node's message totals now, retired objects plus the
// live counters of every exchange, connection and queue, and counts the
// objects on the way. ex and qs, if not nil, are the exchanges' and the
// queues' parts, just read by a sample; count reads them itself
// otherwise. Totals never come out lower than before.
func (s *sampler) count(ex, qs *census) census {
	var c census
	t := &c.totals
	for i := range t {
		t[i] = s.retired[i].Load()
	}
	if ex == nil {
		e := s.exchangeSums()
		ex = &e
	}
	t[totRequest] += ex.totals[totRequest]
	t[totPublish] += ex.totals[totPublish]
	c.exchanges = ex.exchanges
	for _, sess := range s.b.Sessions(nil) {
		st := sess.Stats()
		t[totDeliver] += st.Delivered.Load()
		t[totResponse] += st.Responses.Load()
	}
	if s.queues != nil {
		if qs == nil {
			var q census
			s.rangeQueues(q.addQueue)
			qs = &q
		}
		t[totAck] += qs.totals[totAck]
		c.queues, c.ready, c.unacked = qs.queues, qs.ready, qs.unacked
		for i := range c.queued {
			c.queued[i] = s.retiredQ[i].Load() + qs.queued[i]
			holdHigh(&s.reportedQ[i], &c.queued[i])
		}
	}
	for i := range t {
		holdHigh(&s.reported[i], &t[i])
	}
	return c
}

// holdHigh raises *high to *v, or *v to *high: a total never comes out
// lower than one returned before.
func holdHigh(high *atomic.Uint64, v *uint64) {
	for {
		r := high.Load()
		if *v <= r {
			*v = r
			return
		}
		if high.CompareAndSwap(r, *v) {
			return
		}
	}
}

// requestLatency returns the node's request latency histogram: the
// deleted exchanges' and every request-response exchange's now. Its
// counts never come out lower than before.
func (s *sampler) requestLatency() broker.LatencySnapshot {
	s.latMu.Lock()
	defer s.latMu.Unlock()
	h := s.retiredLat
	s.rangeExchangesFast(func(ex *broker.Exchange) {
		if l := ex.Latency(); l != nil {
			l.AddTo(&h)
		}
	})
	for i, c := range h.Counts {
		s.reportedLat.Counts[i] = max(s.reportedLat.Counts[i], c)
	}
	s.reportedLat.Sum = max(s.reportedLat.Sum, h.Sum)
	return s.reportedLat
}

// lastTick returns the latest sample; zero before the first.
func (s *sampler) lastTick() tick {
	if t := s.last.Load(); t != nil {
		return *t
	}
	return tick{}
}

// history returns up to count samples, newest first, every step-th one.
func (s *sampler) history(count, step int) []tick {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]tick, 0, min(count, s.n))
	for i := 0; i < s.n && len(out) < count; i += step {
		j := (s.next - 1 - i + 2*len(s.hist)) % len(s.hist)
		out = append(out, s.hist[j])
	}
	return out
}
