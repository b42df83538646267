package server

import "errors"

// errClientClosed ends a connection whose client sent CLOSE: a normal
// end, logged with its reason rather than as an error.
var errClientClosed = errors.New("the client sent CLOSE")

// errClosing ends a read loop that was waiting for a declare in flight
// when the connection began to close.
var errClosing = errors.New("the connection is closing")
