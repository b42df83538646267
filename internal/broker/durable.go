package broker

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/wire"
)

// Durability. The broker keeps its durable queues in one store.Log under
// the node's data directory. Each durable queue has an id in the log; id 0
// is the broker's own: the definitions of the durable queues, one record
// per change. A checkpoint holds every definition with its queue's
// snapshot, so a restart reads the checkpoint and replays only what was
// written after it; definition records older than the last checkpoint
// are released.

const (
	metaQueue  uint32     = 0
	kindDefine store.Kind = 1 // payload: a queueDef in JSON
	kindDrop   store.Kind = 2 // payload: the queue id, u32 little-endian
)

// StoreConfig configures [Broker.OpenStore].
type StoreConfig struct {
	// Dir is the log's directory.
	Dir string
	// FS is the file system. Default: store.OSFS{}.
	FS store.FS
	// Options are the log's. Default: store.DefaultOptions().
	Options *store.Options
	// CheckpointEvery is the longest time between checkpoints while
	// something was written. A checkpoint costs what the queues keep in
	// RAM (their paged-out index is referenced, not copied), and a
	// restart replays what was written since the last one. Default: 2s.
	CheckpointEvery time.Duration
	// CheckpointBytes starts a checkpoint once that many bytes were
	// appended since the last one, bounding the work of a restart.
	// Default: 32 MiB.
	CheckpointBytes uint64
}

// durability is the broker's store and the state of its checkpoints.
type durability struct {
	b   *Broker
	log *store.Log
	cfg StoreConfig

	// mu is held across every definition record and its change to the
	// broker's queues, and by the checkpoint's snapshot, so that a
	// checkpoint sees each definition with its record.
	mu       sync.Mutex
	nextID   uint32
	metaRefs []store.Ref // definition records since the last checkpoint

	cpMu      sync.Mutex // one checkpoint at a time; guards the fields below
	lastCP    time.Time
	lastBytes uint64
	lastSnap  int    // size of the last checkpoint's state
	stateBuf  []byte // the last checkpoint's state, to reuse; see snapshot

	pending *recovering // between recover and build

	memAlarm, diskAlarm bool // as last logged, by loop
	stop                chan struct{}
	done                chan struct{}
}

func (d *durability) newID() uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	id := d.nextID
	d.nextID++
	return id
}

// defineQueue records a durable queue's definition, or its new version,
// and calls then, under the lock a checkpoint takes, so that a checkpoint
// sees the change exactly when it covers the record. It returns a function
// that waits until the record is durable. A broker without a store, or a
// transient queue, just calls then.
func (b *Broker) defineQueue(def queueDef, then func()) func() error {
	if b.dur == nil || (def.Config.Transient && def.Sub == "") {
		then()
		return func() error { return nil }
	}
	return b.dur.appendMeta(kindDefine, jsonBody(def), then)
}

// undefineQueue records that a durable queue is gone, calling then as
// defineQueue does.
func (b *Broker) undefineQueue(id uint32, then func()) {
	if b.dur == nil {
		then()
		return
	}
	if err := b.dur.appendMeta(kindDrop, binary.LittleEndian.AppendUint32(nil, id), then)(); err != nil {
		b.log.Error("store: deleting a queue's definition failed; it may come back at restart", "id", id, "err", err)
	}
}

func (d *durability) appendMeta(kind store.Kind, payload []byte, then func()) func() error {
	done := make(chan error, 1)
	d.mu.Lock()
	ref, err := d.log.Append(metaQueue, kind, payload, func(err error) { done <- err })
	if err == nil {
		d.metaRefs = append(d.metaRefs, ref)
		then()
	}
	d.mu.Unlock()
	return func() error {
		if err == nil {
			err = <-done
		}
		if err != nil {
			return wire.Errorf(wire.CodeStorage, "store: %v", err)
		}
		return nil
	}
}

