package meta

import (
	"cmp"
	"context"
	"maps"
	"slices"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
)

// DeclareOptions qualify a declaration.
type DeclareOptions struct {
	// By is the user who declares (recorded on creation).
	By string
	// Passive only opens an existing exchange: it fails with
	// wire.CodeNotFound rather than create one.
	Passive bool
	// Match, if set, is the declaration as the client made it, judged
	// against an existing exchange instead of cfg: a node declaring an
	// exchange it does not know yet fills in its defaults (cfg), which
	// must not clash with an exchange declared elsewhere whose client
	// named others.
	Match *wire.ExchangeConfig
}

// Declare creates the exchange name, homed on this node, or checks that
// the existing one matches cfg, as broker.Declare does: fields left
// empty match anything, and a clash (another pattern, other options) is
// a *wire.Error with wire.CodeClash. It is linearizable and returns once
// this node applied it; created tells whether this call made it.
func (m *Meta) Declare(ctx context.Context, name string, cfg wire.ExchangeConfig, opts DeclareOptions) (ex Exchange, created bool, err error) {
	if m.cfg.CheckExchange != nil && !opts.Passive {
		if err := m.cfg.CheckExchange(name, cfg); err != nil {
			return Exchange{}, false, err
		}
	}
	res, err := m.apply(ctx, &command{Op: opDeclare, Name: name, Config: &cfg, Match: opts.Match, By: opts.By, Home: m.cfg.NodeID, Passive: opts.Passive})
	if err != nil {
		return Exchange{}, false, err
	}
	return *res.Exchange, res.Created, nil
}

// Delete deletes the exchange name; an unknown one is a *wire.Error
// with wire.CodeNotFound.
func (m *Meta) Delete(ctx context.Context, name string) error {
	_, err := m.apply(ctx, &command{Op: opDelete, Name: name})
	return err
}

// PutUser creates or changes a user, as auth.Store.PutUser does: the
// password is hashed here (argon2id), and only the hash is replicated.
// The errors are auth's (ErrNoUser, ErrUserExists, ErrBadName,
// ErrBadPassword, ErrBadTag, ErrBadPattern, ErrLastAdmin).
func (m *Meta) PutUser(ctx context.Context, name string, ch auth.UserChange) (created bool, err error) {
	if err := auth.CheckName(name); err != nil {
		return false, err
	}
	hash := ch.PasswordHash
	if hash == "" && ch.Password != "" {
		if hash, err = auth.HashPassword(ch.Password); err != nil {
			return false, err
		}
	}
	c := &command{Op: opPutUser, Name: name, PasswordHash: hash, Tags: ch.Tags, SetTags: ch.Tags != nil,
		Permissions: ch.Permissions, MustExist: ch.MustExist, MustNotExist: ch.MustNotExist}
	res, err := m.apply(ctx, c)
	if err != nil {
		return false, err
	}
	return res.Created, nil
}

// DeleteUser deletes a user.
func (m *Meta) DeleteUser(ctx context.Context, name string) error {
	_, err := m.apply(ctx, &command{Op: opDeleteUser, Name: name})
	return err
}

// SetPermissions replaces the permissions of user.
func (m *Meta) SetPermissions(ctx context.Context, user string, p auth.Permissions) error {
	_, err := m.apply(ctx, &command{Op: opSetPerms, Name: user, Permissions: &p, MustExist: true})
	return err
}

// ClearPermissions takes every permission from user, as RabbitMQ's
// clear_permissions.
func (m *Meta) ClearPermissions(ctx context.Context, user string) error {
	_, err := m.apply(ctx, &command{Op: opClearPerms, Name: user, MustExist: true})
	return err
}

// Sync waits until this node's state covers every write that completed,
// anywhere, before Sync was called: the local reads that follow are
// linearizable. It asks the leader for its read index (a barrier in the
// leader's term) and waits for this node to apply it.
func (m *Meta) Sync(ctx context.Context) error {
	ctx, cancel := m.opContext(ctx)
	defer cancel()
	return m.sync(ctx)
}

// Get returns the exchange name, linearizably (see [Meta.Sync]).
func (m *Meta) Get(ctx context.Context, name string) (Exchange, bool, error) {
	if err := m.Sync(ctx); err != nil {
		return Exchange{}, false, err
	}
	ex, ok := m.Exchange(name)
	return ex, ok, nil
}

// GetUser returns the user name, linearizably (see [Meta.Sync]).
func (m *Meta) GetUser(ctx context.Context, name string) (auth.User, bool, error) {
	if err := m.Sync(ctx); err != nil {
		return auth.User{}, false, err
	}
	u, ok := m.User(name)
	return u, ok, nil
}

// Exchange returns the exchange name from this node's state, which may
// lag the group (but holds every write made through this node).
func (m *Meta) Exchange(name string) (ex Exchange, ok bool) {
	m.fsm.read(func(st *State) { ex, ok = st.Exchanges[name] })
	return ex, ok
}

// Exchanges returns every exchange from this node's state, by name.
func (m *Meta) Exchanges() []Exchange {
	var out []Exchange
	m.fsm.read(func(st *State) { out = slices.Collect(maps.Values(st.Exchanges)) })
	slices.SortFunc(out, func(a, b Exchange) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// User returns the user name from this node's state.
func (m *Meta) User(name string) (u auth.User, ok bool) {
	m.fsm.read(func(st *State) { u, ok = st.Users[name] })
	return cloneUser(u), ok
}

// Nodes returns the liveness table from this node's state, by node.
func (m *Meta) Nodes() []Liveness {
	var out []Liveness
	m.fsm.read(func(st *State) { out = slices.Collect(maps.Values(st.Nodes)) })
	slices.SortFunc(out, func(a, b Liveness) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// State returns a copy of this node's whole state.
func (m *Meta) State() State {
	var out State
	m.fsm.read(func(st *State) { out = st.clone() })
	return out
}

// Applied returns the Raft index of the last command this node applied.
func (m *Meta) Applied() uint64 {
	i, _ := m.fsm.index()
	return i
}
