package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/node"
)

func init() { commands = append(commands, serverCmd) }

func serverCmd() *cobra.Command {
	cfg := node.DefaultConfig()
	cfg.Listen = "127.0.0.1:7400"
	cfg.HTTP = admin.DefaultListen
	var logLevel, logFormat string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a broker: clients on 127.0.0.1:7400, dashboard on http://127.0.0.1:7480, data in ./courier-data",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg.Log = log
			if cfg.HTTP == "off" {
				cfg.HTTP = ""
			}
			n, err := node.Start(cfg)
			if err != nil && !cmd.Flags().Changed("http") && errors.Is(err, admin.ErrListen) && errors.Is(err, syscall.EADDRINUSE) {
				// Only the default address is busy (another server on this
				// machine): run without the management listener.
				log.Warn("management API off: its default address is in use; choose one with --http", "addr", cfg.HTTP)
				cfg.HTTP = ""
				n, err = node.Start(cfg)
			}
			if err != nil {
				return err
			}
			log.Info("courier server started", "node", n.Name(), "url", n.URL(), "http", n.HTTPURL(), "data", cfg.DataDir)
			<-cmd.Context().Done()
			log.Info("shutting down")
			return n.Close()
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "client listener address")
	f.StringVar(&cfg.HTTP, "http", cfg.HTTP, `management API, metrics and dashboard address, loopback only ("" or "off": none)`)
	f.StringVar(&cfg.DataDir, "data", cfg.DataDir, "data directory")
	f.StringVar(&cfg.Name, "name", cfg.Name, "node name")
	f.DurationVar(&cfg.Heartbeat, "heartbeat", time.Second, "heartbeat interval; silent clients are cut after three")
	f.IntVar(&cfg.MaxFrame, "max-frame", 4<<20, "largest frame in bytes")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}

func newLogger(level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad --log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("bad --log-format %q: text or json", format)
}
