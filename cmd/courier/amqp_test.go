package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
