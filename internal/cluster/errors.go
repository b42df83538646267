package cluster

import "errors"

// Errors of the fabric. Each is wrapped with detail; test with errors.Is.
var (
	// ErrClosed is returned once the fabric is closed.
	ErrClosed = errors.New("cluster: fabric closed")
	// ErrNoLink is returned by Send and SendControl for a node this one
	// has no link with (unknown, not up yet, or down).
	ErrNoLink = errors.New("cluster: no link to node")
	// ErrLinkFull is returned by Send and SendControl when the link's
	// outbox is full: the peer does not read fast enough. It wraps
	// [wire.ErrOutboxFull].
	ErrLinkFull = errors.New("cluster: link outbox full")
	// ErrUnknownNode is returned by Dial for a node memberlist does not
	// know.
	ErrUnknownNode = errors.New("cluster: unknown node")
	// ErrAuth is returned when a peer fails the cluster handshake's
	// authentication (wrong secret, certificate not signed by the
	// cluster CA, security settings that differ).
	ErrAuth = errors.New("cluster: authentication failed")
	// ErrHandshake is returned for a handshake that is malformed,
	// oversized or too slow.
	ErrHandshake = errors.New("cluster: bad handshake")
	// ErrInsecure is returned by New for a cluster address beyond
	// loopback with neither a secret nor TLS.
	ErrInsecure = errors.New("cluster: insecure cluster address")
)
