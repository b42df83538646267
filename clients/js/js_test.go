// Package js holds the Go side of the JavaScript client's tests: it
// starts a real server, writes the Go codec's frames for the JavaScript
// codec to match, and runs `node --test` on clients/js/test.
package js

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// goldenFrame is a frame as the Go codec encodes it, with its fields,
// for the JavaScript codec to decode and encode again byte for byte.
type goldenFrame struct {
	Hex    string            `json:"hex"`
	Type   int               `json:"type"`
	Flags  int               `json:"flags"`
	Ref    string            `json:"ref"` // decimal: may pass 2^53
	Attach uint32            `json:"attach"`
	Aux    string            `json:"aux"`
	Name   string            `json:"name"`
	Key    string            `json:"key"`
	Tag    string            `json:"tag"`
	Header map[string]string `json:"headers"`
	Body   string            `json:"body"` // hex
}

// verdict is what wire.Decode says of some bytes (after the prefix).
type verdict struct {
	Hex string `json:"hex"`
	OK  bool   `json:"ok"`
	// Again is the frame encoded again by the Go codec when it decoded
	// and has at most one header (so that the order is fixed).
	Again string `json:"again,omitempty"`
}

type golden struct {
	Frames   []goldenFrame `json:"frames"`
	Verdicts []verdict     `json:"verdicts"`
}

func goldenFrames(t *testing.T) golden {
	frames := []wire.Frame{
		{Type: wire.TypePing, Ref: 1},
		{Type: wire.TypeHello, Body: []byte(`{"versions":[1]}`)},
		{Type: wire.TypeRequest, Ref: 7, Aux: 1500, Name: "users", Key: "u42", Header: map[string]string{"lang": "en"}, Body: []byte("ping")},
		{Type: wire.TypeResponse, Flags: wire.FlagLast, Ref: 7, Name: "n1/c2.1", Body: []byte("pong")},
		{Type: wire.TypeResponse, Flags: wire.FlagChunk | wire.FlagError, Ref: 1<<64 - 1, Aux: 1 << 53, Tag: "é ü 日本"},
		{Type: wire.TypeAttach, Ref: 300, Attach: 1<<32 - 1, Aux: 2, Name: "prices.eu", Tag: "eu", Body: []byte(`{"patterns":["#"]}`)},
		{Type: wire.TypeMessage, Attach: 3, Key: "prices.eu.fr", Body: []byte{0, 1, 2, 255}},
		{Type: wire.TypeCredit, Aux: 32768},
		{Type: wire.TypeError, Flags: wire.FlagFatal, Aux: 17, Tag: "bad user name or password"},
		{Type: wire.TypeSubmit, Flags: wire.FlagReply | wire.FlagWatch, Ref: 1 << 40, Name: "jobs", Key: "k", Aux: 9, Tag: "due=1", Header: map[string]string{"": ""}, Body: []byte("x")},
	}
	var g golden
	for _, f := range frames {
		p, err := wire.AppendFrame(nil, &f, 0)
		if err != nil {
			t.Fatal(err)
		}
		g.Frames = append(g.Frames, goldenFrame{Hex: hex.EncodeToString(p), Type: int(f.Type), Flags: int(f.Flags),
			Ref: strconv.FormatUint(f.Ref, 10), Attach: f.Attach, Aux: strconv.FormatUint(f.Aux, 10),
			Name: f.Name, Key: f.Key, Tag: f.Tag, Header: f.Header, Body: hex.EncodeToString(f.Body)})
	}
	// Mutations of the frames above, and random bytes: the two codecs
	// must accept and refuse the same ones.
	rng := rand.New(rand.NewPCG(17, 17))
	for i := range 3000 {
		var p []byte
		if i%4 == 3 {
			p = make([]byte, rng.IntN(24))
			for j := range p {
				p[j] = byte(rng.UintN(256))
			}
		} else {
			src, _ := hex.DecodeString(g.Frames[rng.IntN(len(g.Frames))].Hex)
			p = bytes.Clone(src[4:])
			for range 1 + rng.IntN(3) {
				switch rng.IntN(4) {
				case 0:
					p[rng.IntN(len(p))] = byte(rng.UintN(256))
				case 1:
					p = p[:rng.IntN(len(p)+1)]
				case 2:
					p = append(p, byte(rng.UintN(256)))
				case 3:
					p[rng.IntN(len(p))] ^= 1 << rng.UintN(8)
				}
				if len(p) == 0 {
					break
				}
			}
		}
		var f wire.Frame
		v := verdict{Hex: hex.EncodeToString(p), OK: wire.Decode(p, &f) == nil}
		if v.OK && len(f.Header) <= 1 {
			again, _ := wire.AppendFrame(nil, &f, 0)
			v.Again = hex.EncodeToString(again)
		}
		g.Verdicts = append(g.Verdicts, v)
	}
	return g
}

