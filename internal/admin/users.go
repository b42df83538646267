package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/courier-mq/courier/internal/auth"
)

// userBody is the body of PUT /api/users/{name}, in RabbitMQ's shape:
// {"password": "...", "tags": "administrator"} or "tags": ["monitoring"].
type userBody struct {
	Password     string   `json:"password"`
	PasswordHash string   `json:"password_hash"`
	Tags         *tagList `json:"tags"`
}

// tagList reads tags as an array or as RabbitMQ's comma-separated string.
type tagList []string

func (t *tagList) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*t = tagList{}
		for tag := range strings.SplitSeq(s, ",") {
			if tag = strings.TrimSpace(tag); tag != "" {
				*t = append(*t, tag)
			}
		}
		return nil
	}
	var list []string
	if err := json.Unmarshal(b, &list); err != nil {
		return errors.New("tags: want an array of strings or a comma-separated string")
	}
	*t = list
	return nil
}

// permissionRow is one user's permissions in /api/permissions.
type permissionRow struct {
	User string `json:"user"`
	auth.Permissions
}

// usersOrFail returns the node's users, or answers 501 when it has none.
func (s *Server) usersOrFail(w http.ResponseWriter) *auth.Store {
	if s.cfg.Users == nil {
		writeError(w, &apiError{http.StatusNotImplemented, "not_implemented", "this node keeps no users"})
	}
	return s.cfg.Users
}

// listUsers answers GET /api/users: [{"name", "tags", "permissions"}].
func (s *Server) listUsers(w http.ResponseWriter, r *http.Request) {
	if users := s.usersOrFail(w); users != nil {
		writeJSON(w, http.StatusOK, users.Users())
	}
}

// user serves GET, PUT and DELETE /api/users/{name}. PUT creates or
// updates; with "If-None-Match: *" it only creates, with "If-Match: *" it
// only updates.
func (s *Server) user(w http.ResponseWriter, r *http.Request) {
	users := s.usersOrFail(w)
	if users == nil {
		return
	}
	name := r.PathValue("name")
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if u, ok := findUser(w, users, name); ok {
			writeJSON(w, http.StatusOK, u)
		}
	case http.MethodPut:
		var body userBody
		if err := readBody(r, &body, false); err != nil {
			writeError(w, err)
			return
		}
		ch := auth.UserChange{
			Password: body.Password, PasswordHash: body.PasswordHash,
			MustNotExist: r.Header.Get("If-None-Match") == "*",
			MustExist:    r.Header.Get("If-Match") == "*",
		}
		if body.Tags != nil {
			ch.Tags = []string(*body.Tags)
		}
		created, err := users.PutUser(name, ch)
		if err != nil {
			writeError(w, usersError(err))
			return
		}
		s.log.Info("user changed through the management API", "user", name, "created", created, "by", requester(r))
		if created {
			w.Header().Set("Location", "/api/users/"+name)
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case http.MethodDelete:
		if err := users.DeleteUser(name); err != nil {
			writeError(w, usersError(err))
			return
		}
		s.log.Info("user deleted through the management API", "user", name, "by", requester(r))
		w.WriteHeader(http.StatusNoContent)
	default:
		methodNotAllowed(w, "GET, PUT, DELETE")
	}
}

// listPermissions answers GET /api/permissions:
// [{"user", "configure", "write", "read"}].
func (s *Server) listPermissions(w http.ResponseWriter, r *http.Request) {
	users := s.usersOrFail(w)
	if users == nil {
		return
	}
	list := users.Users()
	rows := make([]permissionRow, len(list))
	for i, u := range list {
		rows[i] = permissionRow{User: u.Name, Permissions: u.Permissions}
	}
	writeJSON(w, http.StatusOK, rows)
}

// permissions serves GET, PUT and DELETE /api/permissions/{user}. PUT
// replaces the user's patterns ({"configure": ..., "write": ..., "read":
// ...}, each an array of patterns or one pattern); DELETE takes every
// permission away.
func (s *Server) permissions(w http.ResponseWriter, r *http.Request) {
	users := s.usersOrFail(w)
	if users == nil {
		return
	}
	name := r.PathValue("user")
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		if u, ok := findUser(w, users, name); ok {
			writeJSON(w, http.StatusOK, permissionRow{User: u.Name, Permissions: u.Permissions})
		}
	case http.MethodPut, http.MethodDelete:
		p := auth.Permissions{Configure: auth.Patterns{}, Write: auth.Patterns{}, Read: auth.Patterns{}}
		if r.Method == http.MethodPut {
			if err := readBody(r, &p, false); err != nil {
				writeError(w, err)
				return
			}
		}
		if err := users.SetPermissions(name, p); err != nil {
			writeError(w, usersError(err))
			return
		}
		s.log.Info("permissions changed through the management API", "user", name,
			"configure", p.Configure, "write", p.Write, "read", p.Read, "by", requester(r))
		w.WriteHeader(http.StatusNoContent)
	default:
		methodNotAllowed(w, "GET, PUT, DELETE")
	}
}

// findUser returns the user name, or answers 404.
func findUser(w http.ResponseWriter, users *auth.Store, name string) (auth.Info, bool) {
	u, ok := users.User(name)
	if !ok {
		writeError(w, notFound("user %q not found", name))
	}
	return u, ok
}

// requester names who made a request, for the log.
func requester(r *http.Request) string {
	if name, _, ok := r.BasicAuth(); ok {
		return name
	}
	return "anonymous"
}

// usersError maps the user store's errors to HTTP.
func usersError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "auth: ")
	switch {
	case errors.Is(err, auth.ErrNoUser):
		return &apiError{http.StatusNotFound, "not_found", msg}
	case errors.Is(err, auth.ErrUserExists):
		return &apiError{http.StatusConflict, "user_exists", msg}
	case errors.Is(err, auth.ErrLastAdmin), errors.Is(err, auth.ErrNoUsers):
		return &apiError{http.StatusConflict, "conflict", msg}
	case errors.Is(err, auth.ErrBadName), errors.Is(err, auth.ErrBadPassword), errors.Is(err, auth.ErrBadHash),
		errors.Is(err, auth.ErrBadTag), errors.Is(err, auth.ErrBadPattern):
		return badRequest("%s", msg)
	}
	return err
}
