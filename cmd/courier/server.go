package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/node"
)

func init() { commands = append(commands, serverCmd) }

// serverConfig is the configuration file of `courier server`: the keys
// of [node.Config] at the top level and in its tables, and [log].
// docs/operations.md is its reference.
type serverConfig struct {
	node.Config
	Log logConfig `toml:"log"`
	// OldName is the node's name under the key of versions before node;
	// see nodeName.
	OldName string `toml:"name"`
}

// nodeName takes the name of the old key name when node is not set,
// and refuses the two set apart.
func (sc *serverConfig) nodeName() error {
	switch {
	case sc.OldName == "" || sc.OldName == sc.Name:
	case sc.Name == "":
		sc.Name = sc.OldName
	default:
		return fmt.Errorf("config: node = %q and name = %q: name is the old spelling of node; keep one", sc.Name, sc.OldName)
	}
	sc.OldName = ""
	return nil
}

type logConfig struct {
	Level  string `toml:"level"`  // debug, info, warn or error
	Format string `toml:"format"` // text or json
}

func defaultServerConfig() serverConfig {
	c := serverConfig{Config: node.DefaultConfig(), Log: logConfig{Level: "info", Format: "text"}}
	c.Listen = "127.0.0.1:7400"
	c.HTTP = admin.DefaultListen
	return c
}

// loadServerConfig reads the file at path into cfg, and then sets again
// the flags given on the command line: flags override the file. It
// reports whether the file set the management address.
func loadServerConfig(path string, flags *pflag.FlagSet, cfg *serverConfig) (httpSet bool, err error) {
	given := map[string]string{}
	flags.Visit(func(f *pflag.Flag) { given[f.Name] = f.Value.String() })
	md, err := toml.DecodeFile(path, cfg)
	if err != nil {
		return false, fmt.Errorf("config %s: %w", path, err)
	}
	if keys := md.Undecoded(); len(keys) > 0 {
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = k.String()
		}
		return false, fmt.Errorf("config %s: unknown key(s) %s; docs/operations.md lists the keys", path, strings.Join(names, ", "))
	}
	if err := cfg.nodeName(); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	for name, v := range given {
		if err := flags.Set(name, v); err != nil {
			return false, fmt.Errorf("--%s: %w", name, err)
		}
	}
	return md.IsDefined("http"), nil
}

func serverCmd() *cobra.Command {
	sc := defaultServerConfig()
	return newServerCmd(&sc)
}

