package broker

import (
	"strings"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
)

// A session opened with a policy ([Broker.OpenAs]) checks each DECLARE,
// DELETE, ATTACH, SUBSCRIBE, PUBLISH and REQUEST against its user's
// permissions. The answer for an exchange is cached in the session and
// kept while the policy's version stays the same, so that a publish costs
// one atomic load and one map lookup, never a pattern match. A session
// opened without a policy (embedded, trusted) checks nothing.

// maxGrants bounds a session's cache; past it the cache starts over.
const maxGrants = 1024

// loggedShift places, in a cached grant, the bits that mark a denial of
// each permission as logged (need << loggedShift): a client retrying in
// a loop is logged once per exchange, permission and policy version, not
// per frame.
const loggedShift = 4

// grants is an immutable cache of a session's permissions by exchange;
// a miss replaces it with a copy.
type grants struct {
	version uint64
	perms   map[string]auth.Perm
}

// OpenAs is [Broker.Open] for a session of user whose every operation is
// checked against policy. With a nil policy the session may do anything.
func (b *Broker) OpenAs(sink Sink, name, user string, policy auth.Policy) *Session {
	s := b.open(sink, name)
	s.user, s.policy = user, policy
	b.register(s)
	return s
}

// User returns the user the session authenticated as; "" for an
// anonymous or embedded session.
func (s *Session) User() string { return s.user }

// allowed reports whether the session may do op on exchange. It is cheap
// for an unchecked session and, once cached, for a checked one.
func (s *Session) allowed(op auth.Perm, exchange string) bool {
	if s.policy == nil {
		return true
	}
	return s.perms(exchange)&op != 0
}

// perms returns the cached permissions on exchange, asking the policy on
// a miss or after the policy changed.
func (s *Session) perms(exchange string) auth.Perm {
	v := s.policy.Version()
	g := s.grants.Load()
	if g != nil && g.version == v {
		if p, ok := g.perms[exchange]; ok {
			return p
		}
	}
	p := s.policy.Perms(s.user, exchange)
	s.remember(g, v, exchange, p)
	return p
}

// remember stores p for exchange in a copy of g (or a new cache when g is
// of another version or full). Two goroutines of an embedded session may
// race here; the loser's entry is lost and asked again later.
func (s *Session) remember(g *grants, v uint64, exchange string, p auth.Perm) {
	next := &grants{version: v}
	if g != nil && g.version == v && len(g.perms) < maxGrants {
		next.perms = make(map[string]auth.Perm, len(g.perms)+1)
		for k, x := range g.perms {
			next.perms[k] = x
		}
	} else {
		next.perms = make(map[string]auth.Perm, 1)
	}
	next.perms[exchange] = p
	s.grants.CompareAndSwap(g, next)
}

// deny returns the error for a refused op and logs the first refusal of
// each exchange per policy version.
func (s *Session) deny(op string, need auth.Perm, exchange string) *wire.Error {
	p := s.perms(exchange)
	if logged := need << loggedShift; p&logged == 0 {
		s.b.log.Warn("permission denied", "user", s.user, "conn", s.id, "op", op, "need", need.String(), "exchange", exchange)
		if g := s.grants.Load(); g != nil && g.version == s.policy.Version() {
			s.remember(g, g.version, exchange, p|logged)
		}
	}
	return wire.Errorf(wire.CodeUnauthorized, "access refused: user %q has no %s permission on exchange %q (%s)", s.user, strings.ReplaceAll(need.String(), "+", " or "), exchange, op)
}

// mayConfigure reports whether the session may declare or delete
// exchange; it may always look at one (a DECLARE that matches an
// existing exchange) with any permission on it.
func (s *Session) mayConfigure(exchange string) (configure, any bool) {
	if s.policy == nil {
		return true, true
	}
	p := s.perms(exchange) & auth.All
	return p&auth.Configure != 0, p != 0
}

// attachNeeds is the permission an attachment in role needs: a
// controller owns the exchange's subscriptions (configure); handlers and
// subscribers receive (read).
func attachNeeds(role uint64) auth.Perm {
	if role == wire.RoleController {
		return auth.Configure
	}
	return auth.Read
}

// Reauthorize checks every attachment of every checked session against
// its policy now, and detaches those whose permission was revoked: they
// receive EVENT detached and their member leaves its group. The node
// calls it after users or permissions change (a management API change, a
// reload on SIGHUP). Operations are checked anyway; this ends what
// earlier checks allowed.
func (b *Broker) Reauthorize() int {
	b.mu.RLock()
	sessions := make([]*Session, 0, len(b.sessions))
	for _, s := range b.sessions {
		if s.policy != nil {
			sessions = append(sessions, s)
		}
	}
	b.mu.RUnlock()
	n := 0
	for _, s := range sessions {
		// Taken out under the session's lock, so that a DETACH racing
		// with this drops each attachment once.
		s.mu.Lock()
		var revoked []*Attachment
		for id, a := range s.attachments {
			if !s.allowed(attachNeeds(a.role), a.ex.name) {
				delete(s.attachments, id)
				revoked = append(revoked, a)
			}
		}
		s.mu.Unlock()
		for _, a := range revoked {
			b.log.Warn("attachment ended: permission revoked", "user", s.user, "conn", s.id, "member", a.member, "exchange", a.ex.name, "role", wire.RoleName(a.role))
			s.forget(a)
			s.drop(a)
			a.sendDetached("permission revoked: user " + s.user + " may no longer attach to exchange " + a.ex.name)
		}
		n += len(revoked)
	}
	return n
}

// Declarer is who declares an exchange. A task exchange keeps its
// declarer with its definition, durably, and sends a dead letter to its
// dead_letter exchange only while the declarer may write to it: a user
// cannot route its tasks, through dead-lettering, into an exchange it
// may not submit or publish to.
type Declarer struct {
	// User is the declarer's user name; "" for an anonymous client of a
	// node without users.
	User string
	// Policy answers what User may do; nil for a trusted declarer (an
	// embedded connection, the node's own code), which may do anything.
	Policy auth.Policy
}

// Trusted returns a declarer that may do anything.
func Trusted() Declarer { return Declarer{} }

// declarer returns the session's user as a declarer.
func (s *Session) declarer() Declarer {
	return Declarer{User: s.user, Policy: s.policy}
}

// mayWrite reports whether by may write to exchange now.
func (by Declarer) mayWrite(exchange string) bool {
	return by.Policy == nil || by.Policy.Perms(by.User, exchange)&auth.Write != 0
}

// checkDeadLetter refuses a task exchange whose dead_letter exchange its
// declarer may not write to.
func (b *Broker) checkDeadLetter(name string, cfg wire.ExchangeConfig, by Declarer) error {
	if cfg.Pattern != wire.PatternTasks || cfg.DeadLetter == "" || by.mayWrite(cfg.DeadLetter) {
		return nil
	}
	b.log.Warn("permission denied", "user", by.User, "op", "declare with dead_letter", "need", auth.Write.String(), "exchange", cfg.DeadLetter, "declared", name)
	return wire.Errorf(wire.CodeUnauthorized, "access refused: user %q has no write permission on exchange %q (dead_letter of %q)", by.User, cfg.DeadLetter, name)
}
