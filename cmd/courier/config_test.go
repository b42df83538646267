package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServerConfigFile: the file sets every kind of key, flags given on
// the command line override it, and keys not given keep their defaults.
func TestServerConfigFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "courier.toml")
	os.WriteFile(path, []byte(`
node = "from-file"
listen = "127.0.0.1:7411"
http = "off"
drain_timeout = "3s"
memory_budget = "64MiB"
memory_high_watermark = "1GiB"

[log]
level = "warn"

[limits]
max_connections = 10
max_connections_per_user = 2
max_request_deadline = "90s"
max_patterns_per_attachment = 50

[supervision]
max_restarts = 3
restart_window = "10s"
`), 0o644)
	sc := defaultServerConfig()
	cmd := newServerCmd(&sc)
	if err := cmd.ParseFlags([]string{"--config", path, "--node", "from-flag", "--max-connections", "20"}); err != nil {
		t.Fatal(err)
	}
	httpSet, err := loadServerConfig(path, cmd.Flags(), &sc)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name != "from-flag" || sc.Limits.MaxConns != 20 {
		t.Errorf("flags do not override the file: name %q, max connections %d", sc.Name, sc.Limits.MaxConns)
	}
	if !httpSet || sc.Listen != "127.0.0.1:7411" || sc.HTTP != "off" || sc.DrainTimeout != 3*time.Second ||
		sc.Log.Level != "warn" || sc.Log.Format != "text" ||
		sc.Limits.MaxConnsPerUser != 2 || sc.Limits.MaxDeadline != 90*time.Second ||
		sc.Limits.MaxInflight != 65536 || sc.Limits.MaxFrame != 4<<20 ||
		sc.Limits.MaxPatternsPerAttachment != 50 || sc.Limits.MaxPatternsPerConnection != 10000 ||
		sc.Supervision.MaxRestarts != 3 || sc.Supervision.RestartWindow != 10*time.Second ||
		sc.MemoryBudget != 64<<20 || sc.MemoryHighWatermark != 1<<30 {
		t.Errorf("file not read as written, or defaults lost: %+v", sc)
	}
}

// TestServerNodeNameOldSpelling: --name and the key name, the spellings
// before --node and node, still set the node's name.
func TestServerNodeNameOldSpelling(t *testing.T) {
	path := filepath.Join(t.TempDir(), "courier.toml")
	os.WriteFile(path, []byte("name = \"old-key\"\n"), 0o644)
	sc := defaultServerConfig()
	if _, err := loadServerConfig(path, newServerCmd(&sc).Flags(), &sc); err != nil || sc.Name != "old-key" {
		t.Errorf("key name: %q, %v; want old-key", sc.Name, err)
	}
	sc = defaultServerConfig()
	cmd := newServerCmd(&sc)
	if err := cmd.ParseFlags([]string{"--name", "old-flag"}); err != nil || sc.Name != "old-flag" {
		t.Errorf("--name: %q, %v; want old-flag", sc.Name, err)
	}
	if f := cmd.Flags().Lookup("name"); f == nil || !f.Hidden {
		t.Error("--name is not a hidden alias")
	}
}

// TestServerConfigFileErrors: typos and bad values are clear errors.
func TestServerConfigFileErrors(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"lisen = \"x\"\n", "unknown key(s) lisen"},
		{"[limits]\nmax_conections = 1\n", "unknown key(s) limits.max_conections"},
		{"drain_timeout = \"soon\"\n", "soon"},
		{"node = \n", "config"},
		{"node = \"a\"\nname = \"b\"\n", "old spelling of node"},
	} {
		path := filepath.Join(t.TempDir(), "c.toml")
		os.WriteFile(path, []byte(tc.body), 0o644)
		sc := defaultServerConfig()
		_, err := loadServerConfig(path, newServerCmd(&sc).Flags(), &sc)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one with %q", tc.body, err, tc.want)
		}
	}
}

// TestServerSizeNone: -1, documented as "none" or "no check" for the
// size settings, is accepted by the flags and by the file, as a number
// or a string.
func TestServerSizeNone(t *testing.T) {
	sc := defaultServerConfig()
	cmd := newServerCmd(&sc)
	if err := cmd.ParseFlags([]string{"--memory-budget", "-1", "--min-free-disk", "-1", "--scrub-rate", "-1"}); err != nil {
		t.Fatalf("flags: %v", err)
	}
	if sc.MemoryBudget != -1 || sc.MinFreeDisk != -1 || sc.ScrubRate != -1 {
		t.Errorf("flags -1 read as budget %d, min free disk %d, scrub rate %d", sc.MemoryBudget, sc.MinFreeDisk, sc.ScrubRate)
	}
	path := filepath.Join(t.TempDir(), "courier.toml")
	os.WriteFile(path, []byte("memory_budget = -1\nmin_free_disk = \"-1\"\nscrub_rate = \"none\"\n"), 0o644)
	sc = defaultServerConfig()
	cmd = newServerCmd(&sc)
	if _, err := loadServerConfig(path, cmd.Flags(), &sc); err != nil {
		t.Fatalf("file: %v", err)
	}
	if sc.MemoryBudget != -1 || sc.MinFreeDisk != -1 || sc.ScrubRate != -1 {
		t.Errorf("file -1 read as budget %d, min free disk %d, scrub rate %d", sc.MemoryBudget, sc.MinFreeDisk, sc.ScrubRate)
	}
	// Other negative sizes stay errors.
	if err := newServerCmd(&sc).ParseFlags([]string{"--memory-budget", "-2"}); err == nil || !strings.Contains(err.Error(), "-1 for none") {
		t.Errorf("--memory-budget -2: %v", err)
	}
}

