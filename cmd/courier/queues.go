package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// apiQueue is a row of /api/queues.
type apiQueue struct {
	Name                   string
	Messages               uint64
	MessagesReady          uint64 `json:"messages_ready"`
	MessagesUnacknowledged uint64 `json:"messages_unacknowledged"`
	Consumers              int
	Memory                 uint64
	Stats                  struct {
		Publish rate `json:"publish_details"`
		Deliver rate `json:"deliver_details"`
		Ack     rate `json:"ack_details"`
	} `json:"message_stats"`
	Type     string   `json:"type"`
	Leader   string   `json:"leader"`
	Members  []string `json:"members"`
	Online   []string `json:"online"`
	Replicas []struct {
		Node   string  `json:"node"`
		Role   string  `json:"role"`
		Live   bool    `json:"live"`
		Behind *uint64 `json:"behind"`
	} `json:"replicas"`
	Change string `json:"membership_change"`
	Error  string `json:"replica_error"`
}

// longTimeout gives a command that moves replicas a longer default
// --timeout: a replica added catches up with the whole queue first.
func longTimeout(cmd *cobra.Command, af *apiFlags, d time.Duration) {
	af.timeout = d
	f := cmd.Flags().Lookup("timeout")
	f.DefValue = d.String()
}

func queueShowCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "show NAME",
		Short: "Show one queue: its figures and, replicated, each replica's role and lag",
		Long: `Show the queue NAME (GET /api/queues/NAME): its depth and consumers, and
for a replicated queue its leader and each replica: its node, its role
(leader, voter, or learner: a replica being added or rejoining after
losing data, which does not vote until it caught up), whether its node
is live, and how many log entries it is behind the leader.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var q apiQueue
			if printed, err := af.getOrPrint(cmd, "/api/queues/"+url.PathEscape(args[0]), &q); err != nil || printed {
				return err
			}
			printQueue(cmd.OutOrStdout(), q)
			return nil
		},
	}
	af.add(cmd)
	return cmd
}

// printQueue prints one queue as `courier queues show` does.
func printQueue(out io.Writer, q apiQueue) {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "queue\t%s\n", q.Name)
	fmt.Fprintf(tw, "type\t%s\n", dash(q.Type))
	fmt.Fprintf(tw, "messages\t%d (%d ready, %d unacked)\n", q.Messages, q.MessagesReady, q.MessagesUnacknowledged)
	fmt.Fprintf(tw, "consumers\t%d\n", q.Consumers)
	if q.Type != "quorum" {
		tw.Flush()
		return
	}
	fmt.Fprintf(tw, "leader\t%s\n", dash(q.Leader))
	fmt.Fprintf(tw, "online\t%d of %d (%s)\n", len(q.Online), len(q.Members), dash(strings.Join(q.Online, ",")))
	if c := q.Change; c != "" {
		what := "adding a replica on " + c[1:]
		if c[0] == '-' {
			what = "removing the replica on " + c[1:]
		}
		fmt.Fprintf(tw, "change\t%s\n", what)
	}
	if q.Error != "" {
		fmt.Fprintf(tw, "note\t%s\n", q.Error)
	}
	tw.Flush()
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tROLE\tLIVE\tBEHIND")
	for _, r := range q.Replicas {
		live, behind := "no", "?"
		if r.Live {
			live = "yes"
		}
		if r.Behind != nil {
			behind = fmt.Sprintf("%d", *r.Behind)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Node, r.Role, live, behind)
	}
	tw.Flush()
}

// apiRebalance is the answer of POST /api/queues/rebalance.
type apiRebalance struct {
	Before map[string]int `json:"before"`
	After  map[string]int `json:"after"`
	Moves  []struct {
		Queue, From, To, Error string
	} `json:"moves"`
}

func queuesRebalanceCmd() *cobra.Command {
	var af apiFlags
	var parallel int
	cmd := &cobra.Command{
		Use:   "rebalance",
		Short: "Spread the leaders of replicated queues evenly over the live nodes (as rabbitmq-queues rebalance quorum)",
		Long: `Spread the leaders of the replicated queues over the live nodes (POST
/api/queues/rebalance): leaderships move, by Raft leadership transfers,
from the nodes leading the most queues to the live voting replicas of
those queues leading the fewest, until no move would narrow the spread;
at most --parallel at a time. A queue moved stops serving on its old
leader and its workers follow it (a task in flight comes back, without
counting as a failed attempt). Prints each move and the leaders per node
before and after.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var res apiRebalance
			body, err := af.call(cmd.Context(), http.MethodPost, "/api/queues/rebalance", nil, map[string]int{"parallel": parallel}, nil, &res)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if af.json {
				return printJSON(out, body)
			}
			failed := 0
			for _, m := range res.Moves {
				if m.Error != "" {
					failed++
					fmt.Fprintf(out, "%s: not moved from %s to %s: %s\n", m.Queue, m.From, m.To, m.Error)
				} else {
					fmt.Fprintf(out, "%s: moved from %s to %s\n", m.Queue, m.From, m.To)
				}
			}
			if len(res.Moves) == 0 {
				fmt.Fprintln(out, "nothing to move: the leaders are spread evenly")
			}
			fmt.Fprintf(out, "leaders before: %s\nleaders after:  %s\n", fmtCounts(res.Before), fmtCounts(res.After))
			if failed > 0 {
				return fmt.Errorf("%d of %d moves did not happen", failed, len(res.Moves))
			}
			return nil
		},
	}
	af.add(cmd)
	longTimeout(cmd, &af, 5*time.Minute)
	cmd.Flags().IntVar(&parallel, "parallel", 4, "leaderships moved at once (1 to 64)")
	return cmd
}

