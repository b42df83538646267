package admin

import (
	"maps"
	"net/http"
	"slices"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/wire"
)

// exchangeRow is one exchange in a listing.
type exchangeRow = row[*broker.Exchange, *broker.Exchange]

var exchangeSchema = newSchema("name",
	nameField(func(r *exchangeRow) string { return r.item.Name() }, func(r *exchangeRow) []byte { return r.e.quotedName() }),
	strField("pattern", func(r *exchangeRow) string { return r.item.Config().Pattern }),
	strField("strategy", func(r *exchangeRow) string { return r.item.Config().Strategy }),
	strField("key_expr", func(r *exchangeRow) string { return r.item.Config().KeyExpr }),
	strField("route_expr", func(r *exchangeRow) string { return r.item.Config().RouteExpr }),
	boolField("controlled", func(r *exchangeRow) bool { return r.item.Config().Controlled }),
	strField("leader", func(r *exchangeRow) string { return r.item.Leader() }),
	rawField("members", func(b []byte, r *exchangeRow) []byte { return appendMembers(b, r.item.Members()) },
		func(r *exchangeRow) float64 { return float64(r.item.MemberCount()) }),
	intField("subscribers", func(r *exchangeRow) int64 { return int64(r.item.Subscribers()) }),
	uintField("message_stats.request", func(r *exchangeRow) uint64 { return r.item.Requests() }),
	rateField("message_stats.request", func(r *exchangeRow) float64 { return r.e.rateOf(exRequests) }),
	uintField("message_stats.publish", func(r *exchangeRow) uint64 { return r.item.Publishes() }),
	rateField("message_stats.publish", func(r *exchangeRow) float64 { return r.e.rateOf(exPublishes) }),
)

// appendMembers encodes members as wire.Member does:
// [{"id": "n1/c7.1", "role": "handler", "service_tag": "eu", ...}].
func appendMembers(b []byte, members []wire.Member) []byte {
	b = append(b, '[')
	for i, m := range members {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendString(b, m.ID)
		b = append(b, `,"role":`...)
		b = appendString(b, m.Role)
		if m.ServiceTag != "" {
			b = append(b, `,"service_tag":`...)
			b = appendString(b, m.ServiceTag)
		}
		if m.ConnTag != "" {
			b = append(b, `,"conn_tag":`...)
			b = appendString(b, m.ConnTag)
		}
		if len(m.Options) > 0 {
			b = append(b, `,"options":{`...)
			for j, k := range slices.Sorted(maps.Keys(m.Options)) {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendString(b, k)
				b = append(b, ':')
				b = appendString(b, m.Options[k])
			}
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

func (s *Server) listExchanges(w http.ResponseWriter, r *http.Request) {
	serveList(w, r, exchangeSchema, s.smp.liveExchanges(), func(r *exchangeRow) string { return r.item.Name() })
}

func (s *Server) exchange(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		ex := s.b.Exchange(name)
		if ex == nil {
			writeError(w, notFound("exchange %q not found", name))
			return
		}
		serveObject(w, r, exchangeSchema, &exchangeRow{item: ex, e: s.smp.exchangeEntry(ex)}, http.StatusOK)
	case http.MethodPut:
		var cfg wire.ExchangeConfig
		if err := readBody(r, &cfg, false); err != nil {
			writeError(w, err)
			return
		}
		existed := s.b.Exchange(name) != nil
		ex, err := s.b.DeclareAs(name, broker.Spec{ExchangeConfig: cfg}, s.declarer(r))
		if err != nil {
			writeError(w, err)
			return
		}
		status := http.StatusOK
		if !existed {
			status = http.StatusCreated
			w.Header().Set("Location", "/api/exchanges/"+name)
		}
		serveObject(w, r, exchangeSchema, &exchangeRow{item: ex, e: s.smp.exchangeEntry(ex)}, status)
	case http.MethodDelete:
		if !s.permit(w, r, auth.Configure, "delete", name) {
			return
		}
		if err := s.b.Delete(name); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		methodNotAllowed(w, "GET, PUT, DELETE")
	}
}
