package node

import "errors"

var (
	// ErrDataDirOfAnotherNode is returned by [Start] when the data
	// directory records another node's name (see [IdentityFile]) than
	// Config.Name: a data directory belongs to one node. Start the node
	// under the recorded name, or give the new one its own directory.
	ErrDataDirOfAnotherNode = errors.New("node: data directory of another node")
	// ErrBadIdentity is returned by [Start] when the data directory's
	// [IdentityFile] cannot be read: not JSON, another version, an invalid
	// name or boot count.
	ErrBadIdentity = errors.New("node: unreadable node identity")
)
