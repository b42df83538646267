package broker

import (
	"fmt"
	"slices"

	"github.com/cespare/xxhash/v2"
	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/vm"

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

// exprEnv is the environment expressions are compiled against.
type exprEnv struct {
	Key     string              `expr:"key"`
	Headers map[string]string   `expr:"headers"`
	Size    int                 `expr:"size"`
	Tag     string              `expr:"tag"`
	Members []map[string]string `expr:"members"`
}

func envOf(in *RouteInput) exprEnv {
	env := exprEnv{Key: in.Key, Headers: in.Header, Size: in.Size, Tag: in.Tag}
	if env.Headers == nil {
		env.Headers = map[string]string{}
	}
	env.Members = make([]map[string]string, len(in.Members))
	for i, m := range in.Members {
		env.Members[i] = map[string]string{"id": m.ID, "tag": m.ServiceTag, "conn_tag": m.ConnTag}
	}
	return env
}

// CompileExpr checks a key or route expression; it is what Declare runs.
func CompileExpr(src string, route bool) error {
	var err error
	if route {
		_, err = compileRouteExpr(src)
	} else {
		_, err = compileKeyExpr(src)
	}
	return err
}

func compileKeyExpr(src string) (KeyFunc, error) {
	prog, err := expr.Compile(src, expr.Env(exprEnv{}))
	if err != nil {
		return nil, err
	}
	return func(in *RouteInput) string {
		out, err := vm.Run(prog, envOf(in))
		if err != nil || out == nil {
			return ""
		}
		if s, ok := out.(string); ok {
			return s
		}
		return fmt.Sprint(out)
	}, nil
}

// compileRouteExpr compiles a route expression. It evaluates to nil (any
// handler), a string (a member id), or a map with the keys "member",
// "tag", "redirect", "reject", "key" and "headers".
func compileRouteExpr(src string) (RouteFunc, error) {
	prog, err := expr.Compile(src, expr.Env(exprEnv{}))
	if err != nil {
		return nil, err
	}
	return func(in *RouteInput) (Route, error) {
		out, err := vm.Run(prog, envOf(in))
		if err != nil {
			return Route{}, err
		}
		return routeOf(out)
	}, nil
}

func routeOf(out any) (Route, error) {
	var r Route
	switch v := out.(type) {
	case nil:
	case string:
		r.Member = v
	case map[string]any:
		for k, x := range v {
			s, isString := x.(string)
			switch k {
			case "member":
				r.Member = s
			case "tag":
				r.Tag = s
			case "redirect":
				r.Redirect = s
			case "reject":
				r.Reject = s
			case "key":
				key := fmt.Sprint(x)
				r.Key = &key
			case "headers":
				h, ok := x.(map[string]any)
				if !ok {
					return r, fmt.Errorf("headers must be a map, got %T", x)
				}
				r.Header = make(map[string]string, len(h))
				for hk, hv := range h {
					r.Header[hk] = fmt.Sprint(hv)
				}
				continue
			default:
				return r, fmt.Errorf("unknown route key %q (member, tag, redirect, reject, key, headers)", k)
			}
			if !isString && k != "key" {
				return r, fmt.Errorf("route %q must be a string, got %T", k, x)
			}
		}
	default:
		return r, fmt.Errorf("route expression gave %T; want nil, a member id or a map", out)
	}
	return r, nil
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