// newServerCmd returns the server command, its flags bound to sc.
func newServerCmd(sc *serverConfig) *cobra.Command {
	cfg := &sc.Config
	var configPath, adminPasswordFile, join string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a broker: clients on 127.0.0.1:7400, dashboard on http://127.0.0.1:7480, data in ./courier-data",
		Long: `Run a broker. Settings come from the defaults, then the configuration file
given with --config (TOML; docs/operations.md lists every key), then the
flags given, which override the file.

SIGTERM or SIGINT shuts the server down gracefully: it stops accepting,
tells every client (CLOSE, code 16), lets requests in flight finish within
--drain-timeout, and exits 0. A second signal closes at once. When a
component the server cannot run without fails (more restarts than
--max-restarts within --restart-window), it exits 1.

SIGHUP reloads the users and permissions (<data>/users.json) and the TLS
certificates, without dropping a connection.

Without users the server listens on loopback addresses only. Create the
first administrator on first start with COURIER_ADMIN_USER and
COURIER_ADMIN_PASSWORD (or --admin-user and --admin-password-file); then
manage users with 'courier users'.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Signals, not the command's context: the second one must be
			// told from the first.
			sigs := make(chan os.Signal, 2)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(sigs)
			httpSet := cmd.Flags().Changed("http")
			if configPath != "" {
				set, err := loadServerConfig(configPath, cmd.Flags(), sc)
				if err != nil {
					return withCode(exitUsage, err)
				}
				httpSet = httpSet || set
			}
			if cmd.Flags().Changed("join") {
				cfg.Cluster.Join = splitList(join)
			}
			if cfg.Cluster.SecretFile == "" && len(cfg.Cluster.Secret) == 0 {
				cfg.Cluster.Secret = node.SecretFromEnv()
			}
			log, err := newLogger(sc.Log.Level, sc.Log.Format)
			if err != nil {
				return withCode(exitUsage, err)
			}
			cfg.Log = log
			if cfg.HTTP == "off" {
				cfg.HTTP = ""
			}
			amqpSet := cfg.AMQP != ""
			cfg.AMQP = amqpAddress(cfg.AMQP, cfg.Listen)
			setMemoryLimit(log, cfg.MemoryBudget, cfg.MemoryHighWatermark)
			if err := adminPassword(cfg, adminPasswordFile); err != nil {
				return withCode(exitUsage, err)
			}
			if err := cfg.Validate(); err != nil {
				return withCode(exitUsage, err)
			}
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			n, err := node.Start(*cfg)
			for err != nil && errors.Is(err, syscall.EADDRINUSE) {
				// Only a default address is busy (another server on this
				// machine, or RabbitMQ on 5672): run without that listener.
				if !httpSet && cfg.HTTP != "" && errors.Is(err, admin.ErrListen) {
					log.Warn("management API off: its default address is in use; choose one with --http", "addr", cfg.HTTP)
					cfg.HTTP = ""
				} else if !amqpSet && cfg.AMQP != "" && errors.Is(err, amqp.ErrListen) {
					log.Warn("AMQP listener off: its default address is in use (RabbitMQ?); choose one with --amqp", "addr", cfg.AMQP)
					cfg.AMQP = ""
				} else {
					break
				}
				n, err = node.Start(*cfg)
			}
			if errors.Is(err, node.ErrDataDirOfAnotherNode) || errors.Is(err, node.ErrBadIdentity) {
				return withCode(exitUsage, err)
			}
			if le := (*store.LockedError)(nil); errors.As(err, &le) {
				return withCode(exitFailure, fmt.Errorf("data directory %s is in use: %s holds %s; stop it, or give this server another --data", cfg.DataDir, le.Holder(), le.Path))
			}
			if err != nil {
				return withCode(exitFailure, err)
			}
			log.Info("courier server started", "node", n.Name(), "url", n.URL(), "http", n.HTTPURL(), "amqp", n.AMQPURL(), "cluster", n.ClusterAddr(), "data", cfg.DataDir, "config", configPath)
		wait:
			for {
				select {
				case err := <-n.Failed():
					log.Error("exiting: a component the server cannot run without has failed", "err", err)
					n.Close()
					return fmt.Errorf("%w; exiting so that the service manager starts the server again", err)
				case <-hup:
					reload(n, log)
				case s := <-sigs:
					log.Info("shutting down: draining requests in flight; a second signal closes at once", "signal", s.String(), "drain_timeout", cfg.DrainTimeout)
					break wait
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				select {
				case s := <-sigs:
					log.Warn("second signal: closing without waiting for requests in flight", "signal", s.String())
					cancel()
				case <-ctx.Done():
				}
			}()
			if err := n.Shutdown(ctx); err != nil {
				log.Warn("shut down with requests unfinished", "err", err)
			} else {
				log.Info("shut down")
			}
			return nil
		},
	}
	d := defaultServerConfig()
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "configuration file (TOML); flags given override it")
	f.StringVar(&cfg.Listen, "listen", d.Listen, "client listener address; loopback only until the node has users")
	f.StringVar(&cfg.HTTP, "http", d.HTTP, `management API, metrics and dashboard address; loopback only until the node has users ("" or "off": none)`)
	f.StringVar(&cfg.AMQP, "amqp", "", `AMQP 0-9-1 listener address for RabbitMQ clients, TLS with --tls-cert (default: port 5672 on the host of --listen; "off": none)`)
	f.StringVar(&cfg.DataDir, "data", d.DataDir, "data directory")
	f.StringVar(&cfg.Name, "node", d.Name, "node name: letters, digits, '-', '_' (default: the one recorded in the data directory, or on a new one the host's name and 4 hex digits)")
	f.StringVar(&cfg.Name, "name", d.Name, "the old spelling of --node")
	f.MarkHidden("name")
	f.StringVar(&cfg.Cluster.Listen, "cluster", "", "cluster address, TCP and UDP, such as 127.0.0.1:7500: the node joins a cluster (default: none, a single node)")
	f.StringVar(&cfg.Cluster.Advertise, "cluster-advertise", "", "cluster address the other nodes reach this one at (default: --cluster's)")
	f.StringVar(&join, "join", "", "cluster addresses of seed nodes, comma-separated, tried until one answers")
	f.StringVar(&cfg.Cluster.SecretFile, "cluster-secret-file", "", "file holding the shared cluster secret, mode 600 (or env COURIER_CLUSTER_SECRET); needed beyond loopback")
	f.StringVar(&cfg.Cluster.TLS.CertFile, "cluster-tls-cert", "", "PEM certificate of this node for mutual TLS between nodes")
	f.StringVar(&cfg.Cluster.TLS.KeyFile, "cluster-tls-key", "", "PEM private key of --cluster-tls-cert")
	f.StringVar(&cfg.Cluster.TLS.ClientCAFile, "cluster-tls-ca", "", "PEM file of the cluster CA, which signed every node's certificate")
	f.IntVar(&cfg.Cluster.BootstrapExpect, "bootstrap-expect", 0, "nodes the cluster first forms with, as Consul's (default: 1 + the --join addresses; -1: never bootstrap, wait to be added)")
	f.DurationVar(&cfg.Heartbeat, "heartbeat", d.Heartbeat, "heartbeat interval; silent clients are cut after three")
	f.DurationVar(&cfg.DrainTimeout, "drain-timeout", d.DrainTimeout, "on SIGTERM, how long requests in flight may take to finish")
	f.Var(&cfg.MinFreeDisk, "min-free-disk", "free disk space under which publishers of durable queues are held (default 1GiB; -1: no check)")
	f.Var(&cfg.MemoryBudget, "memory-budget", "what durable queues keep in RAM before they page to disk: 64MiB, 2GB, 10% of the machine (default 32MiB; -1: none, page only near the high watermark)")
	f.Var(&cfg.MemoryHighWatermark, "memory-high-watermark", "what queues may hold in RAM at all before publishers are slowed, then held: 4GiB, 40% of the machine (default 40%; -1: none)")
	f.Var(&cfg.ScrubRate, "scrub-rate", "bytes a second the store's background check reads after start, to find damaged records (default 64MiB; -1: no check)")
	f.DurationVar(&cfg.SyncInterval, "sync-interval", d.SyncInterval, "fsync durable queues at most this often instead of group commit (0: group commit, the default)")
	l, dl := &cfg.Limits, d.Limits
	f.IntVar(&l.MaxFrame, "max-frame", dl.MaxFrame, "largest frame in bytes")
	f.IntVar(&l.MaxConns, "max-connections", dl.MaxConns, "connections the server accepts")
	f.IntVar(&l.MaxConnsPerUser, "max-connections-per-user", dl.MaxConnsPerUser, "connections of one user (0: no limit)")
	f.IntVar(&l.MaxHandshakes, "max-handshakes", dl.MaxHandshakes, "connections still in their handshake (no answered HELLO yet), TCP and WebSocket together")
	f.IntVar(&l.MaxHandshakesPerAddr, "max-handshakes-per-address", dl.MaxHandshakesPerAddr, "connections in their handshake from one source address (IPv4 address or IPv6 /64), TCP and WebSocket together")
	f.IntVar(&l.MaxAttachments, "max-attachments", dl.MaxAttachments, "attachments of one connection")
	f.IntVar(&l.MaxInflight, "max-inflight", dl.MaxInflight, "requests in flight from one connection")
	f.IntVar(&l.MaxPatternsPerAttachment, "max-patterns-per-attachment", dl.MaxPatternsPerAttachment, "subscription patterns of one subscriber")
	f.IntVar(&l.MaxPatternsPerConnection, "max-patterns-per-connection", dl.MaxPatternsPerConnection, "subscription patterns of one connection's subscribers together")
	f.IntVar(&l.MaxDurableSubscriptions, "max-durable-subscriptions", dl.MaxDurableSubscriptions, "durable subscriptions of the node")
	f.IntVar(&l.MaxPatternsPerPeer, "max-patterns-per-peer", dl.MaxPatternsPerPeer, "in a cluster, another node's subscription patterns held here per exchange")
	f.DurationVar(&l.MaxDeadline, "max-request-deadline", dl.MaxDeadline, "longest request deadline; requests without one get it (0: no maximum)")
	f.IntVar(&l.AMQPOutboxBytes, "amqp-outbox-bytes", dl.AMQPOutboxBytes, "bytes waiting for one AMQP client past which a delivery cuts it off as a slow consumer (at least twice the largest message)")
	f.IntVar(&cfg.Supervision.MaxRestarts, "max-restarts", d.Supervision.MaxRestarts, "restarts of a component allowed within --restart-window before it is marked failed")
	f.DurationVar(&cfg.Supervision.RestartWindow, "restart-window", d.Supervision.RestartWindow, "period of the restart intensity")
	f.StringVar(&cfg.TLS.CertFile, "tls-cert", "", "PEM certificate (chain) file: the client listener speaks TLS only (courier+tls://)")
	f.StringVar(&cfg.TLS.KeyFile, "tls-key", "", "PEM private key file of --tls-cert")
	f.StringVar(&cfg.TLS.ClientCAFile, "tls-client-ca", "", "PEM file of CAs: require client certificates they signed")
	f.StringVar(&cfg.HTTPTLS.CertFile, "http-tls-cert", "", "PEM certificate file: the management listener speaks HTTPS only")
	f.StringVar(&cfg.HTTPTLS.KeyFile, "http-tls-key", "", "PEM private key file of --http-tls-cert")
	f.StringVar(&cfg.AdminUser, "admin-user", os.Getenv("COURIER_ADMIN_USER"), "create this administrator on first start, when the data dir has no users (env COURIER_ADMIN_USER; password from COURIER_ADMIN_PASSWORD or --admin-password-file)")
	f.StringVar(&adminPasswordFile, "admin-password-file", "", "file whose first line is the first administrator's password")
	f.Var(listFlag{&cfg.WSOrigins}, "ws-origins", `browser origins allowed on ws://HTTP/ws besides the listener's own, comma-separated host patterns ("chat.example.com,*.example.com" or "https://chat.example.com")`)
	f.BoolVar(&cfg.MetricsAuth, "metrics-auth", false, "ask for credentials on /metrics too once there are users")
	f.StringVar(&sc.Log.Level, "log-level", d.Log.Level, "debug, info, warn or error")
	f.StringVar(&sc.Log.Format, "log-format", d.Log.Format, "text or json")
	return cmd
}

