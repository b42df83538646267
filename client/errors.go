package client

import "errors"

// ErrWrongPort is the error of [Dial] when the server answered in another
// protocol (HTTP): the URL names the wrong port.
var ErrWrongPort = errors.New("client: wrong port")