// OpenStore opens (or creates) the broker's store and brings back the
// durable queues it holds, with their tasks, and the pub-sub exchanges of
// durable subscriptions. Call it once, before serving clients.
func (b *Broker) OpenStore(cfg StoreConfig) (*store.Recovery, error) {
	if b.dur != nil {
		return nil, errors.New("broker: store already open")
	}
	if cfg.FS == nil {
		cfg.FS = store.OSFS{}
	}
	opts := store.DefaultOptions()
	if cfg.Options != nil {
		opts = *cfg.Options
	}
	if opts.Logger == nil {
		opts.Logger = b.log
	}
	if cfg.CheckpointEvery <= 0 {
		cfg.CheckpointEvery = 2 * time.Second
	}
	if cfg.CheckpointBytes == 0 {
		cfg.CheckpointBytes = 32 << 20
	}
	log, rec, err := store.Open(cfg.FS, cfg.Dir, opts)
	if err != nil {
		return nil, fmt.Errorf("broker: open store: %w", err)
	}
	d := &durability{b: b, log: log, cfg: cfg, nextID: 1, stop: make(chan struct{}), done: make(chan struct{})}
	if err := d.recover(rec); err != nil {
		log.Close()
		return nil, err
	}
	b.dur = d
	if err := d.build(); err != nil {
		b.dur = nil
		log.Close()
		return nil, err
	}
	// The first checkpoint is the loop's, in the background, once
	// something is written: with a deep queue in RAM it writes megabytes,
	// and the node need not wait for it to serve.
	go d.loop()
	return rec, nil
}

// recovering is the state rebuilt from a checkpoint and the records
// after it, before the queues are built.
type recovering struct {
	defs    map[uint32]queueDef
	rbs     map[uint32]*queue.Rebuilder
	orphans map[uint32][]store.Ref // records of queues that are gone
}

var stateMagic = [4]byte{'C', 'B', 'S', 'T'}

