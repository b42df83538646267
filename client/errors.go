package client

import "errors"

// ErrWrongPort is the error of [Dial] when the server answered in another
// protocol (HTTP): the URL names the wrong port.
var ErrWrongPort = errors.New("client: wrong port")

// ErrReconnectBufferFull is the error of a publish or submit made while
// the client reconnects when the bytes it holds for the new connection
// are at [Options.ReconnectBufSize].
var ErrReconnectBufferFull = errors.New("client: reconnect buffer full")
