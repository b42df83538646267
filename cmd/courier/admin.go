package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func init() {
	commands = append(commands, overviewCmd, connectionsCmd, queuesCmd)
}

// apiFlags are the flags of the tools that use the management API.
type apiFlags struct {
	api     string
	timeout time.Duration
	json    bool
	sec     secFlags
}

func (a *apiFlags) add(cmd *cobra.Command) {
	def := os.Getenv("COURIER_API")
	if def == "" {
		def = "http://127.0.0.1:7480"
	}
	cmd.Flags().StringVar(&a.api, "api", def, "management API URL, http:// or https:// (env COURIER_API)")
	cmd.Flags().DurationVar(&a.timeout, "timeout", 5*time.Second, "time limit for the request (0: none)")
	cmd.Flags().BoolVar(&a.json, "json", false, "print the API's JSON")
	a.sec.add(cmd, false)
}

// get fetches path from the management API; with v, it decodes the JSON
// answer into it, else it returns the body as it came.
func (a *apiFlags) get(ctx context.Context, path string, query url.Values, v any) ([]byte, error) {
	return a.call(ctx, http.MethodGet, path, query, nil, nil, v)
}

// getOrPrint fetches path into v, or with --json prints the API's JSON
// instead and reports that it did.
func (a *apiFlags) getOrPrint(cmd *cobra.Command, path string, v any) (printed bool, err error) {
	body, err := a.get(cmd.Context(), path, nil, v)
	if err != nil || !a.json {
		return false, err
	}
	return true, printJSON(cmd.OutOrStdout(), body)
}

// call sends a request to the management API with the flags' credentials:
// body, when not nil, goes as JSON; hdr are extra headers (name, value
// pairs). Any answer but 2xx is an error with the API's reason.
func (a *apiFlags) call(ctx context.Context, method, path string, query url.Values, body any, hdr []string, v any) ([]byte, error) {
	base, err := url.Parse(strings.TrimRight(a.api, "/"))
	if err != nil || base.Scheme != "http" && base.Scheme != "https" || base.Host == "" {
		return nil, usageErrorf("bad --api %q: want http://host:port", a.api)
	}
	user, pass := a.sec.user, a.sec.password
	if base.User != nil {
		user = base.User.Username()
		pass, _ = base.User.Password()
		base.User = nil
	}
	u := base.JoinPath(path)
	u.RawQuery = query.Encode()
	if a.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.timeout)
		defer cancel()
	}
	var rd io.Reader
	if raw, ok := body.(json.RawMessage); ok {
		// As it is: Marshal would escape <, > and &, and grow it.
		rd = bytes.NewReader(raw)
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	hc := http.DefaultClient
	tc, err := a.sec.tlsConfig()
	if err != nil {
		return nil, withCode(exitUsage, err)
	}
	if tc != nil {
		hc = &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}}
	}
	resp, err := hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		hint := "is `courier server` running, with --http on that address?"
		if strings.Contains(err.Error(), "malformed HTTP") {
			hint = "the server there does not speak HTTP: a Courier client port? The management API is on the server's --http address, default port 7480"
		}
		return nil, withCode(exitConnect, fmt.Errorf("cannot reach the management API at %s: %v (%s)", base, err, hint))
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", u, err)
	}
	if resp.StatusCode/100 != 2 {
		var hint string
		switch {
		case resp.StatusCode == http.StatusUnauthorized && user == "":
			hint = "; give --user and --password (or COURIER_USER and COURIER_PASSWORD)"
		case resp.StatusCode == http.StatusUnauthorized:
			hint = "; check --user and --password"
		}
		var e struct{ Error, Reason string }
		if json.Unmarshal(out, &e) == nil && e.Error == "wrong_port" {
			return nil, withCode(exitConnect, fmt.Errorf("%s: %s", base, e.Reason))
		}
		if json.Unmarshal(out, &e) == nil && e.Reason != "" {
			return nil, withCode(httpExitCode(resp.StatusCode), fmt.Errorf("%s (HTTP %d from %s %s)%s", e.Reason, resp.StatusCode, method, u.Path, hint))
		}
		return nil, withCode(httpExitCode(resp.StatusCode), fmt.Errorf("HTTP %s from %s %s%s", resp.Status, method, u.Path, hint))
	}
	if v != nil {
		if err := json.Unmarshal(out, v); err != nil {
			return nil, fmt.Errorf("bad answer from %s: %w", u, err)
		}
	}
	return out, nil
}

