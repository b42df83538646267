// Package client connects to a Courier server over the network. Dial
// returns the same [courier.Conn] an embedded node gives, so code written
// against one runs against the other.
package client

import (
	"context"
	"errors"

	"github.com/courier-mq/courier"
)

// Options configure Dial.
type Options struct {
	// Name names the client in the server's logs and management API.
	Name string
}

// Dial connects to a server at url, such as "courier://127.0.0.1:7400".
func Dial(ctx context.Context, url string, opts Options) (*courier.Conn, error) {
	return nil, errors.New("client: not written yet")
}
