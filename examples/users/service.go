package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"sync"

	"github.com/courier-mq/courier"
)

// Exchange names of the users service.
const (
	usersExchange     = "users"           // request-response, round-robin
	eventsExchange    = "users.events"    // pub-sub: profile.updated.<id>
	schedulerExchange = "users.scheduler" // request-response, leader
)

// User is a profile as the service keeps it.
type User struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Email   string `json:"email"`
	Version int    `json:"version"`
	// By names the instance that made the change.
	By string `json:"by"`
}

// Op is the body of a request to the "users" exchange.
type Op struct {
	Op    string `json:"op"` // "get", "update" or "count"
	ID    string `json:"id,omitempty"`
	Name  string `json:"name,omitempty"`
	Email string `json:"email,omitempty"`
}

// Reply is the body of a response from the "users" exchange.
type Reply struct {
	ServedBy string `json:"served_by"`
	User     *User  `json:"user,omitempty"`
	Count    int    `json:"count,omitempty"`
}

// Instance is one copy of the users service, as one service node would
// run it: a connection of its own, a handler on "users" and a subscriber
// on "users.events" that keeps its copy of the store up to date.
type Instance struct {
	Name    string
	conn    *courier.Conn
	events  *courier.PubSub
	handler *courier.Attachment
	sub     *courier.Attachment
	say     func(format string, args ...any)

	mu     sync.Mutex      // guards users, served
	users  map[string]User // this instance's own copy
	served map[string]int  // requests served, by op
}

// StartInstance connects an instance and attaches it. It subscribes to
// the events before it takes requests, so that its copy misses nothing
// it could be asked about.
func StartInstance(ctx context.Context, dial Dialer, name string, say func(string, ...any)) (*Instance, error) {
	conn, err := dial(ctx, name)
	if err != nil {
		return nil, err
	}
	in := &Instance{Name: name, conn: conn, say: say, users: map[string]User{}, served: map[string]int{}}
	if err := in.attach(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return in, nil
}

func (in *Instance) attach(ctx context.Context) error {
	// The code is the same on 1 node or 5: only the strategy given here,
	// when the exchange is first declared, decides how requests spread.
	users, err := in.conn.ReqResp(ctx, usersExchange, courier.RoundRobin)
	if err != nil {
		return err
	}
	in.events, err = in.conn.PubSub(ctx, eventsExchange)
	if err != nil {
		return err
	}
	in.sub, err = in.events.Subscribe(ctx, "profile.updated.*", in.apply)
	if err != nil {
		return err
	}
	in.handler, err = users.Handle(ctx, in.serve, courier.Options(map[string]string{"name": in.Name}))
	return err
}

// serve answers one request; the Conn calls it one request at a time.
func (in *Instance) serve(r *courier.Request) {
	var op Op
	if err := json.Unmarshal(r.Body(), &op); err != nil {
		r.Fail(fmt.Errorf("bad request: %v", err))
		return
	}
	rep := Reply{ServedBy: in.Name}
	in.mu.Lock()
	in.served[op.Op]++
	u, found := in.users[op.ID]
	rep.Count = len(in.users)
	in.mu.Unlock()
	switch op.Op {
	case "get":
		if !found {
			r.Fail(fmt.Errorf("user %q not found", op.ID))
			return
		}
		rep.User = &u
	case "count":
	case "update":
		if op.ID == "" {
			r.Fail(fmt.Errorf("update without an id"))
			return
		}
		prev := u
		u = User{ID: op.ID, Name: op.Name, Email: op.Email, Version: prev.Version + 1, By: in.Name}
		if op.Name == "" {
			u.Name = prev.Name
		}
		if op.Email == "" {
			u.Email = prev.Email
		}
		body, _ := json.Marshal(u)
		// Every copy, this one included, changes only through the event,
		// so that all copies apply the same changes in the same way.
		// PublishSync returns once the broker has routed the event (and
		// stored it in any durable subscription): the update is
		// acknowledged only when it is on its way to everyone.
		err := in.events.PublishSync(r.Context(), courier.Message{Key: "profile.updated." + u.ID, Body: body})
		if err != nil {
			r.Fail(fmt.Errorf("publish update: %w", err))
			return
		}
		rep.User = &u
	default:
		r.Fail(fmt.Errorf("unknown op %q", op.Op))
		return
	}
	body, _ := json.Marshal(rep)
	r.Reply(body)
}

// apply takes a profile update into this instance's copy. Versions make
// it idempotent; see the README on concurrent updates of one user.
func (in *Instance) apply(d *courier.Delivery) {
	var u User
	if err := json.Unmarshal(d.Body, &u); err != nil {
		in.say("%s: bad event %s: %v", in.Name, d.Key, err)
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if cur, ok := in.users[u.ID]; !ok || u.Version > cur.Version {
		in.users[u.ID] = u
	}
}

// Copy returns a snapshot of the instance's store.
func (in *Instance) Copy() map[string]User {
	in.mu.Lock()
	defer in.mu.Unlock()
	return maps.Clone(in.users)
}

// Served returns how many requests of op the instance served.
func (in *Instance) Served(op string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.served[op]
}

// Close closes the instance's connection; its attachments leave.
func (in *Instance) Close() { in.conn.Close() }

// attachments returns the instance's attachments, to wait for them.
func (in *Instance) attachments() []*courier.Attachment {
	return []*courier.Attachment{in.handler, in.sub}
}

// Notifier stands for another service that reacts to profile updates
// (here: it would send an e-mail). It only subscribes.
type Notifier struct {
	conn *courier.Conn
	sub  *courier.Attachment

	mu   sync.Mutex // guards keys
	keys []string   // routing keys received, in order
}

// StartNotifier connects the notifier and subscribes it.
func StartNotifier(ctx context.Context, dial Dialer, say func(string, ...any)) (*Notifier, error) {
	conn, err := dial(ctx, "notifier")
	if err != nil {
		return nil, err
	}
	n := &Notifier{conn: conn}
	events, err := conn.PubSub(ctx, eventsExchange)
	if err == nil {
		n.sub, err = events.Subscribe(ctx, "profile.updated.*", func(d *courier.Delivery) {
			var u User
			json.Unmarshal(d.Body, &u)
			n.mu.Lock()
			n.keys = append(n.keys, d.Key)
			n.mu.Unlock()
			say("notifier: %s -> would e-mail %s <%s> (v%d, changed on %s)", d.Key, u.Name, u.Email, u.Version, u.By)
		})
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("notifier: %w", err)
	}
	return n, nil
}

// Keys returns the routing keys the notifier received.
func (n *Notifier) Keys() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.keys...)
}

// Close closes the notifier's connection.
func (n *Notifier) Close() { n.conn.Close() }