// httpExitCode is the exit code of a management API answer's status.
func httpExitCode(status int) int {
	switch status {
	case http.StatusNotFound:
		return exitNotFound
	case http.StatusUnauthorized, http.StatusForbidden:
		return exitRefused
	}
	return exitFailure
}

// printJSON writes an API answer indented.
func printJSON(w io.Writer, body []byte) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, body, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

// rate is a figure of RabbitMQ's {"rate": r} form.
type rate struct {
	Rate float64 `json:"rate"`
}

func (r rate) String() string { return fmtRate(r.Rate) }

func fmtRate(r float64) string {
	if r >= 100 {
		return strconv.FormatFloat(r, 'f', 0, 64) + "/s"
	}
	return strconv.FormatFloat(r, 'f', 1, 64) + "/s"
}

func fmtBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

func fmtAgo(ms int64) string {
	if ms <= 0 {
		return "-"
	}
	return time.Since(time.UnixMilli(ms)).Round(time.Second).String()
}

func overviewCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "overview",
		Short: "Show the node's objects, message totals and rates (management API)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var o struct {
				Node           string `json:"node"`
				CourierVersion string `json:"courier_version"`
				GoVersion      string `json:"go_version"`
				Uptime         int64  `json:"uptime"`
				ObjectTotals   struct {
					Connections, Exchanges, Queues, Attachments int
				} `json:"object_totals"`
				QueueTotals struct {
					Messages       uint64 `json:"messages"`
					Ready          uint64 `json:"messages_ready"`
					Unacknowledged uint64 `json:"messages_unacknowledged"`
				} `json:"queue_totals"`
				MessageStats map[string]json.RawMessage `json:"message_stats"`
				Listeners    []struct{ Protocol, Address string }
				Alarms       []struct{ Kind, Resource, Message string }
			}
			if printed, err := af.getOrPrint(cmd, "/api/overview", &o); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "node\t%s (courier %s, %s), up %s\n", o.Node, o.CourierVersion, o.GoVersion, (time.Duration(o.Uptime) * time.Millisecond).Round(time.Second))
			t := o.ObjectTotals
			fmt.Fprintf(tw, "objects\t%d connections, %d exchanges, %d queues, %d attachments\n", t.Connections, t.Exchanges, t.Queues, t.Attachments)
			q := o.QueueTotals
			fmt.Fprintf(tw, "queued\t%d messages (%d ready, %d unacknowledged)\n", q.Messages, q.Ready, q.Unacknowledged)
			var ls []string
			for _, l := range o.Listeners {
				ls = append(ls, l.Protocol+" "+l.Address)
			}
			fmt.Fprintf(tw, "listeners\t%s\n", strings.Join(ls, ", "))
			if len(o.Alarms) == 0 {
				fmt.Fprintf(tw, "alarms\tnone\n")
			}
			for _, a := range o.Alarms {
				what := a.Kind
				if a.Resource != "" {
					what += " " + a.Resource
				}
				fmt.Fprintf(tw, "ALARM\t%s: %s\n", what, a.Message)
			}
			fmt.Fprintln(tw)
			fmt.Fprintln(tw, "MESSAGES\tTOTAL\tRATE")
			for _, k := range []string{"publish", "request", "deliver", "response", "ack"} {
				var n uint64
				var r rate
				json.Unmarshal(o.MessageStats[k], &n)
				json.Unmarshal(o.MessageStats[k+"_details"], &r)
				fmt.Fprintf(tw, "%s\t%d\t%s\n", k, n, r)
			}
			return tw.Flush()
		},
	}
	af.add(cmd)
	return cmd
}

// listFlags are the list options the API takes.
type listFlags struct {
	sort    string
	reverse bool
	name    string
}

func (l *listFlags) add(cmd *cobra.Command, sortHelp string) {
	cmd.Flags().StringVar(&l.sort, "sort", "", "sort by this field, such as "+sortHelp)
	cmd.Flags().BoolVar(&l.reverse, "reverse", false, "reverse the order")
	cmd.Flags().StringVar(&l.name, "name", "", "only names containing this")
}