// recover reads the checkpoint's state and replays the log into
// rebuilders, one per durable queue.
func (d *durability) recover(rec *store.Recovery) error {
	r := &recovering{defs: map[uint32]queueDef{}, rbs: map[uint32]*queue.Rebuilder{}, orphans: map[uint32][]store.Ref{}}
	if rec.CheckpointErr != nil {
		d.b.log.Warn("store: checkpoint unusable; rebuilding from the whole log", "err", rec.CheckpointErr)
	}
	if rec.State != nil {
		if err := r.loadState(d, rec.State); err != nil {
			return fmt.Errorf("broker: checkpoint state: %w", err)
		}
	}
	var rel []store.Ref
	skipped := 0
	err := d.log.Replay(func(x store.Record) error {
		if x.Queue == metaQueue {
			d.metaRefs = append(d.metaRefs, x.Ref)
			switch x.Kind {
			case kindDefine:
				var def queueDef
				if err := json.Unmarshal(x.Payload, &def); err != nil || def.ID == 0 {
					d.b.log.Error("store: bad queue definition skipped", "ref", x.Ref, "err", err)
					return nil
				}
				r.defs[def.ID] = def
				if r.rbs[def.ID] == nil && !def.ExchangeOnly {
					r.rbs[def.ID] = newRebuilder()
				}
				d.nextID = max(d.nextID, def.ID+1)
			case kindDrop:
				if len(x.Payload) == 4 {
					id := binary.LittleEndian.Uint32(x.Payload)
					delete(r.defs, id)
					delete(r.rbs, id)
				}
			}
			return nil
		}
		rb := r.rbs[x.Queue]
		if rb == nil {
			// A queue deleted since, whose records were not all released
			// before the node stopped: release them now, so that their
			// segments can go.
			if x.Kind != store.KindRelease {
				r.orphans[x.Queue] = append(r.orphans[x.Queue], x.Ref)
			}
			return nil
		}
		e := queue.Entry{Ref: fromStore(x.Ref), Kind: queue.Kind(x.Kind), Payload: x.Payload}
		if x.Kind == store.KindRelease {
			var err error
			if rel, err = x.Released(rel[:0]); err != nil {
				skipped++
				return nil
			}
			for _, r := range rel {
				e.Released = append(e.Released, fromStore(r))
			}
		}
		if err := rb.Apply(e); err != nil {
			skipped++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("broker: replay: %w", err)
	}
	if skipped > 0 {
		d.b.log.Warn("store: records that did not decode were skipped", "count", skipped)
	}
	d.pending = r
	return nil
}

func fromStore(r store.Ref) queue.Ref { return queue.Ref{Seg: r.Seg, Off: r.Off, Len: r.Len} }

func newRebuilder() *queue.Rebuilder {
	rb := queue.NewRebuilder()
	rb.LazyBodies = true
	return rb
}

// build makes the recovered queues and their exchanges.
func (d *durability) build() error {
	r := d.pending
	d.pending = nil
	ids := make([]uint32, 0, len(r.defs))
	for id := range r.defs {
		ids = append(ids, id)
	}
	// The exchanges without a queue first: a durable subscription's
	// pub-sub exchange is then declared as it was, not from the copy of
	// its configuration the subscription keeps.
	slices.SortFunc(ids, func(a, b uint32) int {
		if ea, eb := r.defs[a].ExchangeOnly, r.defs[b].ExchangeOnly; ea != eb {
			if ea {
				return -1
			}
			return 1
		}
		return cmp.Compare(a, b)
	})
	b := d.b
	var tasks int64
	exchanges := 0
	for _, id := range ids {
		def := r.defs[id]
		spec := Spec{ExchangeConfig: def.Config}
		if def.ExchangeOnly {
			if _, err := b.declare(def.Exchange, spec, Trusted(), &recoveredQueue{def: def}, nil); err != nil {
				b.log.Error("store: a durable exchange could not be brought back", "exchange", def.Exchange, "err", err)
				continue
			}
			exchanges++
			continue
		}
		var rq *recoveredQueue
		if def.Sub == "" {
			rq = &recoveredQueue{def: def, rb: r.rbs[id]}
		}
		ex, err := b.declare(def.Exchange, spec, Trusted(), rq, nil)
		if err != nil {
			b.log.Error("store: a durable exchange could not be brought back", "exchange", def.Exchange, "queue", def.Name, "err", err)
			continue
		}
		if def.Sub != "" {
			tq, err := b.newTaskQueue(ex, def, Trusted(), r.rbs[id])
			if err != nil {
				b.log.Error("store: a durable subscription could not be brought back", "queue", def.Name, "err", err)
				continue
			}
			tq.bind(def.Patterns)
			b.putQueue(def.Name, tq)
		}
	}
	if len(ids) > 0 {
		b.queues.Range(func(_, v any) bool {
			if tq := v.(*taskQueue); tq.durable {
				tasks += tq.q.Stats().Messages()
			}
			return true
		})
		b.log.Info("store: durable definitions recovered", "exchanges", exchanges, "queues", len(ids)-exchanges, "messages", tasks)
	}
	for id, refs := range r.orphans {
		if _, live := r.defs[id]; live {
			continue
		}
		if err := d.log.Release(id, refs, nil); err != nil {
			b.log.Warn("store: releasing the records of a deleted queue failed", "queue_id", id, "err", err)
		}
		d.log.DropRuns(id)
	}
	return nil
}

// loadState decodes a checkpoint's state:
//
//	"CBST" | v u8 | 0 0 0 | nextID u32 | count u32
//	count × ( defLen u32 | def JSON | snapLen u32 | queue snapshot )
//	v2: xcount u32 | xcount × ( defLen u32 | def JSON )
//
// Version 1, written before request-response and pub-sub exchanges were
// durable, has no exchange definitions.
func (r *recovering) loadState(d *durability, p []byte) error {
	if len(p) < 16 || [4]byte(p[:4]) != stateMagic || (p[4] != 1 && p[4] != 2) {
		return errors.New("not a broker state, or an unknown version")
	}
	version := p[4]
	d.nextID = max(d.nextID, binary.LittleEndian.Uint32(p[8:]))
	n := int(binary.LittleEndian.Uint32(p[12:]))
	p = p[16:]
	next := func() ([]byte, error) {
		if len(p) < 4 {
			return nil, errors.New("truncated")
		}
		l := int(binary.LittleEndian.Uint32(p))
		if l > len(p)-4 {
			return nil, errors.New("truncated")
		}
		b := p[4 : 4+l]
		p = p[4+l:]
		return b, nil
	}
	for range n {
		dj, err := next()
		if err != nil {
			return err
		}
		snap, err := next()
		if err != nil {
			return err
		}
		var def queueDef
		if err := json.Unmarshal(dj, &def); err != nil {
			return fmt.Errorf("queue definition: %w", err)
		}
		rb := newRebuilder()
		if err := rb.LoadSnapshot(snap); err != nil {
			return fmt.Errorf("queue %q: %w", def.Name, err)
		}
		r.defs[def.ID], r.rbs[def.ID] = def, rb
		d.nextID = max(d.nextID, def.ID+1)
	}
	if version >= 2 {
		if len(p) < 4 {
			return errors.New("truncated")
		}
		n := int(binary.LittleEndian.Uint32(p))
		p = p[4:]
		for range n {
			dj, err := next()
			if err != nil {
				return err
			}
			var def queueDef
			if err := json.Unmarshal(dj, &def); err != nil || !def.ExchangeOnly || def.ID == 0 {
				return fmt.Errorf("exchange definition: %w", cmp.Or(err, errors.New("not an exchange")))
			}
			r.defs[def.ID] = def
			d.nextID = max(d.nextID, def.ID+1)
		}
	}
	if len(p) != 0 {
		return errors.New("bytes after the last queue")
	}
	return nil
}

// snapshot encodes the broker's durable state for a checkpoint; d.mu is
// held. A queue that did not change since the last checkpoint, nor its
// definition, is written as it was then, from what that checkpoint kept
// (see cpEntry): with 100,000 queues of which a few are busy, a
// checkpoint encodes those few.
func (d *durability) snapshot() []byte {
	var list []*taskQueue
	d.b.queues.Range(func(_, v any) bool {
		if tq := v.(*taskQueue); tq.durable && !tq.replicated {
			list = append(list, tq)
		}
		return true
	})
	// Sized from the last one: a deep queue's state is megabytes, and
	// growing it by doubling would copy it many times over. The last
	// one's buffer is reused, up to maxKeptState: with 100,000 queues
	// the state is 20 MB, and a new one every 2 seconds is page faults
	// and garbage.
	out := d.stateBuf[:0]
	d.stateBuf = nil
	if want := d.lastSnap + d.lastSnap/8 + 64; cap(out) < want {
		out = make([]byte, 0, want)
	}
	out = append(out, stateMagic[:]...)
	out = append(out, 2, 0, 0, 0)
	out = binary.LittleEndian.AppendUint32(out, d.nextID)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(list)))
	for _, tq := range list {
		out = tq.appendState(out)
	}
	return d.appendExchanges(out)
}

