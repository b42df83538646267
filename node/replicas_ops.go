package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/internal/cluster/meta"
	"github.com/courier-mq/courier/internal/cluster/replica"
)

// Moving replicas (issue 15, item 4; docs/queues.md, "Replicated
// queues"). The metadata record of a replicated queue is the truth: an
// operator's request changes it (meta.ChangeQueueMember,
// meta.MoveQueueLeader), and the node whose replica leads the queue
// carries the change out in the queue's group, from the queue's own
// goroutine (replicas.go), and reports it done. A crash at any point
// leaves the record saying what is under way; whichever replica leads
// next finds it there and finishes it from where the group's
// configuration stands.

// catchUpPoll is how often a leader looks at a learner's progress.
const catchUpPoll = 100 * time.Millisecond

// manage runs on the queue's goroutine while this node serves the
// queue in s.term: it starts the record's membership change, if any and
// not running yet, and hands the leadership over when the record asks
// the leader of this term to.
func (s *serving) manage(ctx context.Context) {
	if s.term == 0 {
		return
	}
	ex := s.q.exchange()
	if ex.Change != "" && s.changing.CompareAndSwap(false, true) {
		go func() {
			defer s.changing.Store(false)
			s.q.changeMember(ctx, s.g, ex, s.term)
		}()
	}
	self := s.q.r.n.cfg.Name
	if ex.MoveTo != "" && ex.MoveTo != self && ex.MoveTerm == s.term && s.moved != s.term {
		s.moved = s.term
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.g.TransferLeadership(tctx, replicaID(ex.MoveTo))
		cancel()
		if err != nil {
			s.log.Warn("replicated queue: handing the leadership over failed", "to", ex.MoveTo, "err", err)
		} else {
			s.log.Info("replicated queue: leadership handed over", "to", ex.MoveTo)
		}
	}
}

// changeMember carries out the membership change of ex's record in
// group g, which this node leads in term: until it is done, the record
// changes, this replica stops leading or ctx ends. Each step looks at
// the group's configuration first, so that it resumes a change a former
// leader left half done.
func (q *replicatedQueue) changeMember(ctx context.Context, g *replica.Group, ex meta.Exchange, term uint64) {
	log := q.r.n.cfg.Log.With("queue", ex.Name, "change", ex.Change)
	node := ex.Change[1:]
	id := replicaID(node)
	remove := ex.Change[0] == '-'
	var prevCommit uint64
	for {
		if cur := q.exchange(); cur.Change != ex.Change || cur.Group != ex.Group {
			return
		}
		st, err := g.Status()
		if err != nil || st.Role != "leader" || st.Term != term {
			return
		}
		voter, learner := slices.Contains(st.Voters, id), slices.Contains(st.Learners, id)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		switch {
		case remove && node == q.r.n.cfg.Name:
			// The leader removes itself by handing over first: the next
			// leader carries on.
			err = handOver(cctx, g, st)
		case remove && (voter || learner):
			err = g.RemoveReplica(cctx, id)
		case !remove && !voter && !learner:
			err = g.AddLearner(cctx, id)
		case !remove && learner:
			// Promoted once its log reached the commit index of the
			// previous look: it keeps up with the queue.
			if m := st.Match[id]; prevCommit == 0 || m < prevCommit {
				prevCommit = st.Commit
				err = errNotYet
				break
			}
			err = g.AddVoter(cctx, id)
		default:
			err = q.r.n.meta.QueueMemberDone(cctx, ex.Name, ex.Group, node, remove)
			if err == nil || errors.Is(err, meta.ErrStale) {
				cancel()
				log.Info("replicated queue: membership change done")
				return
			}
		}
		cancel()
		if err != nil && !errors.Is(err, errNotYet) && !errors.Is(err, replica.ErrConfChangePending) {
			log.Debug("replicated queue: membership change step", "err", err)
		}
		if err == nil {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(catchUpPoll):
		}
	}
}

// errNotYet is a learner still catching up.
var errNotYet = errors.New("learner still catching up")

// handOver transfers the leadership of g to its voter the furthest
// along, other than this replica.
func handOver(ctx context.Context, g *replica.Group, st replica.Status) error {
	var to, best uint64
	for _, v := range st.Voters {
		if v != st.ID && (to == 0 || st.Match[v] > best) {
			to, best = v, st.Match[v]
		}
	}
	if to == 0 {
		return fmt.Errorf("no other voter to hand the leadership to")
	}
	return g.TransferLeadership(ctx, to)
}

// changing flags a running membership change; moved is the term whose
// move request was acted on.
type servingOps struct {
	changing atomic.Bool
	moved    uint64
}

// joining reports whether this node's replica of ex is being added: it
// opens the group empty and waits for the leader's log.
func joining(ex meta.Exchange, self string) bool {
	return ex.Change == "+"+self
}
