package courier

import "github.com/courier-mq/courier/wire"

// RouteInput is what routing and key functions see of a request.
type RouteInput struct {
	Key     string
	Header  map[string]string
	Size    int
	Tag     string   // the request's service tag, if any
	Members []Member // the handlers that could take it, oldest first
}

// KeyFunc returns the sticky key of a request, for [StickyFun]. It runs on
// the requester's goroutine and must not block.
type KeyFunc func(in *RouteInput) string

// Route is a routing function's decision. At most one of Reject, Redirect,
// Member and Tag is set; none means "any handler, in turn". Key and
// Header, when set, rewrite the request before it goes on.
type Route struct {
	Member   string // the member id of the handler to take it
	Tag      string // a service tag whose handlers take it in turn
	Redirect string // another exchange to route it through instead
	Reject   string // refuse it with this reason
	Key      *string
	Header   map[string]string
}

// RouteFunc routes a request, for [Fun]. It runs on the requester's
// goroutine and must not block.
type RouteFunc func(in *RouteInput) (Route, error)

// Member describes an attachment in an exchange's group.
type Member = wire.Member

// ExchangeSpec is an exchange's whole configuration. Over the network only
// the wire config travels; the Go functions need an embedded node.
type ExchangeSpec struct {
	wire.ExchangeConfig
	KeyFunc   KeyFunc
	RouteFunc RouteFunc
	// Passive only checks that the exchange exists and matches.
	Passive bool
}
