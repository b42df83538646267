package amqp

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/courier-mq/courier/internal/auth"
)

// Mechanisms are the SASL mechanisms offered in connection.start.
const Mechanisms = "PLAIN AMQPLAIN"

// GuestUser and GuestPassword are the credentials accepted, from loopback
// addresses only, while the node has no users: RabbitMQ's default user.
const (
	GuestUser     = "guest"
	GuestPassword = "guest"
)

// credentials extracts the user and password from a start-ok response.
func credentials(mechanism, response string) (user, password string, err *Error) {
	switch mechanism {
	case "PLAIN":
		// authzid NUL authcid NUL password; the authzid is ignored.
		parts := strings.Split(response, "\x00")
		if len(parts) != 3 {
			return "", "", Errorf(AccessRefused, "PLAIN response is not authzid\\0user\\0password")
		}
		return parts[1], parts[2], nil
	case "AMQPLAIN":
		t, derr := tableEntries([]byte(response), 1)
		if derr != nil {
			return "", "", Errorf(AccessRefused, "AMQPLAIN response is not a field table: %v", derr)
		}
		user, ok1 := t["LOGIN"].(string)
		password, ok2 := t["PASSWORD"].(string)
		if !ok1 || !ok2 {
			return "", "", Errorf(AccessRefused, "AMQPLAIN response lacks LOGIN or PASSWORD")
		}
		return user, password, nil
	default:
		return "", "", Errorf(CommandInvalid, "unknown authentication mechanism %q; this server offers %s", mechanism, Mechanisms)
	}
}

// login checks credentials from peer and returns the user name.
func (s *Server) login(ctx context.Context, mechanism, user, password, peer string) (string, *Error) {
	refused := Errorf(AccessRefused, "Login was refused using authentication mechanism %s. For details see the broker logfile.", mechanism)
	if s.cfg.Users == nil || !s.cfg.Users.HasUsers() {
		if user != GuestUser || password != GuestPassword {
			s.log.Warn("amqp login refused: without users only guest/guest may log in", "peer", peer, "user", user)
			return "", refused
		}
		if !loopbackPeer(peer) {
			s.log.Warn("amqp login refused: guest may log in from loopback addresses only", "peer", peer)
			return "", Errorf(AccessRefused, "User 'guest' can only connect via localhost")
		}
		return GuestUser, nil
	}
	name, err := s.cfg.Users.Login(ctx, auth.Attempt{User: user, Password: password, Peer: peer, Via: "amqp"})
	if err != nil {
		if errors.Is(err, auth.ErrBusy) || errors.Is(err, context.DeadlineExceeded) {
			return "", Errorf(AccessRefused, "too many logins in progress; try again later")
		}
		return "", refused
	}
	return name, nil
}

// loopbackPeer reports whether peer ("host:port") is a loopback address.
func loopbackPeer(peer string) bool {
	host, _, err := net.SplitHostPort(peer)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
