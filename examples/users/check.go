package main

import (
	"context"
	"fmt"
	"strings"
)

// checkFree makes sure that the demo's exchanges are the demo's alone
// before it attaches: a handler or subscriber left by someone else (a
// `courier reply users pong` from the quick start) would take the demo's
// requests and answer what the demo cannot read. It names what is there.
func checkFree(ctx context.Context, dial Dialer) error {
	conn, err := dial(ctx, "users-check")
	if err != nil {
		return err
	}
	defer conn.Close()
	exs, err := conn.Exchanges(ctx)
	if err != nil {
		return err
	}
	for _, e := range exs {
		if e.Name != usersExchange && e.Name != eventsExchange && e.Name != schedulerExchange {
			continue
		}
		var ids []string
		for _, m := range e.Members {
			ids = append(ids, m.ID)
		}
		if len(ids) > 0 || e.Subscribers > 0 {
			return fmt.Errorf("exchange %q is in use by others (members: %s; subscribers: %d): the demo must be alone on it; stop them (such as a `courier reply %s ...`) or use another server",
				e.Name, strings.Join(ids, ", "), e.Subscribers, e.Name)
		}
	}
	return nil
}
