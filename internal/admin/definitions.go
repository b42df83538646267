package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
)

// DefinitionsVersion is the version of the definitions file that
// GET /api/definitions writes and POST /api/definitions reads.
const DefinitionsVersion = 1

// MaxDefinitionsBytes bounds the body of POST /api/definitions: 16 MiB
// hold about 100,000 exchanges.
const MaxDefinitionsBytes = 16 << 20

// Definitions is a broker's shape, as RabbitMQ's definitions file has
// it: exchanges, task queues, durable subscriptions, users (with their
// password hashes, never a password) and permissions.
type Definitions struct {
	Version       int                      `json:"courier_definitions"`
	Exchanges     []broker.ExchangeDef     `json:"exchanges"`
	Queues        []broker.QueueDef        `json:"queues"`
	Subscriptions []broker.SubscriptionDef `json:"subscriptions"`
	Users         []userDef                `json:"users"`
	Permissions   []permissionRow          `json:"permissions"`
}

// userDef is a user in a definitions file.
type userDef struct {
	Name         string  `json:"name"`
	PasswordHash string  `json:"password_hash"`
	Tags         tagList `json:"tags"`
}

// ImportResult is the answer of POST /api/definitions: how many entries
// of each kind the file had, and how many of them were new.
type ImportResult struct {
	Exchanges        int `json:"exchanges"`
	ExchangesCreated int `json:"exchanges_created"`
	Subscriptions    int `json:"subscriptions"`
	Users            int `json:"users"`
	UsersCreated     int `json:"users_created"`
	Permissions      int `json:"permissions"`
}

// definitions serves GET /api/definitions (export) and POST (import).
// Both are for administrators only (see mayAccess): the file holds the
// users' password hashes.
func (s *Server) definitions(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		writeJSON(w, http.StatusOK, s.exportDefinitions())
	case http.MethodPost:
		var d Definitions
		if err := readDefinitions(r, &d); err != nil {
			writeError(w, err)
			return
		}
		res, err := s.importDefinitions(r, &d)
		if err != nil {
			writeError(w, err)
			return
		}
		s.log.Info("definitions imported through the management API", "exchanges", res.Exchanges, "created", res.ExchangesCreated,
			"subscriptions", res.Subscriptions, "users", res.Users, "permissions", res.Permissions, "by", requester(r))
		writeJSON(w, http.StatusOK, res)
	default:
		methodNotAllowed(w, "GET, POST")
	}
}

// exportDefinitions lists the broker's definitions and its users.
func (s *Server) exportDefinitions() *Definitions {
	d := &Definitions{Version: DefinitionsVersion, Users: []userDef{}, Permissions: []permissionRow{}}
	d.Exchanges, d.Queues, d.Subscriptions = s.b.Definitions()
	if s.cfg.Users != nil {
		for _, u := range s.cfg.Users.Export() {
			d.Users = append(d.Users, userDef{Name: u.Name, PasswordHash: u.PasswordHash, Tags: u.Tags})
			d.Permissions = append(d.Permissions, permissionRow{User: u.Name, Permissions: u.Permissions})
		}
	}
	return d
}

// readDefinitions decodes a definitions file of at most
// MaxDefinitionsBytes, refusing unknown fields and versions.
func readDefinitions(r *http.Request, d *Definitions) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, MaxDefinitionsBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(d); err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return &apiError{http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("definitions file over %d bytes", MaxDefinitionsBytes)}
		case errors.Is(err, io.EOF):
			return badRequest("the body is empty: send a definitions file (GET /api/definitions writes one)")
		}
		return badRequest("bad definitions file: %v", err)
	}
	if dec.More() {
		return badRequest("bad definitions file: more than one JSON value")
	}
	if d.Version != DefinitionsVersion {
		return badRequest("definitions file version %d: this node reads version %d (courier_definitions)", d.Version, DefinitionsVersion)
	}
	return nil
}

// importDefinitions checks every entry of d as a DECLARE, an ATTACH and a
// change of users would, then applies them: the exchanges, the durable
// subscriptions, then the users and their permissions in one change. An
// entry already there as described changes nothing, so that importing a
// file twice is importing it once; one there and different is a clash,
// found before anything is applied.
func (s *Server) importDefinitions(r *http.Request, d *Definitions) (*ImportResult, error) {
	users, err := s.checkDefinitions(d)
	if err != nil {
		return nil, err
	}
	res := &ImportResult{Exchanges: len(d.Exchanges), Subscriptions: len(d.Subscriptions), Users: len(d.Users), Permissions: len(d.Permissions)}
	created, err := s.declareAll(r, d.Exchanges)
	res.ExchangesCreated = created
	if err != nil {
		return res, err
	}
	for _, sd := range d.Subscriptions {
		if err := r.Context().Err(); err != nil {
			return res, err
		}
		subscribe := func() error { return s.b.DurableSubscribe(sd.Exchange, sd.Name, sd.Patterns) }
		if len(sd.Headers) > 0 {
			subscribe = func() error { return s.b.DurableSubscribeHeaders(sd.Exchange, sd.Name, sd.Headers) }
		}
		if err := subscribe(); err != nil {
			return res, fmt.Errorf("durable subscription %q of %q: %w", sd.Name, sd.Exchange, err)
		}
	}
	if len(users) > 0 {
		if res.UsersCreated, err = s.cfg.Users.Import(users); err != nil {
			return res, usersError(err)
		}
	}
	return res, nil
}

