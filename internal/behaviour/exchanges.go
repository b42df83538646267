package behaviour

import (
	"slices"
	"strings"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
)

func (s *suite) testExchanges(t *testing.T) {
	t.Run("Clash", func(t *testing.T) {
		e := s.env(t)
		rr := e.reqresp()
		_, err := e.c.PubSub(e.ctx, rr.Name())
		mustErr(t, err, courier.ErrClash, "pub-sub over request-response")
		_, err = e.c.ReqResp(e.ctx, rr.Name(), courier.RoundRobin)
		mustErr(t, err, courier.ErrClash, "round-robin over broadcast")
		if _, err := e.c.ReqResp(e.ctx, rr.Name()); err != nil {
			t.Fatalf("open without options: %v", err)
		}
		if _, err := e.c.ReqResp(e.ctx, rr.Name(), courier.Broadcast); err != nil {
			t.Fatalf("open with the same strategy: %v", err)
		}
		ps := e.pubsub()
		_, err = e.c.ReqResp(e.ctx, ps.Name())
		mustErr(t, err, courier.ErrClash, "request-response over pub-sub")
		_, err = e.c.PubSub(e.ctx, ps.Name(), courier.Controlled())
		mustErr(t, err, courier.ErrClash, "controlled over uncontrolled")
		sf := e.reqresp(courier.KeyExpr(`key`))
		_, err = e.c.ReqResp(e.ctx, sf.Name(), courier.KeyExpr(`headers["user"]`))
		mustErr(t, err, courier.ErrClash, "another key expression")
	})
	t.Run("BadOptions", func(t *testing.T) {
		cases := []struct {
			name   string
			exName string // "" for a fresh valid name
			pubsub bool
			opts   []courier.ExchangeOption
		}{
			{name: "unknown strategy", opts: []courier.ExchangeOption{courier.Strategy("zigzag")}},
			{name: "empty name", exName: "-"},
			{name: "space in name", exName: "has space"},
			{name: "empty word", exName: "a..b"},
			{name: "leading dot", exName: ".a"},
			{name: "trailing dot", exName: "a."},
			{name: "slash", exName: "a/b"},
			{name: "too long", exName: strings.Repeat("x", 256)},
			{name: "key expr syntax", opts: []courier.ExchangeOption{courier.KeyExpr(`headers[`)}},
			{name: "key expr unknown name", opts: []courier.ExchangeOption{courier.KeyExpr(`nosuchvar + 1`)}},
			{name: "route expr syntax", opts: []courier.ExchangeOption{courier.RouteExpr(`{"tag": `)}},
			{name: "sticky-fun without key", opts: []courier.ExchangeOption{courier.StickyFun}},
			{name: "fun without route", opts: []courier.ExchangeOption{courier.Fun}},
			{name: "key expr with round-robin", opts: []courier.ExchangeOption{courier.KeyExpr(`key`), courier.RoundRobin}},
			{name: "controlled request-response", opts: []courier.ExchangeOption{courier.Controlled()}},
			{name: "pub-sub with strategy", pubsub: true, opts: []courier.ExchangeOption{courier.RoundRobin}},
			{name: "pub-sub with key expr", pubsub: true, opts: []courier.ExchangeOption{courier.KeyExpr(`key`)}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				e := s.env(t)
				name := e.name()
				switch tc.exName {
				case "":
				case "-":
					name = ""
				default:
					name = tc.exName
				}
				var err error
				if tc.pubsub {
					_, err = e.c.PubSub(e.ctx, name, tc.opts...)
				} else {
					_, err = e.c.ReqResp(e.ctx, name, tc.opts...)
				}
				e.deleteLater(name)
				mustErr(t, err, courier.ErrBadOptions, tc.name)
				if tc.exName == "" {
					// Nothing was created.
					_, err = e.c.ReqResp(e.ctx, name, courier.Passive())
					mustErr(t, err, courier.ErrNotFound, "passive open after a bad declaration")
				}
			})
		}
	})
	t.Run("BadPattern", func(t *testing.T) {
		e := s.env(t)
		ps := e.pubsub()
		for _, p := range []string{"a.b*", "#a", "a.*x", "#.#.#.#.#"} {
			_, err := ps.Subscribe(e.ctx, p, nil)
			mustErr(t, err, courier.ErrBadOptions, "subscribe to "+p)
		}
		sub, err := ps.Subscribe(e.ctx, "ok", nil)
		if err != nil {
			t.Fatal(err)
		}
		mustErr(t, sub.Subscribe(e.ctx, "bad*"), courier.ErrBadOptions, "add a bad pattern")
	})
	t.Run("Delete", func(t *testing.T) {
		e := s.env(t)
		rr := e.reqresp(courier.RoundRobin)
		var hev events
		h, err := e.openReqResp(rr.Name()).Handle(e.ctx, whoami, courier.OnEvent(hev.fn))
		if err != nil {
			t.Fatal(err)
		}
		ps := e.pubsub(courier.Controlled())
		var cev events
		ctl, err := e.openPubSub(ps.Name()).Control(e.ctx, nil, courier.OnEvent(cev.fn))
		if err != nil {
			t.Fatal(err)
		}
		var sev events
		sub, err := e.openPubSub(ps.Name()).Subscribe(e.ctx, "x.*", nil, courier.OnEvent(sev.fn))
		if err != nil {
			t.Fatal(err)
		}

		for _, name := range []string{rr.Name(), ps.Name()} {
			if err := e.c.DeleteExchange(e.ctx, name); err != nil {
				t.Fatalf("delete %s: %v", name, err)
			}
		}
		for _, x := range []struct {
			what string
			a    *courier.Attachment
			ev   *events
		}{{"handler", h, &hev}, {"controller", ctl, &cev}, {"subscriber", sub, &sev}} {
			d := x.ev.waitFor(t, x.what+" detached", func(ev courier.Event) bool { return ev.Kind == courier.EventDetached })
			if !strings.Contains(d.Reason, "deleted") {
				t.Errorf("%s detached with reason %q", x.what, d.Reason)
			}
			testutil.Closed(t, x.a.Done(), wait, x.what+" Done")
			if x.a.Err() == nil {
				t.Errorf("%s ended without Err", x.what)
			}
		}
		_, err = rr.Request(e.ctx, courier.Message{})
		mustErr(t, err, courier.ErrNotFound, "request to a deleted exchange")
		mustErr(t, e.c.DeleteExchange(e.ctx, rr.Name()), courier.ErrNotFound, "delete twice")
		_, err = e.openReqResp(rr.Name()).Handle(e.ctx, whoami, courier.OnEvent(hev.fn))
		if err != nil {
			// Opening re-declared it: attaching works again.
			t.Fatalf("attach after re-declare: %v", err)
		}
	})
	t.Run("List", func(t *testing.T) {
		e := s.env(t)
		rr := e.reqresp(courier.Sticky)
		hs := e.handlers(rr.Name(), 2)
		list, err := e.c.Exchanges(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(list, func(x courier.ExchangeInfo) bool { return x.Name == rr.Name() })
		if i < 0 {
			t.Fatalf("%s missing from the list", rr.Name())
		}
		info := list[i]
		if info.Pattern != "reqresp" || info.Strategy != string(courier.Sticky) || info.Leader != hs[0].ID() || !slices.Equal(memberIDs(info.Members), ids(hs...)) {
			t.Fatalf("listed %+v", info)
		}
	})
}