// appendExchanges appends the definitions of the durable exchanges that
// have no queue, as version 2 of the state has them; d.mu is held.
func (d *durability) appendExchanges(out []byte) []byte {
	at := len(out)
	out = append(out, 0, 0, 0, 0)
	n := uint32(0)
	d.b.exchanges.Range(func(_, v any) bool {
		if ex := v.(*Exchange); ex.def.ID != 0 {
			dj := jsonBody(ex.def)
			out = binary.LittleEndian.AppendUint32(out, uint32(len(dj)))
			out = append(out, dj...)
			n++
		}
		return true
	})
	binary.LittleEndian.PutUint32(out[at:], n)
	return out
}

// maxKeptState bounds the buffer of a checkpoint's state kept for the
// next one.
const maxKeptState = 64 << 20

// maxKeptEntry bounds the part of a checkpoint a queue keeps for the
// next one (see cpEntry): an idle queue's is a few hundred bytes; a
// deep queue's index in RAM, megabytes, is encoded again each time
// rather than held twice.
const maxKeptEntry = 64 << 10

// cpEntry is a queue's part of the last checkpoint's state, kept so
// that the next checkpoint can write it again while neither the queue
// nor its definition changed.
type cpEntry struct {
	state   []byte // defLen u32 | def JSON | snapLen u32 | snapshot; nil: none kept
	version uint64 // the queue's snapshot version (queue.Queue.AppendSnapshotSince)
	defVer  uint64 // taskQueue.defVer when def was encoded
}

// appendState appends the queue's part of a checkpoint's state:
//
//	defLen u32 | def JSON | snapLen u32 | queue snapshot
//
// the checkpoint's lock (durability.cpMu) is held.
func (tq *taskQueue) appendState(out []byte) []byte {
	start := len(out)
	kept := &tq.cp
	tq.defMu.Lock()
	var version uint64
	if kept.state != nil && kept.defVer == tq.defVer {
		version = kept.version
		n := 4 + binary.LittleEndian.Uint32(kept.state)
		out = append(out, kept.state[:n]...)
	} else {
		dj := jsonBody(tq.def)
		out = binary.LittleEndian.AppendUint32(out, uint32(len(dj)))
		out = append(out, dj...)
	}
	defVer := tq.defVer
	tq.defMu.Unlock()
	at := len(out)
	out = append(out, 0, 0, 0, 0)
	out, version, changed := tq.q.AppendSnapshotSince(out, version)
	if !changed {
		// The definition above is the kept one: so is the snapshot.
		return append(out[:start], kept.state...)
	}
	binary.LittleEndian.PutUint32(out[at:], uint32(len(out)-at-4))
	if n := len(out) - start; n <= maxKeptEntry {
		buf := kept.state[:0]
		if cap(buf) > 4*n+256 {
			buf = nil // a queue that emptied does not keep a large buffer
		}
		*kept = cpEntry{state: append(buf, out[start:]...), version: version, defVer: defVer}
	} else {
		*kept = cpEntry{}
	}
	return out
}

