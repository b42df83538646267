package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
)

func init() {
	commands = append(commands, pubCmd, subCmd, reqCmd, replyCmd, exchangesCmd)
}

// conn flags shared by the client tools.
type connFlags struct {
	url       string
	timeout   time.Duration
	verbose   bool
	reconnect bool
	sec       secFlags
}

func (c *connFlags) add(cmd *cobra.Command) {
	def := os.Getenv("COURIER_URL")
	if def == "" {
		def = "courier://127.0.0.1:7400"
	}
	cmd.Flags().StringVar(&c.url, "url", def, "server URL, or a list tried in order: courier://host1:7400,host2:7400 (env COURIER_URL)")
	cmd.Flags().BoolVar(&c.reconnect, "reconnect", false, "when the connection is lost, reconnect to a server of the list (and those it names) and re-attach, instead of exiting 3")
	cmd.Flags().DurationVar(&c.timeout, "timeout", 5*time.Second, "time limit for connecting and each request (0: none)")
	cmd.Flags().BoolVar(&c.verbose, "verbose", false, "log what the client library sees (debug level) on stderr")
	c.sec.add(cmd, true)
}

// bound applies --timeout to ctx; 0 means no limit.
func (c *connFlags) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.timeout)
}

func (c *connFlags) dial(ctx context.Context) (*courier.Conn, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	opts := client.Options{Name: "courier-cli", Log: c.logger(), NoReconnect: !c.reconnect}
	if c.reconnect {
		opts.OnConnEvent = func(ev courier.ConnEvent) {
			switch ev.Kind {
			case courier.ConnDisconnected:
				fmt.Fprintf(os.Stderr, "connection lost (%v); reconnecting\n", ev.Err)
			case courier.ConnReconnected:
				fmt.Fprintf(os.Stderr, "reconnected to %s as %s after %v\n", ev.URL, ev.ID, ev.Down.Round(time.Millisecond))
				if ev.Err != nil {
					fmt.Fprintf(os.Stderr, "not restored: %v\n", ev.Err)
				}
			}
		}
	}
	list, err := client.ParseURLs(c.url)
	if err != nil {
		return nil, withCode(exitUsage, err)
	}
	if opts.TLS, err = c.sec.tlsConfig(); err != nil {
		return nil, withCode(exitUsage, err)
	}
	// Credentials in the URL win over --user and the environment.
	if list.User == nil {
		opts.User, opts.Password = c.sec.user, c.sec.password
	}
	conn, err := client.Dial(ctx, c.url, opts)
	return conn, connectError(err)
}

// logger is the client library's logger: nothing unless --verbose, so
// that a command prints only its output and its error.
func (c *connFlags) logger() *slog.Logger {
	if !c.verbose {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func parseHeaders(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	h := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usageErrorf("bad header %q: want name=value", kv)
		}
		h[k] = v
	}
	return h, nil
}

