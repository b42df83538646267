package main

import (
	"os"
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
