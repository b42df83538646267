package auth

import "errors"

// Errors of the user store. Each is wrapped with detail; test with
// errors.Is.
var (
	// ErrBadCredentials is a failed login: an unknown user or a wrong
	// password (the two are not told apart).
	ErrBadCredentials = errors.New("auth: bad user name or password")
	// ErrBusy is a login refused because too many wait for a password
	// check, or none was free before its deadline: the client may try
	// again later.
	ErrBusy = errors.New("auth: too many logins in progress")
	// ErrNoCredentials is a login without a user name on a node that has
	// users.
	ErrNoCredentials = errors.New("auth: credentials required")
	// ErrNoUser is a change to a user that does not exist.
	ErrNoUser = errors.New("auth: no such user")
	// ErrUserExists is the creation of a user that exists.
	ErrUserExists = errors.New("auth: user exists")
	// ErrBadName is an invalid user name.
	ErrBadName = errors.New("auth: invalid user name")
	// ErrBadPassword is an empty or oversized password.
	ErrBadPassword = errors.New("auth: invalid password")
	// ErrBadHash is a stored password hash that cannot be used.
	ErrBadHash = errors.New("auth: invalid password hash")
	// ErrBadTag is a user tag Courier does not know.
	ErrBadTag = errors.New("auth: unknown user tag")
	// ErrBadPattern is an invalid permission pattern.
	ErrBadPattern = errors.New("auth: invalid permission pattern")
	// ErrLastAdmin refuses a change that would leave no administrator,
	// so that the management API stays manageable and the node never
	// turns open by accident (deleting every user opens it).
	ErrLastAdmin = errors.New("auth: the last administrator cannot be removed")
	// ErrNoUsers refuses a change or reload that would leave no user
	// while the node listens beyond loopback, where anonymous access is
	// never allowed.
	ErrNoUsers = errors.New("auth: the node must keep at least one user")
	// ErrBadFile is a users file that cannot be read.
	ErrBadFile = errors.New("auth: bad users file")
)