// await counts events from an attachment's function until count (0:
// forever), the attachment or the connection ends, or ctx is done.
func await(ctx context.Context, conn *courier.Conn, att *courier.Attachment, events <-chan struct{}, count int) error {
	for seen := 0; count == 0 || seen < count; {
		select {
		case <-events:
			seen++
		case <-att.Done():
			return att.Err()
		case <-conn.Done():
			return conn.Err()
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// messageArgs builds a message from the body argument at i and headers.
func messageArgs(args []string, i int, headers []string) (courier.Message, error) {
	body, err := bodyArg(args, i)
	if err != nil {
		return courier.Message{}, err
	}
	h, err := parseHeaders(headers)
	return courier.Message{Header: h, Body: body}, err
}

// bodyArg returns the body argument, or stdin when it is "-".
func bodyArg(args []string, i int) ([]byte, error) {
	if len(args) <= i {
		return nil, nil
	}
	if args[i] == "-" {
		return io.ReadAll(io.LimitReader(os.Stdin, 64<<20))
	}
	return []byte(args[i]), nil
}

func pubCmd() *cobra.Command {
	var cf connFlags
	var count int
	var confirm bool
	var headers []string
	cmd := &cobra.Command{
		Use:   "pub <exchange> <routing-key> [body|-]",
		Short: "Publish a message to a pub-sub exchange",
		Long: `Publish a message to a pub-sub exchange.

With --confirm (the default) each message is confirmed by the broker:
routed, and written and fsynced in every durable subscription it reached,
so that a crash of the server does not lose it there. With --count the
confirms are pipelined. With --confirm=false the messages go without
confirms, faster, except the last, which the command waits for; errors
the broker sends back are still reported.`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := messageArgs(args, 2, headers)
			if err != nil {
				return err
			}
			m.Key = args[1]
			ctx := cmd.Context()
			conn, err := cf.dial(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			ps, err := conn.PubSub(ctx, args[0], courier.Passive())
			if err != nil {
				return err
			}
			if err := publishN(ctx, conn, ps, m, count, confirm); err != nil {
				return err
			}
			how := ""
			if confirm {
				how = " (confirmed)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "published %d message(s) to %s with key %q%s\n", count, args[0], args[1], how)
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().IntVar(&count, "count", 1, "how many times to publish")
	cmd.Flags().BoolVar(&confirm, "confirm", true, "wait for the broker's confirm of every message (stored in every durable subscription it reached)")
	cmd.Flags().StringArrayVarP(&headers, "header", "H", nil, "header name=value (repeatable)")
	return cmd
}

// pubWindow bounds the confirms `courier pub` awaits at a time.
const pubWindow = 1000

// publishN publishes m count times: with confirm, every one confirmed,
// up to pubWindow at a time; without, all but the last unconfirmed, with
// the errors the broker sends back collected.
func publishN(ctx context.Context, conn *courier.Conn, ps *courier.PubSub, m courier.Message, count int, confirm bool) error {
	var mu sync.Mutex
	var first error
	fail := func(i int, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case first != nil:
		case i == 0: // an unconfirmed one: which is not known
			first = fmt.Errorf("publish: %w", err)
		default:
			first = fmt.Errorf("publish %d: %w", i, err)
		}
	}
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return first
	}
	if !confirm {
		conn.OnError(func(err error) { fail(0, err) })
		for i := 1; i < count; i++ {
			if err := ps.PublishMsg(ctx, m); err != nil {
				return fmt.Errorf("publish %d: %w", i, err)
			}
		}
		if count > 0 {
			if err := ps.PublishSync(ctx, m); err != nil {
				return fmt.Errorf("publish %d: %w", count, err)
			}
		}
		return failed()
	}
	window := make(chan struct{}, pubWindow)
	for i := 1; i <= count && failed() == nil; i++ {
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		err := ps.PublishAsync(ctx, m, func(err error) {
			if err != nil {
				fail(i, err)
			}
			<-window
		})
		if err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
	}
	for range pubWindow { // every confirm is in
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return failed()
}

func subCmd() *cobra.Command {
	var cf connFlags
	var count int
	var create bool
	cmd := &cobra.Command{
		Use:   "sub <exchange> <pattern>...",
		Short: "Subscribe to a pub-sub exchange and print messages",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			conn, err := cf.dial(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			ps, err := conn.PubSub(ctx, args[0], openOpts(create)...)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			got := make(chan struct{}, 1024)
			n := 0
			sub, err := ps.Subscribe(ctx, args[1], func(d *courier.Delivery) {
				n++
				fmt.Fprintf(out, "[#%d] %s: %s\n", n, d.Key, d.Body)
				got <- struct{}{}
			}, courier.Patterns(args[2:]...))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "subscribed to %s on %s as %s\n", strings.Join(sub.Patterns(), ", "), args[0], sub.ID())
			return await(ctx, conn, sub, got, count)
		},
	}
	cf.add(cmd)
	cmd.Flags().IntVar(&count, "count", 0, "exit after this many messages (0: never)")
	cmd.Flags().BoolVar(&create, "create", false, "create the exchange if it does not exist")
	return cmd
}

func reqCmd() *cobra.Command {
	var cf connFlags
	var key, tag string
	var all, stream bool
	var headers []string
	cmd := &cobra.Command{
		Use:   "req <exchange> [body|-]",
		Short: "Send a request and print the response(s)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := messageArgs(args, 1, headers)
			if err != nil {
				return err
			}
			m.Key, m.ServiceTag = key, tag
			ctx := cmd.Context()
			conn, err := cf.dial(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			ex, err := conn.ReqResp(ctx, args[0], courier.Passive())
			if err != nil {
				return err
			}
			ctx, cancel := cf.bound(ctx)
			defer cancel()
			out := cmd.OutOrStdout()
			switch {
			case stream:
				s, err := ex.RequestStream(ctx, m)
				if err != nil {
					return err
				}
				defer s.Close()
				for s.Next() {
					fmt.Fprintf(out, "%s\n", s.Chunk())
				}
				return s.Err()
			case all:
				rs, err := ex.RequestAll(ctx, m)
				return printAll(out, cmd.ErrOrStderr(), rs, err)
			}
			r, err := ex.Request(ctx, m)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s\n", r.Body)
			return nil
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&key, "key", "", "request key (for sticky exchanges)")
	cmd.Flags().StringVar(&tag, "tag", "", "service tag: only handlers of this tag")
	cmd.Flags().BoolVar(&all, "all", false, "collect every response (broadcast)")
	cmd.Flags().BoolVar(&stream, "stream", false, "read a chunked response")
	cmd.Flags().StringArrayVarP(&headers, "header", "H", nil, "header name=value (repeatable)")
	return cmd
}

// printAll prints the responses of `req --all`: each handler's response
// on out, each handler's error on errw. A request that failed as a
// whole (no handler, a timeout) is its error alone; a handler that
// failed makes the command fail after the other responses are printed.
func printAll(out, errw io.Writer, rs []*courier.Response, err error) error {
	if err != nil && len(rs) == 1 && rs[0].Err == err {
		return err
	}
	failed := 0
	for _, r := range rs {
		if r.Err != nil {
			failed++
			fmt.Fprintf(errw, "%s: error: %v\n", r.From, r.Err)
		} else {
			fmt.Fprintf(out, "%s: %s\n", r.From, r.Body)
		}
	}
	if err == nil && failed > 0 {
		err = fmt.Errorf("%d of %d handlers failed the request", failed, len(rs))
	}
	return err
}

func replyCmd() *cobra.Command {
	var cf connFlags
	var tag, connTag string
	var echo bool
	var count int
	cmd := &cobra.Command{
		Use:   "reply <exchange> [body]",
		Short: "Handle requests on an exchange with a fixed body (or --echo)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 && !echo {
				return usageErrorf("give a reply body or --echo")
			}
			ctx := cmd.Context()
			conn, err := cf.dial(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			ex, err := conn.ReqResp(ctx, args[0], courier.Passive())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			served := make(chan struct{}, 1024)
			n := 0
			att, err := ex.Handle(ctx, func(r *courier.Request) {
				n++
				fmt.Fprintf(out, "[#%d] request from %s: %s\n", n, r.From(), r.Body())
				if echo {
					r.Reply(r.Body())
				} else {
					r.Reply([]byte(args[1]))
				}
				served <- struct{}{}
			}, courier.ServiceTag(tag), courier.ConnTag(connTag))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "handling requests on %s as %s\n", args[0], att.ID())
			return await(ctx, conn, att, served, count)
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&tag, "tag", "", "service tag of this handler")
	cmd.Flags().StringVar(&connTag, "conn-tag", "", "connection tag of this handler")
	cmd.Flags().BoolVar(&echo, "echo", false, "reply with the request's body")
	cmd.Flags().IntVar(&count, "count", 0, "exit after this many requests (0: never)")
	return cmd
}

func exchangesCmd() *cobra.Command {
	var cf connFlags
	var asJSON bool
	list := func(cmd *cobra.Command, _ []string) error {
		ctx := cmd.Context()
		conn, err := cf.dial(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		exs, err := conn.Exchanges(ctx)
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		if asJSON {
			enc := json.NewEncoder(out)
			enc.SetIndent("", "  ")
			return enc.Encode(exs)
		}
		tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tPATTERN\tSTRATEGY\tMEMBERS\tSUBSCRIBERS\tLEADER\tREQUESTS\tPUBLISHES\tQUEUED")
		for _, e := range exs {
			queued := "-"
			if e.Queue != nil {
				queued = fmt.Sprint(e.Queue.Messages)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%d\t%d\t%s\n", e.Name, e.Pattern, dash(e.Strategy), len(e.Members), e.Subscribers, dash(e.Leader), e.Requests, e.Publishes, queued)
		}
		return tw.Flush()
	}
	cmd := &cobra.Command{
		Use:   "exchanges",
		Short: "List, create and delete exchanges",
		Args:  cobra.NoArgs,
		RunE:  list,
	}
	cf.add(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	lc := &cobra.Command{Use: "list", Short: "List exchanges", Args: cobra.NoArgs, RunE: list}
	cf.add(lc)
	lc.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var spec courier.ExchangeSpec
	cc := &cobra.Command{
		Use:   "create <name>",
		Short: "Create an exchange (--pattern reqresp|pubsub, --strategy for reqresp)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			conn, err := cf.dial(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			info, err := conn.Declare(ctx, args[0], spec)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), strings.TrimSpace(fmt.Sprintf("exchange %s: %s %s", info.Name, info.Pattern, info.Strategy)))
			return nil
		},
	}
	cf.add(cc)
	cc.Flags().StringVar(&spec.Pattern, "pattern", "reqresp", "reqresp, pubsub or tasks")
	cc.Flags().StringVar(&spec.Strategy, "strategy", "", "reqresp: broadcast, round-robin, leader, leader-round-robin, sticky, sticky-fun, fun, least-busy; tasks: competing, single-active")
	cc.Flags().BoolVar(&spec.Transient, "transient", false, "keep the exchange (and a task exchange's queue) in memory only: gone at restart")
	cc.Flags().IntVar(&spec.MaxAttempts, "max-attempts", 0, "tasks: failures before a task is dead-lettered (0: default 20, -1: no limit)")
	cc.Flags().Int64Var(&spec.TTLMS, "ttl-ms", 0, "tasks: how long a task may wait once due, in ms (0: no limit)")
	cc.Flags().StringVar(&spec.DeadLetter, "dead-letter", "", "tasks: exchange that receives the tasks that fail for good")
	cc.Flags().Int64Var(&spec.MaxLength, "max-length", 0, "tasks: most tasks the queue holds (0: no bound)")
	cc.Flags().Int64Var(&spec.MaxBytes, "max-bytes", 0, "tasks: most body bytes the queue holds (0: no bound)")
	cc.Flags().StringVar(&spec.Overflow, "overflow", "", "tasks: at the bound, reject-publish (default) or drop-head")
	cc.Flags().Int64Var(&spec.DedupWindowMS, "dedup-window-ms", 0, "tasks: how long a resent submit (same producer and seq) is stored once, in ms (0: default 120000, -1: off)")
	cc.Flags().IntVar(&spec.Replicas, "replicas", 0, "tasks: nodes of the cluster that hold the queue (0: default, 3 with three or more nodes; 1: one node)")
	cc.Flags().StringVar(&spec.KeyExpr, "key-expr", "", "sticky-fun key expression (CEL, docs/protocol.md §5.1)")
	cc.Flags().StringVar(&spec.RouteExpr, "route-expr", "", "fun routing expression (CEL, docs/protocol.md §5.1)")
	cc.Flags().BoolVar(&spec.Controlled, "controlled", false, "pub-sub: a controller decides on subscriptions")

	dc := &cobra.Command{
		Use:   "delete <name>",
		Short: "Delete an exchange",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			conn, err := cf.dial(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			if err := conn.DeleteExchange(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "exchange %s deleted\n", args[0])
			return nil
		},
	}
	cf.add(dc)
	cmd.AddCommand(lc, cc, dc)
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// openOpts are the options a tool opens an exchange with: passive (it
// must exist) unless --create was given.
func openOpts(create bool) []courier.ExchangeOption {
	if create {
		return nil
	}
	return []courier.ExchangeOption{courier.Passive()}
}