// checkpoint saves the broker's state, then releases the definition
// records it covers.
func (d *durability) checkpoint() error {
	d.cpMu.Lock()
	defer d.cpMu.Unlock()
	bytes := d.log.Stats().AppendedBytes
	var covered []store.Ref
	var state []byte
	_, err := d.log.Checkpoint(func(store.Pos) ([]byte, error) {
		d.mu.Lock()
		defer d.mu.Unlock()
		covered, d.metaRefs = d.metaRefs, nil
		state = d.snapshot()
		d.lastSnap = len(state)
		return state, nil
	})
	if cap(state) <= maxKeptState {
		d.stateBuf = state[:0] // the log keeps nothing of it
	}
	if err != nil {
		d.mu.Lock()
		d.metaRefs = append(covered, d.metaRefs...)
		d.mu.Unlock()
		return err
	}
	d.lastCP, d.lastBytes = time.Now(), bytes
	if len(covered) > 0 {
		if err := d.log.Release(metaQueue, covered, nil); err != nil {
			d.b.log.Warn("store: releasing old definitions failed", "err", err)
		}
	}
	return nil
}

// loop checkpoints every CheckpointEvery while something is written, or
// sooner once CheckpointBytes were appended.
func (d *durability) loop() {
	defer close(d.done)
	t := time.NewTicker(min(d.cfg.CheckpointEvery/4, time.Second))
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case now := <-t.C:
			d.watchAlarms()
			bytes := d.log.Stats().AppendedBytes
			// Broker.Checkpoint may take one meanwhile: read under cpMu.
			d.cpMu.Lock()
			due := bytes > d.lastBytes && d.due(bytes-d.lastBytes, now.Sub(d.lastCP))
			d.cpMu.Unlock()
			if !due {
				continue
			}
			if err := d.checkpoint(); err != nil {
				d.b.log.Error("store: checkpoint failed", "err", err)
			}
		}
	}
}

// watchAlarms logs the memory and disk alarms as they go on and off.
func (d *durability) watchAlarms() {
	if m := d.b.cfg.Memory; m != nil {
		if on := m.Alarm(); on != d.memAlarm {
			d.memAlarm = on
			st := m.Stats()
			if on {
				d.b.log.Warn("memory alarm: the queues reached the memory budget; publishers wait for credit until it falls under 95%", "used", st.Used, "limit", st.Limit, "paged_out", st.PagedOut, "spilled", st.Spilled)
			} else {
				d.b.log.Info("memory alarm cleared", "used", st.Used, "limit", st.Limit)
			}
		}
	}
	if on := d.log.DiskAlarm(); on != d.diskAlarm {
		d.diskAlarm = on
		if on {
			d.b.log.Warn("disk alarm: free space under the store's minimum; publishers of durable queues wait for credit", "free", d.log.DiskFree())
		} else {
			d.b.log.Info("disk alarm cleared", "free", d.log.DiskFree())
		}
	}
}

// due reports whether a checkpoint is due, written bytes appended and
// elapsed time since the last one; d.cpMu is held. A checkpoint writes the queues' index
// in RAM, which a deep queue under a roomy memory budget makes large: so
// that checkpoints never write more than a quarter of what the queues
// append, the thresholds grow with the last checkpoint's size. A restart
// then replays at most four times that size.
func (d *durability) due(written uint64, elapsed time.Duration) bool {
	snap := uint64(d.lastSnap)
	return written >= max(d.cfg.CheckpointBytes, 4*snap) ||
		elapsed >= d.cfg.CheckpointEvery && written >= snap/2
}

// close takes a last checkpoint and closes the log.
func (d *durability) close() error {
	close(d.stop)
	<-d.done
	err := d.checkpoint()
	if cerr := d.log.Close(); err == nil {
		err = cerr
	}
	return err
}

// Store returns the broker's log, or nil without one.
func (b *Broker) Store() *store.Log {
	if b.dur == nil {
		return nil
	}
	return b.dur.log
}

// Checkpoint takes a checkpoint of the durable queues now; the broker
// also takes them on its own. Without a store it does nothing.
func (b *Broker) Checkpoint() error {
	if b.dur == nil {
		return nil
	}
	return b.dur.checkpoint()
}
