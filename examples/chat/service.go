package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/courier-mq/courier"
)

// The exchanges of the chat. Each room is a pub-sub exchange of its own,
// "room.<name>", controlled by the service, with two routing keys: "msg"
// (a chat line) and "typing" (the indicator, never stored). A page sends
// a line to "chat.say" under the room's name; the service takes it from
// its durable subscription there, keeps it in the room's history and
// publishes it to the room. (A controlled exchange cannot have durable
// subscriptions, so the history cannot be a durable subscription of the
// room itself.) Each page attaches as a handler of the room's broadcast
// exchange "presence.<name>" while it is in the room: the group's member
// events are the room's presence (a subscriber is no member of a group,
// and gets no member events), and a request to it asks everyone there.
// Each user handles "user.<name>", where direct messages arrive as
// requests.
const (
	roomPrefix     = "room."
	presencePrefix = "presence."
	userPrefix     = "user."
	// SayExchange is the pub-sub exchange pages send lines to, under
	// the room's name.
	SayExchange = "chat.say"
	// HistoryExchange is the request-response exchange the service
	// answers with a room's last messages: body the room's name,
	// response a JSON array of Line.
	HistoryExchange = "chat.history"
	// relayQueue names the service's durable subscription to chat.say.
	relayQueue = "relay"
	// serviceTag is the conn tag of the service's own attachments, which
	// pages leave out of presence.
	serviceTag = "chat-service"
)

// Line is one chat message, as pages publish it and history returns it.
type Line struct {
	From string `json:"from"`
	Text string `json:"text"`
	TS   int64  `json:"ts"` // Unix milliseconds
}

// Config is what the service serves.
type Config struct {
	// Rooms are the rooms' names (letters, digits, '-' and '_').
	Rooms []string
	// Banned users' subscriptions to any room are refused.
	Banned []string
	// History is how many messages of a room a joining user gets.
	History int
}

// Service moderates the rooms and keeps their history.
type Service struct {
	cfg    Config
	banned map[string]bool
	rooms  map[string]*courier.PubSub

	mu   sync.Mutex // guards hist
	hist map[string][]Line
}

// validName reports whether s can be a room or user name: one word of a
// routing key and of an exchange name.
func validName(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// Start declares the rooms on conn, attaches the service as each room's
// controller and history keeper, and answers history requests. It runs
// until conn closes.
func Start(ctx context.Context, conn *courier.Conn, cfg Config) (*Service, error) {
	if cfg.History <= 0 {
		cfg.History = 50
	}
	s := &Service{cfg: cfg, banned: map[string]bool{}, rooms: map[string]*courier.PubSub{}, hist: map[string][]Line{}}
	for _, u := range cfg.Banned {
		s.banned[u] = true
	}
	for _, room := range cfg.Rooms {
		if !validName(room) {
			return nil, fmt.Errorf("chat: bad room name %q", room)
		}
		if err := s.startRoom(ctx, conn, room); err != nil {
			return nil, err
		}
	}
	say, err := conn.PubSub(ctx, SayExchange)
	if err != nil {
		return nil, fmt.Errorf("chat: declare %s: %w", SayExchange, err)
	}
	if _, err := say.Subscribe(ctx, "*", s.relay, courier.Durable(relayQueue), courier.ConnTag(serviceTag)); err != nil {
		return nil, fmt.Errorf("chat: subscribe to %s: %w", SayExchange, err)
	}
	hx, err := conn.ReqResp(ctx, HistoryExchange, courier.RoundRobin)
	if err != nil {
		return nil, fmt.Errorf("chat: declare %s: %w", HistoryExchange, err)
	}
	if _, err := hx.Handle(ctx, s.serveHistory, courier.ConnTag(serviceTag)); err != nil {
		return nil, fmt.Errorf("chat: handle %s: %w", HistoryExchange, err)
	}
	return s, nil
}

// startRoom declares one room, controlled, attaches the moderator, and
// declares the room's presence exchange.
func (s *Service) startRoom(ctx context.Context, conn *courier.Conn, room string) error {
	ps, err := conn.PubSub(ctx, roomPrefix+room, courier.Controlled())
	if err != nil {
		return fmt.Errorf("chat: declare room %q: %w", room, err)
	}
	if _, err := ps.Control(ctx, s.moderate, courier.ConnTag(serviceTag)); err != nil {
		return fmt.Errorf("chat: control room %q: %w", room, err)
	}
	if _, err := conn.ReqResp(ctx, presencePrefix+room, courier.Broadcast); err != nil {
		return fmt.Errorf("chat: declare presence of room %q: %w", room, err)
	}
	s.rooms[room] = ps
	return nil
}

// relay takes a line from chat.say: a line to a known room from a user
// who is not banned is kept in the room's history and published to the
// room. Lines sent while the service was away wait in its durable
// subscription and are relayed when it comes back.
func (s *Service) relay(d *courier.Delivery) {
	room, ok := s.rooms[d.Key]
	if !ok {
		return
	}
	l, ok := parseLine(d.Body)
	if !ok || s.banned[l.From] {
		return
	}
	s.record(d.Key, l)
	body, _ := json.Marshal(l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	room.Publish(ctx, "msg", body)
}

// maxText bounds a line's text, in bytes.
const maxText = 2000

// parseLine reads a line a page sent: JSON with a valid author. Its
// text is cut to maxText bytes (on a rune boundary), and a missing
// time is now.
func parseLine(body []byte) (Line, bool) {
	var l Line
	if len(body) > 4*maxText || json.Unmarshal(body, &l) != nil || !validName(l.From) {
		return Line{}, false
	}
	if len(l.Text) > maxText {
		cut := maxText
		for cut > 0 && !utf8.RuneStart(l.Text[cut]) {
			cut--
		}
		l.Text = l.Text[:cut]
	}
	if l.TS <= 0 {
		l.TS = time.Now().UnixMilli()
	}
	return l, true
}

// moderate is the rooms' controller: it refuses a banned user's
// subscription, and any subscription to patterns other than the room's
// two keys. A page names its user in its attachment's conn tag.
func (s *Service) moderate(req *courier.SubscriptionRequest) courier.Decision {
	user := req.Member.ConnTag
	if user == serviceTag {
		return courier.Accept()
	}
	if s.banned[user] {
		return courier.Refuse(fmt.Sprintf("%s is banned", user))
	}
	for _, p := range req.Patterns {
		if p != "msg" && p != "typing" {
			return courier.Narrow("msg", "typing")
		}
	}
	return courier.Accept()
}

// record keeps a line in its room's history, the last cfg.History.
func (s *Service) record(room string, l Line) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := append(s.hist[room], l)
	if len(h) > s.cfg.History {
		h = h[len(h)-s.cfg.History:]
	}
	s.hist[room] = h
}

// History returns the last messages of a room, oldest first.
func (s *Service) History(room string) []Line {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Line{}, s.hist[room]...)
}

func (s *Service) serveHistory(r *courier.Request) {
	room := strings.TrimSpace(string(r.Body()))
	if _, ok := s.rooms[room]; !ok {
		r.Fail(fmt.Errorf("no room %q", room))
		return
	}
	body, _ := json.Marshal(s.History(room))
	r.Reply(body)
}