func (l *listFlags) query(columns string) url.Values {
	q := url.Values{}
	if columns != "" {
		q.Set("columns", columns)
	}
	if l.sort != "" {
		q.Set("sort", l.sort)
	}
	if l.reverse {
		q.Set("sort_reverse", "true")
	}
	if l.name != "" {
		q.Set("name", l.name)
	}
	return q
}

func connectionsCmd() *cobra.Command {
	var af apiFlags
	var lf listFlags
	cmd := &cobra.Command{
		Use:   "connections",
		Short: "List connections with their peers, attachments and rates (management API)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if af.json {
				body, err := af.get(cmd.Context(), "/api/connections", lf.query(""), nil)
				if err != nil {
					return err
				}
				return printJSON(out, body)
			}
			var list []struct {
				ID, Name, Type, Peer, User string
				Attachments                int
				Inflight                   int64
				ConnectedAt                int64 `json:"connected_at"`
				Stats                      struct {
					Request  rate `json:"request_details"`
					Publish  rate `json:"publish_details"`
					Deliver  rate `json:"deliver_details"`
					Response rate `json:"response_details"`
				} `json:"message_stats"`
			}
			cols := "id,name,type,peer,user,attachments,inflight,connected_at,message_stats"
			if _, err := af.get(cmd.Context(), "/api/connections", lf.query(cols), &list); err != nil {
				return err
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tTYPE\tPEER\tUSER\tATTACHMENTS\tIN FLIGHT\tCONNECTED\tREQUESTS\tPUBLISHES\tDELIVERED\tRESPONSES")
			for _, c := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.Name, c.Type, dash(c.Peer), dash(c.User),
					c.Attachments, c.Inflight, fmtAgo(c.ConnectedAt), c.Stats.Request, c.Stats.Publish, c.Stats.Deliver, c.Stats.Response)
			}
			return tw.Flush()
		},
	}
	af.add(cmd)
	lf.add(cmd, "message_stats.deliver_details.rate")
	return cmd
}

func queuesCmd() *cobra.Command {
	var af apiFlags
	var lf listFlags
	cmd := &cobra.Command{
		Use:   "queues",
		Short: "List queues with their depth, consumers, rates and replicas (management API)",
		Long: `List the queues (GET /api/queues): depth, consumers, rates, and for a
replicated queue (TYPE quorum) its leader's node, its replicas' nodes
and those online (live and voting). Every node of a cluster lists every
replicated queue, asking each queue's leader's node for its figures.
The subcommands look at one queue and move leaders and replicas, as
rabbitmq-queues does for quorum queues.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if af.json {
				body, err := af.get(cmd.Context(), "/api/queues", lf.query(""), nil)
				if err != nil {
					return err
				}
				return printJSON(out, body)
			}
			var list []apiQueue
			cols := "name,messages,messages_ready,messages_unacknowledged,consumers,memory,message_stats,type,leader,members,online"
			if _, err := af.get(cmd.Context(), "/api/queues", lf.query(cols), &list); err != nil {
				return err
			}
			if len(list) == 0 && lf.name == "" {
				fmt.Fprintln(out, "no queues")
				return nil
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tMESSAGES\tREADY\tUNACKED\tCONSUMERS\tMEMORY\tPUBLISH\tDELIVER\tACK\tTYPE\tLEADER\tMEMBERS\tONLINE")
			for _, q := range list {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", q.Name, q.Messages, q.MessagesReady, q.MessagesUnacknowledged,
					q.Consumers, fmtBytes(q.Memory), q.Stats.Publish, q.Stats.Deliver, q.Stats.Ack,
					dash(q.Type), dash(q.Leader), dash(strings.Join(q.Members, ",")), dash(strings.Join(q.Online, ",")))
			}
			return tw.Flush()
		},
	}
	af.add(cmd)
	lf.add(cmd, "messages_ready")
	cmd.AddCommand(queueShowCmd(), queuesRebalanceCmd(), queuesGrowCmd(), queuesShrinkCmd(),
		queueMemberCmd(false), queueMemberCmd(true))
	return cmd
}
