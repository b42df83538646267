package broker

import (
	"sync/atomic"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/queue"
)

// Dead letters and permissions. A task exchange's dead letters are
// submitted or published to its dead_letter exchange on behalf of the
// exchange's declarer, whose write permission on that exchange was
// checked at declaration (Broker.checkDeadLetter) and is checked again
// at each dead letter, against the permissions of the moment: one that
// was revoked since (a change through the management API, a reload on
// SIGHUP, the user deleted) stops the dead letters, which are then
// dropped, counted (QueueInfo.DeadLetterDropped) and logged at most
// every dlWarnEvery per queue. A missing dead_letter exchange drops them
// the same way, as RabbitMQ does.

// dlWarnEvery is the least time between two warnings about a queue's
// dropped dead letters.
const dlWarnEvery = 10 * time.Second

// owner is a task exchange's declarer as its dead letters are checked.
type owner struct {
	user    string
	trusted bool        // checked by nothing
	policy  auth.Policy // nil and not trusted: refuse (fail closed)
	grant   atomic.Pointer[dlGrant]
}

// dlGrant caches the answer of the policy for one version of it.
type dlGrant struct {
	version uint64
	ok      bool
}

// ownerOf returns the owner of def: the declarer by that made it, or,
// brought back from the store (by is then trusted), the user its
// definition holds, checked against the broker's policy.
func (b *Broker) ownerOf(def queueDef, by Declarer) *owner {
	if def.Trusted {
		return &owner{trusted: true}
	}
	p := by.Policy
	if p == nil {
		p = b.cfg.Policy
	}
	return &owner{user: def.DeclaredBy, policy: p}
}

// mayWrite reports whether the owner may write to target now: one
// policy lookup per change of the users, then one atomic load.
func (o *owner) mayWrite(target string) bool {
	if o.trusted {
		return true
	}
	if o.policy == nil {
		return false
	}
	v := o.policy.Version()
	if g := o.grant.Load(); g != nil && g.version == v {
		return g.ok
	}
	ok := o.policy.Perms(o.user, target)&auth.Write != 0
	o.grant.Store(&dlGrant{version: v, ok: ok})
	return ok
}

// refusal says why the owner's dead letters to target are dropped.
func (o *owner) refusal(target string) string {
	switch {
	case o.policy == nil:
		return "the declarer's permissions are unknown (no policy)"
	case o.user == "":
		return "the exchange was declared anonymously (or before declarers were recorded) and the node now has users; declare it again as a user with write permission on " + target
	}
	return "its declarer " + o.user + " has no write permission on " + target + " any more"
}

// dropDeadLetter counts a dead letter that goes nowhere and logs it, at
// most every dlWarnEvery per queue.
func (tq *taskQueue) dropDeadLetter(dl queue.DeadLetter, target, why string) {
	n := tq.dlDropped.Add(1)
	now := time.Now().UnixNano()
	last := tq.dlWarned.Load()
	if last != 0 && now-last < int64(dlWarnEvery) || !tq.dlWarned.CompareAndSwap(last, now) {
		return
	}
	tq.b.log.Warn("dead letter dropped: "+why, "queue", dl.Queue, "dead_letter", target, "task", dl.Message.ID, "reason", dl.Reason, "dropped", n)
}

// adopt makes by the declarer of the task exchange, when a declaration
// of it by by (not passive: configure permission) names its dead_letter,
// by may write to it, and the recorded declarer may not: the way to
// restore the dead letters of an exchange declared anonymously, or by a
// user who lost the permission, without deleting its tasks. The change
// is durable with the definition.
func (ex *Exchange) adopt(spec Spec, by Declarer) {
	tq := ex.tq
	target := ex.cfg.DeadLetter
	if tq == nil || spec.Passive || spec.DeadLetter == "" || spec.DeadLetter != target {
		return
	}
	if tq.owner.Load().mayWrite(target) || !by.mayWrite(target) {
		return
	}
	b := tq.b
	b.qmu.Lock()
	defer b.qmu.Unlock()
	if b.Exchange(ex.name) != ex {
		return // deleted meanwhile
	}
	tq.defMu.Lock()
	def := tq.def
	tq.defMu.Unlock()
	def.DeclaredBy, def.Trusted = by.User, by.Policy == nil
	err := b.defineQueue(def, func() {
		tq.defMu.Lock()
		tq.def.DeclaredBy, tq.def.Trusted = def.DeclaredBy, def.Trusted
		tq.defVer++
		tq.defMu.Unlock()
		tq.owner.Store(b.ownerOf(def, by))
	})()
	if err != nil {
		b.log.Error("store: recording the new declarer of an exchange failed; it may revert at restart", "exchange", ex.name, "err", err)
	}
	b.log.Info("dead letters restored: the exchange's declarer is now the user who declared it again", "exchange", ex.name, "user", by.User, "dead_letter", target)
}
