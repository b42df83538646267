package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startService(t *testing.T, cfg Config) (*node.Node, *Service) {
	t.Helper()
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	s, err := Start(context.Background(), n.Connect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n, s
}

func dial(t *testing.T, n *node.Node, name string) *courier.Conn {
	t.Helper()
	c, err := client.Dial(context.Background(), n.URL(), client.Options{Name: name, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestModeration: the rooms' controller refuses a banned user's
// subscription with its reason, and narrows a greedy one to the room's
// two keys.
func TestModeration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, _ := startService(t, Config{Rooms: []string{"lobby"}, Banned: []string{"mallory"}})
	c := dial(t, n, "mallory")
	room, err := c.PubSub(ctx, "room.lobby", courier.Passive())
	if err != nil {
		t.Fatal(err)
	}
	_, err = room.Subscribe(ctx, "msg", func(*courier.Delivery) {}, courier.ConnTag("mallory"))
	var we *wire.Error
	if !errors.As(err, &we) || !strings.Contains(err.Error(), "mallory is banned") {
		t.Fatalf("a banned user's subscription: %v, want refused as banned", err)
	}
	a, err := room.Subscribe(ctx, "#", func(*courier.Delivery) {}, courier.ConnTag("eve"))
	if err != nil {
		t.Fatalf("eve's subscription: %v", err)
	}
	if !testutil.Eventually(10*time.Second, func() bool {
		p := a.Patterns()
		return len(p) == 2 && p[0] == "msg" && p[1] == "typing"
	}) {
		t.Fatalf("eve's patterns %v, want narrowed to [msg typing]", a.Patterns())
	}
}

// TestHistory: the service relays lines from chat.say to their room,
// keeps the last N of each room and serves them on chat.history; typing
// indicators are not kept, nor lines of another room, a banned user's
// or what is not a line.
func TestHistory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, _ := startService(t, Config{Rooms: []string{"lobby", "dev"}, History: 3, Banned: []string{"mallory"}})
	c := dial(t, n, "alice")
	lobby, err := c.PubSub(ctx, "room.lobby", courier.Passive())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var live []string
	if _, err := lobby.Subscribe(ctx, "msg", func(d *courier.Delivery) {
		mu.Lock()
		live = append(live, string(d.Body))
		mu.Unlock()
	}, courier.ConnTag("alice")); err != nil {
		t.Fatal(err)
	}
	say, err := c.PubSub(ctx, SayExchange, courier.Passive())
	if err != nil {
		t.Fatal(err)
	}
	for i, text := range []string{"one", "two", "three", "four"} {
		b, _ := json.Marshal(Line{From: "alice", Text: text, TS: int64(i + 1)})
		if err := say.PublishSync(ctx, courier.Message{Key: "lobby", Body: b}); err != nil {
			t.Fatal(err)
		}
		lobby.Publish(ctx, "typing", []byte(`{"from":"alice","text":"","ts":9}`))
	}
	say.PublishSync(ctx, courier.Message{Key: "dev", Body: []byte(`{"from":"bob","text":"elsewhere","ts":5}`)})
	say.PublishSync(ctx, courier.Message{Key: "lobby", Body: []byte(`{"from":"mallory","text":"spam","ts":6}`)})
	say.PublishSync(ctx, courier.Message{Key: "lobby", Body: []byte(`not json`)})
	hx, err := c.ReqResp(ctx, HistoryExchange, courier.Passive())
	if err != nil {
		t.Fatal(err)
	}
	var got []Line
	ok := testutil.Eventually(10*time.Second, func() bool {
		r, err := hx.Request(ctx, courier.Message{Body: []byte("lobby")})
		if err != nil || r.Err != nil {
			return false
		}
		got = nil
		json.Unmarshal(r.Body, &got)
		return len(got) == 3 && got[2].Text == "four"
	})
	if !ok {
		t.Fatalf("history of lobby %+v, want two, three, four", got)
	}
	if got[0].Text != "two" || got[1].Text != "three" {
		t.Fatalf("history of lobby %+v, want two, three, four", got)
	}
	if !testutil.Eventually(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(live) == 4
	}) {
		t.Fatalf("lines relayed to the room: %q, want 4", live)
	}
	r, err := hx.Request(ctx, courier.Message{Body: []byte("nowhere")})
	if err == nil && r.Err == nil {
		t.Fatalf("history of an unknown room answered %q", r.Body)
	}
}

// TestDirectMessage: a direct message is a request to the recipient's
// own exchange; nobody there fails at once with no handler.
func TestDirectMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, _ := startService(t, Config{Rooms: []string{"lobby"}})
	bob := dial(t, n, "bob")
	inbox, err := bob.ReqResp(ctx, userPrefix+"bob", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	if _, err := inbox.Handle(ctx, func(r *courier.Request) {
		mu.Lock()
		got = append(got, string(r.Body()))
		mu.Unlock()
		r.Reply([]byte("shown"))
	}); err != nil {
		t.Fatal(err)
	}
	alice := dial(t, n, "alice")
	to, err := alice.ReqResp(ctx, userPrefix+"bob", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	r, err := to.Request(ctx, courier.Message{Body: []byte(`{"from":"alice","text":"psst"}`)})
	if err != nil || r.Err != nil || string(r.Body) != "shown" {
		t.Fatalf("DM: %v %+v", err, r)
	}
	carol, err := alice.ReqResp(ctx, userPrefix+"carol", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	_, err = carol.Request(ctx, courier.Message{Body: []byte("hi")})
	if !errors.Is(err, courier.ErrNoHandler) {
		t.Fatalf("DM to nobody: %v, want ErrNoHandler", err)
	}
}

func TestValidName(t *testing.T) {
	for s, want := range map[string]bool{"lobby": true, "a-b_9": true, "": false, "a.b": false, "a*": false, "#": false, strings.Repeat("x", 33): false} {
		if validName(s) != want {
			t.Errorf("validName(%q) = %v", s, !want)
		}
	}
}

// TestRelayAfterRestart: lines sent while the service is away wait in
// its durable subscription to chat.say and are relayed and kept when it
// comes back.
func TestRelayAfterRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := node.Start(node.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	cfg := Config{Rooms: []string{"lobby"}}
	first := n.Connect()
	if _, err := Start(ctx, first, cfg); err != nil {
		t.Fatal(err)
	}
	first.Close() // the service goes away
	c := dial(t, n, "alice")
	say, err := c.PubSub(ctx, SayExchange, courier.Passive())
	if err != nil {
		t.Fatal(err)
	}
	if err := say.PublishSync(ctx, courier.Message{Key: "lobby", Body: []byte(`{"from":"alice","text":"anyone?","ts":7}`)}); err != nil {
		t.Fatal(err)
	}
	s, err := Start(ctx, n.Connect(), cfg)
	if err != nil {
		t.Fatalf("the service again: %v", err)
	}
	if !testutil.Eventually(10*time.Second, func() bool {
		h := s.History("lobby")
		return len(h) == 1 && h[0].Text == "anyone?"
	}) {
		t.Fatalf("history after the restart: %+v, want the line sent meanwhile", s.History("lobby"))
	}
}