// checkDefinitions checks every entry of d, and returns its users and
// permissions merged, one entry per user, for auth.Store.Import.
func (s *Server) checkDefinitions(d *Definitions) ([]auth.Imported, error) {
	inFile := map[string]broker.ExchangeDef{}
	for _, e := range d.Exchanges {
		if _, dup := inFile[e.Name]; dup {
			return nil, badRequest("exchange %q is listed twice", e.Name)
		}
		if err := s.b.CheckDeclare(e.Name, broker.Spec{ExchangeConfig: e.ExchangeConfig}); err != nil {
			return nil, fmt.Errorf("exchange %q: %w", e.Name, err)
		}
		inFile[e.Name] = e
	}
	config := func(name string) (broker.ExchangeDef, bool) {
		if e, ok := inFile[name]; ok {
			return e, true
		}
		if ex := s.b.Exchange(name); ex != nil {
			return broker.ExchangeDef{Name: name, ExchangeConfig: ex.Config()}, true
		}
		return broker.ExchangeDef{}, false
	}
	for _, q := range d.Queues {
		e, ok := config(q.Exchange)
		if !ok || e.Pattern != "tasks" || q.Name != q.Exchange {
			return nil, badRequest("queue %q: a queue is a task exchange's, of the same name, listed in exchanges or on the node", q.Name)
		}
	}
	for _, sd := range d.Subscriptions {
		e, ok := config(sd.Exchange)
		if !ok {
			return nil, notFound("durable subscription %q: exchange %q is neither in the file nor on the node", sd.Name, sd.Exchange)
		}
		if err := s.b.CheckSubscription(sd.Exchange, e.ExchangeConfig, sd.Name, sd.Patterns); err != nil {
			return nil, err
		}
		if sd.Queue != "" && sd.Queue != sd.Exchange+"/"+sd.Name {
			return nil, badRequest("durable subscription %q of %q: its queue is %q, not %q", sd.Name, sd.Exchange, sd.Exchange+"/"+sd.Name, sd.Queue)
		}
	}
	return s.checkUsers(d)
}

// checkUsers merges the users and permissions of d and checks them.
func (s *Server) checkUsers(d *Definitions) ([]auth.Imported, error) {
	if len(d.Users) == 0 && len(d.Permissions) == 0 {
		return nil, nil
	}
	if s.cfg.Users == nil {
		return nil, &apiError{http.StatusNotImplemented, "not_implemented", "this node keeps no users: import a file without users and permissions"}
	}
	at := map[string]int{}
	var list []auth.Imported
	for _, u := range d.Users {
		if _, dup := at[u.Name]; dup {
			return nil, badRequest("user %q is listed twice", u.Name)
		}
		if u.PasswordHash == "" {
			return nil, badRequest("user %q: password_hash missing (a definitions file has hashes, never passwords)", u.Name)
		}
		at[u.Name] = len(list)
		list = append(list, auth.Imported{Name: u.Name, PasswordHash: u.PasswordHash, Tags: u.Tags})
	}
	for _, p := range d.Permissions {
		i, ok := at[p.User]
		if !ok {
			if _, exists := s.cfg.Users.User(p.User); !exists {
				return nil, notFound("permissions of %q: no such user in the file or on the node", p.User)
			}
			i = len(list)
			at[p.User] = i
			list = append(list, auth.Imported{Name: p.User})
		}
		if list[i].Permissions != nil {
			return nil, badRequest("permissions of %q are listed twice", p.User)
		}
		perms := p.Permissions
		for _, l := range []*auth.Patterns{&perms.Configure, &perms.Write, &perms.Read} {
			if *l == nil {
				*l = auth.Patterns{}
			}
		}
		list[i].Permissions = &perms
	}
	if err := auth.CheckImport(list); err != nil {
		return nil, usersError(err)
	}
	return list, nil
}

// importDeclarers is how many exchanges an import declares at once: each
// waits for its definition's fsync, and declarations in flight together
// share one (group commit). One at a time, 3,697 exchanges took 9 min 52 s
// on a busy disk.
const importDeclarers = 16

// declareAll declares the exchanges of an import, importDeclarers at a
// time, and returns how many were new. It stops at the first error, or
// when the request is cancelled (the client gone).
func (s *Server) declareAll(r *http.Request, exs []broker.ExchangeDef) (int, error) {
	by := s.declarer(r)
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	var created atomic.Int64
	var wg sync.WaitGroup
	next := make(chan broker.ExchangeDef)
	for range min(importDeclarers, len(exs)) {
		wg.Go(func() {
			for e := range next {
				existed := s.b.Exchange(e.Name) != nil
				if _, err := s.b.DeclareAs(e.Name, broker.Spec{ExchangeConfig: e.ExchangeConfig}, by); err != nil {
					cancel(fmt.Errorf("exchange %q: %w", e.Name, err))
					continue
				}
				if !existed {
					created.Add(1)
				}
			}
		})
	}
feed:
	for _, e := range exs {
		select {
		case next <- e:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return int(created.Load()), context.Cause(ctx)
}
