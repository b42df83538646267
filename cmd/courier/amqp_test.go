package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier/internal/testutil"
)

func TestAMQPAddress(t *testing.T) {
	for _, tc := range []struct{ v, listen, want string }{
		{"", "127.0.0.1:7400", "127.0.0.1:5672"},
		{"", "0.0.0.0:7400", "0.0.0.0:5672"},
		{"", "[::1]:7400", "[::1]:5672"},
		{"", "", ""},
		{"off", "127.0.0.1:7400", ""},
		{"127.0.0.1:5673", "127.0.0.1:7400", "127.0.0.1:5673"},
	} {
		if got := amqpAddress(tc.v, tc.listen); got != tc.want {
			t.Errorf("amqpAddress(%q, %q) = %q, want %q", tc.v, tc.listen, got, tc.want)
		}
	}
}

// TestServerAMQP runs `courier server --amqp` and logs in with a
// RabbitMQ client; the config file's amqp key does the same.
func TestServerAMQP(t *testing.T) {
	for _, how := range []string{"flag", "config"} {
		t.Run(how, func(t *testing.T) {
			addr := "127.0.0.1:" + cliFreePort(t)
			var srv *cliProc
			if how == "flag" {
				_, srv = cliServer(t, "--amqp", addr)
			} else {
				// Flags override the file: cliServer's --amqp off would win.
				path := filepath.Join(t.TempDir(), "courier.toml")
				conf := "amqp = \"" + addr + "\"\nlisten = \"127.0.0.1:" + cliFreePort(t) + "\"\nhttp = \"off\"\n"
				if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
					t.Fatal(err)
				}
				srv = cliStart(t, "", nil, "server", "--config", path, "--data", t.TempDir(), "--log-level", "warn")
			}
			var c *amqp091.Connection
			testutil.WaitForf(t, cliWait, func() bool {
				var err error
				c, err = amqp091.Dial("amqp://guest:guest@" + addr + "/")
				return err == nil || srv.exited()
			}, "AMQP login on %s", addr)
			if c == nil {
				t.Fatalf("server exited:\n%s", srv.stderr.String())
			}
			defer c.Close()
			if _, err := c.Channel(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestServerAMQPOffInConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "courier.toml")
	if err := os.WriteFile(path, []byte("amqp = \"off\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sc := defaultServerConfig()
	cmd := newServerCmd(&sc)
	if err := cmd.ParseFlags([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	if _, err := loadServerConfig(path, cmd.Flags(), &sc); err != nil {
		t.Fatal(err)
	}
	if got := amqpAddress(sc.AMQP, sc.Listen); got != "" {
		t.Fatalf("amqp = \"off\" resolves to %q", got)
	}
	if !strings.Contains(cmd.Flags().Lookup("amqp").Usage, "5672") {
		t.Fatal("--amqp's help does not name the default port")
	}
}

// TestServerAMQPOutboxBytes: limits.amqp_outbox_bytes in the file, and
// --amqp-outbox-bytes over it.
func TestServerAMQPOutboxBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "courier.toml")
	if err := os.WriteFile(path, []byte("[limits]\namqp_outbox_bytes = 33554432\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 16 << 20},
		{[]string{"--config", path}, 32 << 20},
		{[]string{"--config", path, "--amqp-outbox-bytes", "67108864"}, 64 << 20},
	} {
		sc := defaultServerConfig()
		cmd := newServerCmd(&sc)
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		if cfgPath, _ := cmd.Flags().GetString("config"); cfgPath != "" {
			if _, err := loadServerConfig(cfgPath, cmd.Flags(), &sc); err != nil {
				t.Fatal(err)
			}
		}
		if sc.Limits.AMQPOutboxBytes != c.want {
			t.Errorf("%v: amqp outbox %d, want %d", c.args, sc.Limits.AMQPOutboxBytes, c.want)
		}
	}
}

// TestCrashKeepsAMQPConfirms kills a real server with SIGKILL while an
// AMQP publisher sends persistent messages to a durable queue under
// publisher confirms, restarts it, and consumes the queue: every message
// the server confirmed is there.
func TestCrashKeepsAMQPConfirms(t *testing.T) {
	dir := t.TempDir()
	addr, amqpAddr := "127.0.0.1:"+cliFreePort(t), "127.0.0.1:"+cliFreePort(t)
	url := "amqp://guest:guest@" + amqpAddr + "/"
	start := func() *cliProc {
		srv := cliStart(t, "", nil, "server", "--listen", addr, "--amqp", amqpAddr, "--data", dir, "--http", "off", "--log-level", "warn")
		cliAccepting(t, srv, amqpAddr)
		return srv
	}
	dial := func() (*amqp091.Connection, *amqp091.Channel) {
		c, err := amqp091.Dial(url)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := c.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare("crash-amqp", true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		return c, ch
	}

	srv := start()
	c, ch := dial()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 1024))
	var mu sync.Mutex
	confirmed := map[string]bool{}
	published := map[uint64]string{} // delivery tag → body, tags from 1 in publish order
	var nConfirmed atomic.Int64
	go func() {
		for cf := range confirms {
			if !cf.Ack {
				continue
			}
			mu.Lock()
			confirmed[published[cf.DeliveryTag]] = true
			mu.Unlock()
			nConfirmed.Add(1)
		}
	}()
	ctx := testutil.Context(t, 2*time.Minute)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := uint64(1); ; i++ {
			body := fmt.Sprintf("m-%d", i)
			mu.Lock()
			published[i] = body
			mu.Unlock()
			if err := ch.PublishWithContext(ctx, "", "crash-amqp", false, false, amqp091.Publishing{DeliveryMode: amqp091.Persistent, Body: []byte(body)}); err != nil {
				return // the server is gone
			}
		}
	}()
	testutil.WaitForf(t, time.Minute, func() bool { return nConfirmed.Load() >= 2000 }, "2000 confirms before the crash")
	if err := srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-srv.done
	<-pubDone
	c.Close()
	mu.Lock()
	want := len(confirmed)
	mu.Unlock()

	start()
	_, ch = dial()
	msgs, err := ch.Consume("crash-amqp", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	missing := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for b := range confirmed {
			if !got[b] {
				n++
			}
		}
		return n
	}
	deadline := time.After(time.Minute)
	for missing() > 0 {
		select {
		case d := <-msgs:
			got[string(d.Body)] = true
			d.Ack(false)
		case <-deadline:
			t.Fatalf("%d of %d confirmed messages lost after SIGKILL", missing(), want)
		}
	}
	t.Logf("%d messages confirmed before SIGKILL, all consumed after the restart (%d consumed)", want, len(got))
}
