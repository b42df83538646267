package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func init() { commands = append(commands, clusterCmd) }

func clusterCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Look at the cluster the node belongs to (management API)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(clusterStatusCmd(), clusterForgetCmd())
	return cmd
}

func clusterForgetCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "forget NODE",
		Short: "Remove a node from the cluster for good (as rabbitmqctl forget_cluster_node)",
		Long: `Remove NODE from the cluster for good (DELETE /api/nodes/NODE on the node
at --api): it leaves the metadata group, which keeps a quorum of the
nodes left, and the exchanges it was home to move to other nodes. A node
that is merely down needs no forgetting: it rejoins with its state when
it starts again. Forget a node whose machine is gone, or before starting
a node of that name afresh.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := af.call(cmd.Context(), http.MethodDelete, "/api/nodes/"+url.PathEscape(args[0]), nil, nil, nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s forgotten\n", args[0])
			return nil
		},
	}
	af.add(cmd)
	return cmd
}

// apiNode is a row of /api/nodes.
type apiNode struct {
	Name           string `json:"name"`
	State          string `json:"state"`
	StateSince     int64  `json:"state_since"`
	Uptime         int64  `json:"uptime"`
	Version        string `json:"courier_version"`
	ClusterAddress string `json:"cluster_address"`
	ClientURL      string `json:"client_url"`
	HTTPURL        string `json:"http_url"`
	MetaLeader     bool   `json:"meta_leader"`
	Connections    int64  `json:"connections"`
	Exchanges      int64  `json:"exchanges"`
	Queues         int64  `json:"queues"`
	Links          []struct {
		Peer    string       `json:"peer"`
		Up      bool         `json:"up"`
		Since   int64        `json:"since"`
		RTT     float64      `json:"rtt_ms"`
		Control linkCounters `json:"control"`
		Data    linkCounters `json:"data"`
	} `json:"links"`
}

type linkCounters struct {
	FramesOut uint64 `json:"frames_out"`
	FramesIn  uint64 `json:"frames_in"`
	BytesOut  uint64 `json:"bytes_out"`
	BytesIn   uint64 `json:"bytes_in"`
}

func clusterStatusCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List the nodes of the cluster, their state, links and what they host, as the node at --api sees them",
		Long: `List the nodes of the cluster as the node at --api sees them (GET
/api/nodes): each node's state (alive, suspect, dead, left) and since
when, its addresses, whether it leads the metadata group, what it hosts,
and this node's links with it (up or down, heartbeat round trip, frames
each way on the control and data links). A single node lists itself.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var nodes []apiNode
			if printed, err := af.getOrPrint(cmd, "/api/nodes", &nodes); err != nil || printed {
				return err
			}
			return printNodes(cmd, nodes)
		},
	}
	af.add(cmd)
	return cmd
}

func printNodes(cmd *cobra.Command, nodes []apiNode) error {
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tSINCE\tUPTIME\tCLUSTER ADDRESS\tCLIENT URL\tHTTP URL\tMETA LEADER\tCONNECTIONS\tEXCHANGES\tQUEUES\tLINK\tRTT")
	for _, n := range nodes {
		link, rtt := "self", "-"
		if len(n.Links) == 1 && n.Links[0].Peer == n.Name {
			l := n.Links[0]
			link = "down"
			if l.Up {
				link = "up"
			}
			if l.RTT > 0 {
				rtt = fmt.Sprintf("%.2fms", l.RTT)
			}
		} else if n.ClusterAddress == "" {
			link = "-"
		}
		leader := "no"
		if n.MetaLeader {
			leader = "yes"
		}
		uptime := "-"
		if n.Uptime > 0 {
			uptime = (time.Duration(n.Uptime) * time.Millisecond).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", n.Name, n.State, fmtAgo(n.StateSince), uptime,
			dash(n.ClusterAddress), dash(n.ClientURL), dash(n.HTTPURL), leader, n.Connections, n.Exchanges, n.Queues, link, rtt)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range nodes {
		if len(n.Links) == 0 || len(n.Links) == 1 && n.Links[0].Peer == n.Name {
			continue
		}
		// The node answering: its links, with their counters.
		fmt.Fprintf(cmd.OutOrStdout(), "\nLinks of %s:\n", n.Name)
		tw = tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PEER\tUP\tSINCE\tRTT\tCONTROL FRAMES OUT/IN\tDATA FRAMES OUT/IN\tDATA BYTES OUT/IN")
		for _, l := range n.Links {
			rtt := "-"
			if l.RTT > 0 {
				rtt = fmt.Sprintf("%.2fms", l.RTT)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%d/%d\t%d/%d\n", l.Peer, yesNo(l.Up), fmtAgo(l.Since), rtt,
				l.Control.FramesOut, l.Control.FramesIn, l.Data.FramesOut, l.Data.FramesIn, l.Data.BytesOut, l.Data.BytesIn)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
