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
	// Token is the fencing token of the leadership; Fenced says the
	// member was given one (leader events without tokens leave it
	// unset, and only the overlap check applies).
	Token  Token `json:"token"`
	Fenced bool  `json:"fenced,omitempty"`
	Start  int64 `json:"start_ns"`
	End    int64 `json:"end_ns"`
}

// CheckLeaders checks, per exchange, that no two members' leader
// intervals overlap, and, among fenced intervals, that each token
// belongs to one member and that tokens never decrease in the order
// leaderships began (so they strictly increase when the leader
// changes).
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
	fenced := 0
	for _, l := range s.Leaders {
		if l.Fenced {
			fenced++
		}
	}
	r.Checked = fmt.Sprintf("%d leader intervals (%d fenced) on %d exchanges: no overlap between members; fencing tokens unique per member and increasing", len(s.Leaders), fenced, len(exchanges))
	return r
}

// checkLeadersOf checks the intervals of one exchange.
func checkLeadersOf(r *Result, ex string, ls []LeaderInterval) {
	slices.SortStableFunc(ls, func(a, b LeaderInterval) int { return cmp.Compare(a.Start, b.Start) })
	for j, b := range ls {
		for _, a := range ls[:j] {
			if a.Member != b.Member && b.Start < a.End {
				r.violate("exchange %q: leaders overlap: %s %s–%s and %s from %s",
					ex, a.Member, ms(a.Start), ms(a.End), b.Member, ms(b.Start))
			}
		}
	}
	owner := map[Token]string{}
	var prev *LeaderInterval
	for _, b := range ls {
		if !b.Fenced {
			continue
		}
		if m, ok := owner[b.Token]; ok && m != b.Member {
			r.violate("exchange %q: token %s given to %s and to %s", ex, b.Token, m, b.Member)
		}
		owner[b.Token] = b.Member
		if prev != nil && b.Token.Compare(prev.Token) < 0 {
			r.violate("exchange %q: token went back from %s (%s) to %s (%s at %s)", ex, prev.Token, prev.Member, b.Token, b.Member, ms(b.Start))
		}
		prev = &b
	}
}