func newLogger(level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("bad log format %q: text or json", format)
}

// setMemoryLimit gives the Go runtime a soft memory limit above the
// node's memory high watermark (node.GoMemoryLimit), unless GOMEMLIMIT
// sets one: the watermark bounds what the queues hold, and the limit
// keeps garbage from doubling the heap on top of it when they hold that
// much.
func setMemoryLimit(log *slog.Logger, budget, watermark node.ByteSize) {
	limit := node.GoMemoryLimit(budget, watermark)
	if os.Getenv("GOMEMLIMIT") != "" || limit <= 0 {
		return
	}
	debug.SetMemoryLimit(limit)
	log.Debug("Go memory limit set from the memory high watermark", "budget", budget.String(), "watermark", watermark.String(), "limit", node.ByteSize(limit).String())
}

// adminPassword sets the first administrator's password from
// --admin-password-file or COURIER_ADMIN_PASSWORD, never from a flag's
// value or the configuration file, which others may read.
func adminPassword(cfg *node.Config, file string) error {
	cfg.AdminPassword = os.Getenv("COURIER_ADMIN_PASSWORD")
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("--admin-password-file: %w", err)
		}
		cfg.AdminPassword, _, _ = strings.Cut(string(b), "\n")
		cfg.AdminPassword = strings.TrimRight(cfg.AdminPassword, "\r")
	}
	switch {
	case cfg.AdminUser != "" && cfg.AdminPassword == "":
		return errors.New("the first administrator needs a password: set COURIER_ADMIN_PASSWORD or --admin-password-file")
	case cfg.AdminUser == "" && cfg.AdminPassword != "":
		return errors.New("an administrator password without a name: set COURIER_ADMIN_USER or --admin-user")
	}
	return nil
}

// reload reloads users, permissions and TLS certificates, as on SIGHUP.
// Connections stay open.
func reload(n *node.Node, log *slog.Logger) {
	if err := n.Reload(); err != nil {
		log.Error("reload on SIGHUP failed; what was loaded stays in use", "err", err)
		return
	}
	log.Info("reloaded on SIGHUP: users, permissions and certificates")
}

// listFlag is a flag holding a comma-separated list, such as
// --ws-origins: given again, it replaces the list.
type listFlag struct{ p *[]string }

func (l listFlag) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l listFlag) Set(s string) error {
	*l.p = splitList(s)
	return nil
}

func (l listFlag) Type() string { return "list" }

// amqpAddress resolves the AMQP listener's address: "off" is none, ""
// is port 5672 on the host of the client listener (none without one).
func amqpAddress(v, listen string) string {
	switch v {
	case "off":
		return ""
	case "":
		host, _, err := net.SplitHostPort(listen)
		if err != nil || listen == "" {
			return ""
		}
		return net.JoinHostPort(host, amqp.DefaultPort)
	}
	return v
}
