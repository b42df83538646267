package queue

import (
	"context"
	"fmt"

	"github.com/courier-mq/courier/internal/store"
)

// StoreJournal is a durable queue's [Journal] on the node's store.Log,
// which all the node's queues share: Log is that log and QueueID the
// queue's id in it (the broker assigns ids and keeps them with the
// queue's definition). It is also a [Reader] (bodies of paged messages),
// a [Spiller] (the store's run files), an [Admitter] (the store's flow
// control, [store.Log.WaitSpace]) and a [DiskAlarmer]
// ([store.Log.DiskAlarm]).
//
// After a restart, feed the log's records to each queue's [Rebuilder]
// with [ReplayLog].
type StoreJournal struct {
	Log     *store.Log
	QueueID uint32
}

var (
	_ Journal     = StoreJournal{}
	_ Reader      = StoreJournal{}
	_ Spiller     = StoreJournal{}
	_ Admitter    = StoreJournal{}
	_ DiskAlarmer = StoreJournal{}
)

func toStoreRef(r Ref) store.Ref {
	return store.Ref{Pos: store.Pos{Seg: r.Seg, Off: r.Off}, Len: r.Len}
}

func fromStoreRef(r store.Ref) Ref { return Ref{Seg: r.Seg, Off: r.Off, Len: r.Len} }

// Append implements [Journal] with [store.Log.AppendNoWait]: the queue
// waits for flow control in Admit, without its lock.
func (j StoreJournal) Append(kind Kind, payload []byte, done func(error)) (Ref, error) {
	r, err := j.Log.AppendNoWait(j.QueueID, store.Kind(kind), payload, done)
	return fromStoreRef(r), err
}

// Release implements [Journal]; it never waits for flow control.
func (j StoreJournal) Release(refs []Ref, done func(error)) error {
	var buf [4]store.Ref
	sr := buf[:0]
	if len(refs) > len(buf) {
		sr = make([]store.Ref, 0, len(refs))
	}
	for _, r := range refs {
		sr = append(sr, toStoreRef(r))
	}
	return j.Log.Release(j.QueueID, sr, done)
}

// Read implements [Reader].
func (j StoreJournal) Read(ref Ref) ([]byte, error) {
	rec, err := j.Log.Read(toStoreRef(ref), nil)
	if err == nil && rec.Queue != j.QueueID {
		err = fmt.Errorf("read %v: record of queue %d, not %d", ref, rec.Queue, j.QueueID)
	}
	return rec.Payload, err
}

// Admit implements [Admitter].
func (j StoreJournal) Admit(ctx context.Context) error { return j.Log.WaitSpace(ctx) }

// DiskAlarm implements [DiskAlarmer].
func (j StoreJournal) DiskAlarm() bool { return j.Log.DiskAlarm() }

// WriteRun implements [Spiller].
func (j StoreJournal) WriteRun(data []byte) (uint32, error) { return j.Log.WriteRun(j.QueueID, data) }

// ReadRun implements [Spiller].
func (j StoreJournal) ReadRun(num uint32, off int64, buf []byte) (int, error) {
	return j.Log.ReadRun(j.QueueID, num, off, buf)
}

// DropRun implements [Spiller].
func (j StoreJournal) DropRun(num uint32) { j.Log.DropRun(j.QueueID, num) }

// Runs implements [Spiller].
func (j StoreJournal) Runs() []uint32 { return j.Log.Runs(j.QueueID) }

// ReplayLog hands every record of log (those after its checkpoint, see
// [store.Log.Replay]) to the Rebuilder of its queue: rebuilders returns
// it for a queue id, or nil for a queue that no longer exists (its
// records are skipped). Records that do not decode are skipped by the
// Rebuilder and counted in skipped; ReplayLog fails only if the log
// cannot be read.
func ReplayLog(log *store.Log, rebuilders func(queueID uint32) *Rebuilder) (skipped int, err error) {
	var rel []store.Ref
	e := Entry{}
	err = log.Replay(func(rec store.Record) error {
		rb := rebuilders(rec.Queue)
		if rb == nil {
			return nil
		}
		e = Entry{Ref: fromStoreRef(rec.Ref), Kind: Kind(rec.Kind), Payload: rec.Payload, Released: e.Released[:0]}
		if rec.Kind == store.KindRelease {
			var err error
			if rel, err = rec.Released(rel[:0]); err != nil {
				skipped++
				return nil
			}
			for _, r := range rel {
				e.Released = append(e.Released, fromStoreRef(r))
			}
			e.Payload = nil
		}
		if rb.Apply(e) != nil {
			skipped++
		}
		return nil
	})
	return skipped, err
}
