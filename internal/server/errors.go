package server

import "errors"

// errClientClosed ends a connection whose client sent CLOSE: a normal
// end, logged with its reason rather than as an error.
var errClientClosed = errors.New("the client sent CLOSE")
