package clustertest

import (
	"cmp"
	"fmt"
	"slices"
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
	Token    Token  `json:"token"`
	Start    int64  `json:"start_ns"`
	End      int64  `json:"end_ns"`
}

// CheckLeaders checks, per exchange, that no two members' leader
// intervals overlap, that each token belongs to one member, and that
// tokens never decrease in the order leaderships began and strictly
// increase when the leader changes.
func CheckLeaders(s Snapshot) Result {
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
	for _, ex := range exchanges {
		checkLeadersOf(&r, ex, by[ex])
	}
	r.Checked = fmt.Sprintf("%d leader intervals on %d exchanges: no overlap between members, fencing tokens unique per member and increasing", len(s.Leaders), len(exchanges))
	return r
}

// checkLeadersOf checks the intervals of one exchange.
func checkLeadersOf(r *Result, ex string, ls []LeaderInterval) {
	slices.SortStableFunc(ls, func(a, b LeaderInterval) int { return cmp.Compare(a.Start, b.Start) })
	owner := map[Token]string{}
	for j, b := range ls {
		for _, a := range ls[:j] {
			if a.Member != b.Member && b.Start < a.End {
				r.violate("exchange %q: leaders overlap: %s (token %s) %s–%s and %s (token %s) from %s",
					ex, a.Member, a.Token, ms(a.Start), ms(a.End), b.Member, b.Token, ms(b.Start))
			}
		}
		if m, ok := owner[b.Token]; ok && m != b.Member {
			r.violate("exchange %q: token %s given to %s and to %s", ex, b.Token, m, b.Member)
		}
		owner[b.Token] = b.Member
		if j == 0 {
			continue
		}
		a := ls[j-1]
		switch c := b.Token.Compare(a.Token); {
		case c < 0:
			r.violate("exchange %q: token went back from %s (%s) to %s (%s at %s)", ex, a.Token, a.Member, b.Token, b.Member, ms(b.Start))
		case c == 0 && a.Member != b.Member:
			// Reported above as a token with two owners.
		}
	}
}
