package broker

import (
	"fmt"
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/wire"
)

// Aliases of the public routing types, so that the broker reads plainly.
type (
	RouteInput = courier.RouteInput
	Route      = courier.Route
	KeyFunc    = courier.KeyFunc
	RouteFunc  = courier.RouteFunc
)

func routeInput(f *wire.Frame, g *group) *RouteInput {
	in := &RouteInput{Key: f.Key, Header: f.Header, Size: len(f.Body), Tag: f.Tag}
	in.Members = make([]wire.Member, len(g.members))
	for i, m := range g.members {
		in.Members[i] = m.info()
	}
	return in
}

// CompileExpr checks a key (route false) or route expression against the
// default limits; Declare does the same against the broker's.
func CompileExpr(src string, route bool) error {
	_, err := compileExpr(src, exprLimits{cost: DefaultExprCost, time: DefaultExprTime})
	return err
}

// ring is a consistent-hash ring over handlers, with virtual nodes, so
// that a handler joining or leaving moves only its own share of keys.
type ring struct {
	hashes []uint64
	owners []*Attachment
}

const vnodes = 128

func newRing(members []*Attachment) *ring {
	r := &ring{}
	type point struct {
		h uint64
		a *Attachment
	}
	pts := make([]point, 0, len(members)*vnodes)
	var buf []byte
	for _, m := range members {
		// Hash on the member's stable identity: its connection tag when
		// given (so a restarted handler gets its keys back), else its id.
		id := m.member
		if m.connTag != "" {
			id = m.serviceTag + "/" + m.connTag
		}
		for v := range vnodes {
			buf = fmt.Appendf(buf[:0], "%s#%d", id, v)
			pts = append(pts, point{xxhash.Sum64(buf), m})
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return 0
	})
	r.hashes = make([]uint64, len(pts))
	r.owners = make([]*Attachment, len(pts))
	for i, p := range pts {
		r.hashes[i], r.owners[i] = p.h, p.a
	}
	return r
}

func (r *ring) pick(key string) *Attachment {
	h := xxhash.Sum64String(key)
	i, _ := slices.BinarySearch(r.hashes, h)
	if i == len(r.hashes) {
		i = 0
	}
	return r.owners[i]
}
