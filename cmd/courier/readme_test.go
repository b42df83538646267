package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/courier-mq/courier/internal/testutil"
)

// TestReadmeQuickStart runs README's quick start against a fresh server
// and checks that what each command prints is what README says it
// prints: each step's line must be in README as it is here, and its
// output as its comment says.
func TestReadmeQuickStart(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	url, _ := cliServer(t, "--node", "web1-3fa2") // the name README's host gave itself
	type step struct {
		line   string   // as README shows it
		args   []string // the command's arguments
		bg     bool     // run in the background (&)
		stdout string   // what a foreground command prints
		stderr string   // what a background command says once ready
	}
	steps := []step{
		{line: "./courier exchanges create greeter --strategy round-robin  # → exchange greeter: reqresp round-robin",
			args: []string{"exchanges", "create", "greeter", "--strategy", "round-robin"}, stdout: "exchange greeter: reqresp round-robin\n"},
		{line: "./courier reply greeter pong &                # a handler; on stderr: handling requests on greeter as web1-3fa2/c2.1",
			args: []string{"reply", "greeter", "pong"}, bg: true, stderr: "handling requests on greeter as web1-3fa2/c2.1\n"},
		{line: "./courier req greeter ping                    # → pong",
			args: []string{"req", "greeter", "ping"}, stdout: "pong\n"},
		{line: "./courier exchanges create news --pattern pubsub  # → exchange news: pubsub",
			args: []string{"exchanges", "create", "news", "--pattern", "pubsub"}, stdout: "exchange news: pubsub\n"},
		{line: "./courier sub news 'eu.#' &                   # a subscriber; on stderr: subscribed to eu.# on news as web1-3fa2/c5.1",
			args: []string{"sub", "news", "eu.#"}, bg: true, stderr: "subscribed to eu.# on news as web1-3fa2/c5.1\n"},
		{line: "./courier pub news eu.fr.paris \"bonjour\"      # → published 1 message(s) to news with key \"eu.fr.paris\" (confirmed)\n" +
			"                                              #   (and the subscriber prints [#1] eu.fr.paris: bonjour)",
			args: []string{"pub", "news", "eu.fr.paris", "bonjour"}, stdout: "published 1 message(s) to news with key \"eu.fr.paris\" (confirmed)\n"},
		{line: "./courier exchanges create resize --pattern tasks  # → exchange resize: tasks competing",
			args: []string{"exchanges", "create", "resize", "--pattern", "tasks"}, stdout: "exchange resize: tasks competing\n"},
		{line: "./courier task work resize &                  # a worker: prints [#1] task 1: img-42, and acks it",
			args: []string{"task", "work", "resize"}, bg: true, stderr: "working on resize as web1-3fa2/c8.1 (prefetch 1)\n"},
		{line: "./courier task submit resize \"img-42\" --watch # → task 1 submitted to resize\n" +
			"                                              #   task 1: completed by web1-3fa2/c8.1",
			args: []string{"task", "submit", "resize", "img-42", "--watch"}, stdout: "task 1 submitted to resize\ntask 1: completed by web1-3fa2/c8.1\n"},
	}
	var bg []*cliProc
	for _, s := range steps {
		if !strings.Contains(readme, s.line+"\n") {
			t.Errorf("README's quick start lacks the line:\n%s", s.line)
		}
		args := append(s.args, "--url", url)
		if s.bg {
			p := cliStart(t, "", nil, args...)
			p.waitStderr(t, s.stderr)
			if got := p.stderr.String(); got != s.stderr {
				t.Errorf("%v: stderr %q, want %q", s.args, got, s.stderr)
			}
			bg = append(bg, p)
			continue
		}
		if out := cliOK(t, args...); out != s.stdout {
			t.Errorf("%v printed %q, want %q", s.args, out, s.stdout)
		}
	}
	// What the background commands printed, as the comments say.
	for i, want := range []string{"[#1] request from web1-3fa2/c3: ping\n", "[#1] eu.fr.paris: bonjour\n", "[#1] task 1: img-42\n"} {
		p := bg[i]
		testutil.Eventually(cliWait, func() bool { return p.stdout.String() == want })
		if got := p.stdout.String(); got != want {
			t.Errorf("%v printed %q, want %q", p.args, got, want)
		}
	}
}

// TestReadmeCluster runs README's cluster snippet: three `courier server`
// processes on the ports README shows, moved to free ones, then status,
// a declare on n3, a handler on n2 and a request from n1.
func TestReadmeCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("three servers")
	}
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "## A cluster of nodes")
	if i < 0 {
		t.Fatal("README has no cluster section")
	}
	block := readme[i:]
	block = block[strings.Index(block, "```sh\n")+6:]
	block = block[:strings.Index(block, "```")]
	// Every README port moves to a free one, the same everywhere.
	ports := map[string]string{}
	for _, p := range []string{"7400", "7401", "7402", "7480", "7481", "7482", "7500", "7501", "7502"} {
		ports[p] = cliFreePort(t)
	}
	move := func(s string) string {
		for from, to := range ports {
			s = strings.ReplaceAll(s, "127.0.0.1:"+from, "127.0.0.1:"+to)
		}
		return s
	}
	dir := t.TempDir()
	var lines []string
	for l := range strings.SplitSeq(strings.TrimSpace(block), "\n") {
		if c := strings.Index(l, "#"); c > 0 {
			l = l[:c]
		}
		lines = append(lines, strings.Fields(move(l))...)
		lines = append(lines, "\n")
	}
	var cmds [][]string
	var cur []string
	for _, w := range lines {
		if w == "\n" {
			if len(cur) > 0 {
				cmds = append(cmds, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, w)
	}
	if len(cmds) != 7 || cmds[0][1] != "server" {
		t.Fatalf("README's cluster snippet has %d commands: %q", len(cmds), cmds)
	}
	for _, c := range cmds[:3] {
		args := c[1:]
		for j, a := range args {
			if a == "--data" {
				args[j+1] = filepath.Join(dir, args[j+1])
			}
		}
		cliStart(t, "", nil, append(args, "--log-level", "warn")...)
	}
	api := "http://127.0.0.1:" + ports["7480"]
	testutil.Eventually(cliWait, func() bool {
		r := cliRun(t, "cluster", "status", "--api", api)
		return r.code == 0 && strings.Count(r.stdout, "alive") == 3 && strings.Contains(r.stdout, "yes")
	})
	if out := cliOK(t, "cluster", "status", "--api", api); strings.Count(out, "alive") != 3 {
		t.Fatalf("cluster status:\n%s", out)
	}
	if out := cliOK(t, cmds[4][1:]...); out != "exchange greeter: reqresp round-robin\n" {
		t.Errorf("%v: %q", cmds[4], out)
	}
	reply := slices.DeleteFunc(slices.Clone(cmds[5][1:]), func(a string) bool { return a == "&" })
	h := cliStart(t, "", nil, reply...)
	h.waitStderr(t, "handling requests on greeter as n2/")
	if out := cliOK(t, cmds[6][1:]...); out != "pong\n" {
		t.Errorf("%v: %q, want pong", cmds[6], out)
	}
}