// nodeCommand returns the node binary and the flags it needs for a
// global WebSocket (Node.js 20 has it behind a flag; 22 has it).
func nodeCommand(t *testing.T) (string, []string) {
	bin, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed (apt-get install nodejs): the JavaScript client is not tested")
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimPrefix(strings.TrimSpace(string(out)), "v")
	major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	if major < 20 {
		// 18 works with a WebSocket implementation passed in (docs/js.md),
		// which this test, with no npm packages, does not have.
		t.Skipf("node %s has no built-in WebSocket (20 has it behind a flag): the JavaScript client is not tested", v)
	}
	if major < 22 {
		return bin, []string{"--experimental-websocket"}
	}
	return bin, nil
}

// suiteServers starts what the JavaScript client's suite runs against:
// a node n with Go handlers of exchanges go.echo and go.ask (which asks
// its requester a question) over TCP, and a node secure with user admin
// (password s3cret-pass). origins are allowed on both (a browser's page).
func suiteServers(t *testing.T, origins ...string) (n, secure *node.Node) {
	t.Helper()
	var err error
	n, err = node.Start(node.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", WSOrigins: origins,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })

	// A Go handler over TCP, for the JavaScript requester to reach.
	ctx := context.Background()
	gc, err := client.Dial(ctx, n.URL(), client.Options{Name: "go-echo"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gc.Close() })
	echo, err := gc.ReqResp(ctx, "go.echo", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := echo.Handle(ctx, func(r *courier.Request) {
		r.Reply(append([]byte("go:"), r.Body()...))
	}); err != nil {
		t.Fatal(err)
	}

	// A Go handler that asks its requester a question (ask and answer).
	asker, err := gc.ReqResp(ctx, "go.ask", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := asker.Handle(ctx, func(r *courier.Request) {
		a, err := r.Ask(ctx, append([]byte("go asks: "), r.Body()...))
		if err != nil {
			r.Fail(err)
			return
		}
		r.Reply(append([]byte("go got: "), a...))
	}); err != nil {
		t.Fatal(err)
	}

	// A node with users, for the credentials.
	secure, err = node.Start(node.Config{
		DataDir: t.TempDir(), Listen: "127.0.0.1:0", HTTP: "127.0.0.1:0", WSOrigins: origins,
		AdminUser: "admin", AdminPassword: "s3cret-pass",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { secure.Close() })

	return n, secure
}

// TestJS runs the JavaScript client's tests (clients/js/test) in
// Node.js against a real server (suiteServers): its WebSocket URL in
// COURIER_WS_URL, the node with users in COURIER_WS_AUTH_URL, and the Go
// codec's frames in COURIER_GOLDEN.
func TestJS(t *testing.T) {
	bin, flags := nodeCommand(t)
	n, secure := suiteServers(t)
	ctx := context.Background()

	g, _ := json.Marshal(goldenFrames(t))
	gf := filepath.Join(t.TempDir(), "golden.json")
	if err := os.WriteFile(gf, g, 0o600); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	args := append(flags, "--test", "--test-reporter=spec", "test/")
	cmd := exec.CommandContext(tctx, bin, args...)
	cmd.Env = append(os.Environ(), "COURIER_WS_URL=ws://"+n.HTTPAddr().String()+"/ws", "COURIER_GOLDEN="+gf,
		"COURIER_WS_AUTH_URL=ws://"+secure.HTTPAddr().String()+"/ws", "NODE_NO_WARNINGS=1")
	out, err := cmd.CombinedOutput()
	t.Logf("node %s:\n%s", strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("node --test: %v", err)
	}
}