// fmtCounts prints per-node counts by node name: "a 2, b 2, c 2".
func fmtCounts(m map[string]int) string {
	var parts []string
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}) {
		parts = append(parts, fmt.Sprintf("%s %d", n, m[n]))
	}
	return dash(strings.Join(parts, ", "))
}

// apiMemberResult is one queue of a grow or shrink.
type apiMemberResult struct {
	Queue, Node, Error string
}

func queuesGrowCmd() *cobra.Command { return growShrinkCmd(false) }

func queuesShrinkCmd() *cobra.Command { return growShrinkCmd(true) }

func growShrinkCmd(shrink bool) *cobra.Command {
	var af apiFlags
	var selector string
	cmd := &cobra.Command{
		Use:   "grow NODE",
		Short: "Add a replica on NODE to every replicated queue without one (as rabbitmq-queues grow)",
		Long: `Add a replica on NODE to every replicated queue that has none there (POST
/api/queues/grow), one queue at a time: each new replica joins its
queue's Raft group as a learner, catches up from the leader while the
queue keeps serving, and votes once it has caught up. --selector even
grows only the queues with an even number of replicas. Prints each
queue's outcome; fails if any queue was not grown.`,
		Args: cobra.ExactArgs(1),
	}
	path, verb := "/api/queues/grow", "added on"
	if shrink {
		cmd.Use = "shrink NODE"
		cmd.Short = "Remove NODE's replica from every replicated queue (as rabbitmq-queues shrink)"
		cmd.Long = `Remove NODE's replica from every replicated queue that has one (POST
/api/queues/shrink), one queue at a time. A removal that would leave a
queue without a replica, or its group without a majority of live
voters (or unable to commit the change), is refused for that queue.
Prints each queue's outcome; fails if any queue was not shrunk.`
		path, verb = "/api/queues/shrink", "removed from"
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		body := map[string]string{"node": args[0]}
		if selector != "" {
			body["selector"] = selector
		}
		var res []apiMemberResult
		raw, err := af.call(cmd.Context(), http.MethodPost, path, nil, body, nil, &res)
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		if af.json {
			return printJSON(out, raw)
		}
		failed := 0
		for _, r := range res {
			if r.Error != "" {
				failed++
				fmt.Fprintf(out, "%s: not %s %s: %s\n", r.Queue, verb, r.Node, r.Error)
			} else {
				fmt.Fprintf(out, "%s: replica %s %s\n", r.Queue, verb, r.Node)
			}
		}
		if len(res) == 0 {
			fmt.Fprintln(out, "no queue to change")
		}
		if failed > 0 {
			return fmt.Errorf("%d of %d queues were not changed", failed, len(res))
		}
		return nil
	}
	af.add(cmd)
	longTimeout(cmd, &af, 30*time.Minute)
	if !shrink {
		cmd.Flags().StringVar(&selector, "selector", "all", "all: every queue without a replica on NODE; even: those with an even number of replicas")
	}
	return cmd
}

func queueMemberCmd(remove bool) *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "add-member NAME NODE",
		Short: "Add a replica of the queue NAME on NODE (as rabbitmq-queues add_member)",
		Long: `Add a replica of the replicated queue NAME on NODE (POST
/api/queues/NAME/members): it joins the queue's Raft group as a learner,
catches up from the leader while the queue keeps serving, and becomes a
voter once caught up; the command returns then and shows the queue. On
a node whose replica is a learner (one that lost data and rejoined as
a learner), it makes that replica a voter again once it caught up; a
voting replica already there is refused.`,
		Args: cobra.ExactArgs(2),
	}
	if remove {
		cmd.Use = "delete-member NAME NODE"
		cmd.Short = "Remove the replica of the queue NAME on NODE (as rabbitmq-queues delete_member)"
		cmd.Long = `Remove the replica of the replicated queue NAME on NODE (DELETE
/api/queues/NAME/members/NODE). Refused if it is the queue's last
replica, if the group could not commit the change (fewer than a
majority of its voters live), or if it would leave fewer live voters
than a majority. Removing the leader's replica hands the leadership to
another replica first.`
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		var q apiQueue
		var raw []byte
		var err error
		if remove {
			raw, err = af.call(cmd.Context(), http.MethodDelete, "/api/queues/"+url.PathEscape(args[0])+"/members/"+url.PathEscape(args[1]), nil, nil, nil, &q)
		} else {
			raw, err = af.call(cmd.Context(), http.MethodPost, "/api/queues/"+url.PathEscape(args[0])+"/members", nil, map[string]string{"node": args[1]}, nil, &q)
		}
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		if af.json {
			return printJSON(out, raw)
		}
		if remove {
			fmt.Fprintf(out, "replica of %s on %s removed\n\n", args[0], args[1])
		} else {
			fmt.Fprintf(out, "replica of %s on %s added and caught up\n\n", args[0], args[1])
		}
		printQueue(out, q)
		return nil
	}
	af.add(cmd)
	longTimeout(cmd, &af, 5*time.Minute)
	return cmd
}
