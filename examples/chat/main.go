// Command chat is a multi-room chat on Courier: a small Go service with
// an embedded node, and a web page that talks to the node over WebSocket
// with Courier's JavaScript client (clients/js). See README.md.
//
//	go run ./examples/chat             # from the repository's root
//	open http://127.0.0.1:8080/?user=alice
package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/courier-mq/courier/node"
)

//go:embed web
var webFS embed.FS

// Options are the command's flags.
type Options struct {
	Listen  string // the node's client listener
	HTTP    string // the node's HTTP listener, where /ws is
	Web     string // where the page is served
	DataDir string // the node's data; empty: a temporary directory
	JSDir   string // clients/js
	Rooms   []string
	Banned  []string
	History int
}

func main() {
	var o Options
	var rooms, banned string
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:7400", "the embedded node's client listener")
	flag.StringVar(&o.HTTP, "http", "127.0.0.1:7480", "the embedded node's HTTP listener (the page's WebSocket: ws://HTTP/ws)")
	flag.StringVar(&o.Web, "web", "127.0.0.1:8080", "where the chat page is served")
	flag.StringVar(&o.DataDir, "data", "", "the node's data directory (default: a temporary one, removed on exit)")
	flag.StringVar(&o.JSDir, "js", "clients/js", "the directory of Courier's JavaScript client")
	flag.StringVar(&rooms, "rooms", "lobby,dev,random", "the rooms, comma-separated")
	flag.StringVar(&banned, "ban", "", "users whose subscriptions the moderator refuses, comma-separated")
	flag.IntVar(&o.History, "history", 50, "messages of a room a joining user gets")
	flag.Parse()
	o.Rooms, o.Banned = splitList(rooms), splitList(banned)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := run(ctx, o, log, os.Stdout, nil); err != nil {
		fmt.Fprintln(os.Stderr, "chat:", err)
		os.Exit(1)
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// run starts the node, the service and the page's server, calls ready
// (if not nil) with the page's URL, and serves until ctx ends.
func run(ctx context.Context, o Options, log *slog.Logger, out io.Writer, ready func(page string, n *node.Node)) error {
	if _, err := os.Stat(filepath.Join(o.JSDir, "courier.js")); err != nil {
		return fmt.Errorf("no courier.js in %s (run from the repository's root or pass --js): %w", o.JSDir, err)
	}
	web, err := net.Listen("tcp", o.Web)
	if err != nil {
		return err
	}
	defer web.Close()
	dir := o.DataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "courier-chat-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	n, err := node.Start(node.Config{
		DataDir: dir, Listen: o.Listen, HTTP: o.HTTP, Log: log,
		WSOrigins: []string{web.Addr().String()},
	})
	if err != nil {
		return err
	}
	defer n.Close()
	if _, err := Start(ctx, n.Connect(), Config{Rooms: o.Rooms, Banned: o.Banned, History: o.History}); err != nil {
		return err
	}
	srv := &http.Server{Handler: pageHandler(o, "ws://"+n.HTTPAddr().String()+"/ws"), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(web) }()
	page := "http://" + web.Addr().String() + "/"
	fmt.Fprintf(out, "chat: node %s, WebSocket ws://%s/ws, page %s\n", n.Name(), n.HTTPAddr(), page)
	if ready != nil {
		ready(page, n)
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// pageHandler serves the page (web/), the client (/js/) and the page's
// configuration (/config.json: the WebSocket URL and the rooms).
func pageHandler(o Options, wsURL string) http.Handler {
	sub, _ := fs.Sub(webFS, "web")
	mux := http.NewServeMux()
	mux.Handle("/", http.FileServerFS(sub))
	mux.Handle("/js/", http.StripPrefix("/js/", http.FileServer(http.Dir(o.JSDir))))
	cfg, _ := json.Marshal(map[string]any{"ws": wsURL, "rooms": o.Rooms})
	mux.HandleFunc("/config.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(cfg)
	})
	return mux
}