// TestCLIServerSizeNone: a server started with -1 for both runs.
func TestCLIServerSizeNone(t *testing.T) {
	url, _ := cliServer(t, "--memory-budget", "-1", "--min-free-disk", "-1")
	if out := cliOK(t, "exchanges", "create", "cli.none", "--pattern", "tasks", "--url", url); !strings.Contains(out, "tasks") {
		t.Errorf("create printed %q", out)
	}
	cliOK(t, "task", "submit", "cli.none", "x", "--url", url)
}

// TestServerConfigCluster: the [cluster] table sets node.Config.Cluster,
// and --node and --cluster override the file.
func TestServerConfigCluster(t *testing.T) {
	path := filepath.Join(t.TempDir(), "courier.toml")
	os.WriteFile(path, []byte(`
node = "n1"

[cluster]
listen = "127.0.0.1:7500"
advertise = "127.0.0.1:7510"
join = ["127.0.0.1:7501", "127.0.0.1:7502"]
secret_file = "/etc/courier/secret"

[cluster.tls]
cert_file = "node.pem"
key_file = "node.key"
client_ca_file = "ca.pem"
`), 0o644)
	sc := defaultServerConfig()
	cmd := newServerCmd(&sc)
	if err := cmd.ParseFlags([]string{"--config", path, "--node", "n2", "--cluster", "127.0.0.1:7600"}); err != nil {
		t.Fatal(err)
	}
	if _, err := loadServerConfig(path, cmd.Flags(), &sc); err != nil {
		t.Fatal(err)
	}
	c := sc.Cluster
	if sc.Name != "n2" || c.Listen != "127.0.0.1:7600" || c.Advertise != "127.0.0.1:7510" ||
		strings.Join(c.Join, ",") != "127.0.0.1:7501,127.0.0.1:7502" || c.SecretFile != "/etc/courier/secret" ||
		c.TLS.CertFile != "node.pem" || c.TLS.KeyFile != "node.key" || c.TLS.ClientCAFile != "ca.pem" {
		t.Errorf("cluster config: name %q, %+v", sc.Name, c)
	}
	if got := splitList(" a:1, ,b:2,"); strings.Join(got, "|") != "a:1|b:2" {
		t.Errorf("splitList: %q", got)
	}
}

// TestServerConfigWSOrigins: ws_origins in the file, --ws-origins over
// it, comma-separated.
func TestServerConfigWSOrigins(t *testing.T) {
	path := filepath.Join(t.TempDir(), "courier.toml")
	os.WriteFile(path, []byte(`ws_origins = ["chat.example.com", "https://*.example.org"]`), 0o644)
	sc := defaultServerConfig()
	cmd := newServerCmd(&sc)
	if err := cmd.ParseFlags([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	if _, err := loadServerConfig(path, cmd.Flags(), &sc); err != nil {
		t.Fatal(err)
	}
	if strings.Join(sc.WSOrigins, " ") != "chat.example.com https://*.example.org" {
		t.Errorf("from the file: %q", sc.WSOrigins)
	}
	sc = defaultServerConfig()
	cmd = newServerCmd(&sc)
	if err := cmd.ParseFlags([]string{"--config", path, "--ws-origins", "a.example, b.example"}); err != nil {
		t.Fatal(err)
	}
	if _, err := loadServerConfig(path, cmd.Flags(), &sc); err != nil {
		t.Fatal(err)
	}
	if strings.Join(sc.WSOrigins, " ") != "a.example b.example" {
		t.Errorf("the flag over the file: %q", sc.WSOrigins)
	}
}

// TestServerConfigHandshakeLimits: the handshake limits from the file,
// and --max-handshakes and --max-handshakes-per-address over it (a load
// test opening thousands of WebSockets from one address needs the
// second).
func TestServerConfigHandshakeLimits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "courier.toml")
	os.WriteFile(path, []byte("[limits]\nmax_handshakes = 300\nmax_handshakes_per_address = 20\n"), 0o644)
	for _, c := range []struct {
		flags         []string
		total, perAdd int
	}{
		{nil, 300, 20},
		{[]string{"--max-handshakes", "4000", "--max-handshakes-per-address", "2000"}, 4000, 2000},
	} {
		sc := defaultServerConfig()
		cmd := newServerCmd(&sc)
		if err := cmd.ParseFlags(append([]string{"--config", path}, c.flags...)); err != nil {
			t.Fatal(err)
		}
		if _, err := loadServerConfig(path, cmd.Flags(), &sc); err != nil {
			t.Fatal(err)
		}
		if sc.Limits.MaxHandshakes != c.total || sc.Limits.MaxHandshakesPerAddr != c.perAdd {
			t.Errorf("flags %q: max handshakes %d, per address %d; want %d and %d",
				c.flags, sc.Limits.MaxHandshakes, sc.Limits.MaxHandshakesPerAddr, c.total, c.perAdd)
		}
	}
}
