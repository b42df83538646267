package clustertest

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Token is a leader's fencing token: the home node's liveness epoch,
// then the exchange's term. Both only grow, so tokens compare
// lexicographically.
type Token struct {
	Epoch uint64 `json:"epoch"`
	Term  uint64 `json:"term"`
}

// Compare orders tokens: -1, 0 or +1.
func (t Token) Compare(u Token) int {
	if c := cmp.Compare(t.Epoch, u.Epoch); c != 0 {
		return c
	}
	return cmp.Compare(t.Term, u.Term)
}

func (t Token) String() string { return fmt.Sprintf("%d.%d", t.Epoch, t.Term) }

// LeaderInterval is a time during which a member believed it led an
// exchange, as its client recorded it: Start when the leader event came,
// End when the member learnt it lost the lead (a leader-lost or
// member-down event, its connection's end, its node's kill). End 0 means
// it still led when the history ended. Record Start late and End early
// only if the member's own view allows it: the checker's promise is
// about what members act on.
type LeaderInterval struct {
	Exchange string `json:"exchange"`
	Member   string `json:"member"`
	Node     string `json:"node,omitempty"`
	// Token is the fencing token of the leadership; Fenced says the
	// member was given one (leader events without tokens leave it
	// unset, and only the overlap check applies).
	Token  Token `json:"token"`
	Fenced bool  `json:"fenced,omitempty"`
	Start  int64 `json:"start_ns"`
	End    int64 `json:"end_ns"`
}

// LeaderOptions tune [CheckLeaders].
type LeaderOptions struct {
	// Grace widens each fault window after the fault ends. Default: 3s.
	Grace time.Duration
	// Slack is how long two fenced leaderships of different members may
	// overlap outside fault windows: the time the old leader's node
	// takes to apply the view that names the new one and tell its
	// member. Default: 1s.
	Slack time.Duration
}

// CheckLeaders checks what docs/cluster.md ("Leaders across nodes")
// promises of leaders, per exchange:
//
//   - a fencing token belongs to one member: two members never lead
//     under the same token;
//   - tokens only grow: on each node, in the order its members' leaderships
//     began (the events of one node come from its views, in order), and
//     for each member;
//   - two members' leaderships overlap only where tokens tell them apart
//     (both fenced): a leader paused or cut off cannot know it lost, and
//     the token is what fences it. Such overlaps are notes inside fault
//     windows; outside them an overlap longer than Slack is a violation
//     (without a fault the old leader's node hears of the new one within
//     a round trip).
//
// Leaderships without tokens (a single node, before fencing) must not
// overlap at all.
func CheckLeaders(s Snapshot, o LeaderOptions) Result {
	if o.Grace <= 0 {
		o.Grace = 3 * time.Second
	}
	if o.Slack <= 0 {
		o.Slack = time.Second
	}
	r := Result{Checker: "leaders"}
	by := map[string][]LeaderInterval{}
	var exchanges []string
	for _, l := range s.Leaders {
		if l.End == 0 {
			l.End = s.Duration
		}
		if _, ok := by[l.Exchange]; !ok {
			exchanges = append(exchanges, l.Exchange)
		}
		by[l.Exchange] = append(by[l.Exchange], l)
	}
	windows := s.FaultWindows(o.Grace)
	var fenced overlaps
	for _, ex := range exchanges {
		fenced.add(checkLeadersOf(&r, ex, by[ex], windows, int64(o.Slack)))
	}
	if fenced.n > 0 {
		r.note("%d overlaps of leaderships told apart by their fencing tokens, inside fault windows (+%v) or within %v; longest %s",
			fenced.n, o.Grace, o.Slack, ms(fenced.longest))
	}
	nf := 0
	for _, l := range s.Leaders {
		if l.Fenced {
			nf++
		}
	}
	r.Checked = fmt.Sprintf("%d leader intervals (%d fenced) on %d exchanges: tokens unique per member and growing per node and member; overlaps only between fenced leaderships, outside fault windows at most %v",
		len(s.Leaders), nf, len(exchanges), o.Slack)
	return r
}

// overlaps counts overlaps the tokens resolve.
type overlaps struct {
	n       int
	longest int64
}

func (o *overlaps) add(p overlaps) {
	o.n += p.n
	o.longest = max(o.longest, p.longest)
}

// checkLeadersOf checks the intervals of one exchange.
func checkLeadersOf(r *Result, ex string, ls []LeaderInterval, windows [][2]int64, slack int64) overlaps {
	slices.SortStableFunc(ls, func(a, b LeaderInterval) int { return cmp.Compare(a.Start, b.Start) })
	var resolved overlaps
	for j, b := range ls {
		for _, a := range ls[:j] {
			if a.Member == b.Member || b.Start >= a.End {
				continue
			}
			d := min(a.End, b.End) - b.Start
			switch {
			case !a.Fenced || !b.Fenced:
				r.violate("exchange %q: leaders overlap without fencing tokens: %s %s–%s and %s from %s",
					ex, a.Member, ms(a.Start), ms(a.End), b.Member, ms(b.Start))
			case a.Token == b.Token:
				// reported below as a token given to two members
			case d > slack && !inWindows(windows, b.Start):
				r.violate("exchange %q: leaders overlap for %s outside any fault window: %s (token %s) %s–%s and %s (token %s) from %s",
					ex, ms(d), a.Member, a.Token, ms(a.Start), ms(a.End), b.Member, b.Token, ms(b.Start))
			default:
				resolved.add(overlaps{1, d})
			}
		}
	}
	owner := map[Token]string{}
	last := map[string]LeaderInterval{} // per node, then per member
	for _, b := range ls {
		if !b.Fenced {
			continue
		}
		if m, ok := owner[b.Token]; ok && m != b.Member {
			r.violate("exchange %q: token %s given to %s and to %s", ex, b.Token, m, b.Member)
		}
		owner[b.Token] = b.Member
		for _, k := range []string{"node " + b.Node, "member " + b.Member} {
			if prev, ok := last[k]; ok && b.Token.Compare(prev.Token) < 0 {
				r.violate("exchange %q: token went back on %s from %s (%s) to %s (%s at %s)", ex, k, prev.Token, prev.Member, b.Token, b.Member, ms(b.Start))
			}
			last[k] = b
		}
	}
	return resolved
}
