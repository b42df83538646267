package broker

import (
	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/internal/store"
)

// storeJournal is one queue's share of the node's store.Log, as the queue
// package's Journal and Reader. The queue calls Append and Release with its
// lock held, one call at a time, so the conversion buffer is the queue's.
type storeJournal struct {
	log *store.Log
	id  uint32 // the queue's id in the log
	rel []store.Ref
}

var (
	_ queue.Journal = (*storeJournal)(nil)
	_ queue.Reader  = (*storeJournal)(nil)
)

func toStore(r queue.Ref) store.Ref {
	return store.Ref{Pos: store.Pos{Seg: r.Seg, Off: r.Off}, Len: r.Len}
}

func fromStore(r store.Ref) queue.Ref { return queue.Ref{Seg: r.Seg, Off: r.Off, Len: r.Len} }

func (j *storeJournal) Append(kind queue.Kind, payload []byte, done func(error)) (queue.Ref, error) {
	r, err := j.log.Append(j.id, store.Kind(kind), payload, done)
	return fromStore(r), err
}

func (j *storeJournal) Release(refs []queue.Ref, done func(error)) error {
	j.rel = j.rel[:0]
	for _, r := range refs {
		j.rel = append(j.rel, toStore(r))
	}
	return j.log.Release(j.id, j.rel, done)
}

func (j *storeJournal) Read(ref queue.Ref) ([]byte, error) {
	rec, err := j.log.Read(toStore(ref), nil)
	return rec.Payload, err
}
