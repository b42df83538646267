package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/courier-mq/courier"
)

func init() { commands = append(commands, taskCmd) }

func taskCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Submit tasks to a task exchange, and work on them",
	}
	cmd.AddCommand(taskSubmitCmd(), taskWorkCmd())
	return cmd
}

func taskSubmitCmd() *cobra.Command {
	var cf connFlags
	var key string
	var headers []string
	var priority, count int
	var delay, ttl time.Duration
	var watch, create bool
	cmd := &cobra.Command{
		Use:   "submit <exchange> [body|-]",
		Short: "Submit a task and print its id once the broker confirms it (--watch: follow it to its end)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			body, err := bodyArg(args, 1)
			if err != nil {
				return err
			}
			h, err := parseHeaders(headers)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			conn, err := cf.dial(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			ex, err := conn.Tasks(ctx, args[0], openOpts(create)...)
			if err != nil {
				return err
			}
			task := courier.Task{Key: key, Header: h, Body: body, Priority: priority, TTL: ttl}
			if delay > 0 {
				task.DueAt = time.Now().Add(delay)
			}
			out := cmd.OutOrStdout()
			if watch {
				if count != 1 {
					return usageErrorf("--watch follows one task: drop --count")
				}
				w, err := ex.SubmitWatch(ctx, task, func(ev courier.TaskEvent) {
					fmt.Fprintln(out, describeTaskEvent(ev))
				})
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "task %d submitted to %s\n", w.ID(), args[0])
				last, err := w.Wait(ctx)
				if err != nil {
					return err
				}
				if last.Kind == courier.TaskFailed {
					return fmt.Errorf("task %d failed: %s", last.ID, last.Reason)
				}
				return nil
			}
			for range count {
				sctx, cancel := cf.bound(ctx)
				id, err := ex.Submit(sctx, task)
				cancel()
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "task %d submitted to %s\n", id, args[0])
			}
			return nil
		},
	}
	cf.add(cmd)
	f := cmd.Flags()
	f.StringVar(&key, "key", "", "task key: tasks with one key are handled one at a time, in order")
	f.StringArrayVarP(&headers, "header", "H", nil, "header name=value (repeatable)")
	f.IntVar(&priority, "priority", 0, "priority from 0 to 9 (higher first)")
	f.DurationVar(&delay, "delay", 0, "deliver the task this long from now")
	f.DurationVar(&ttl, "ttl", 0, "dead-letter the task if it waits longer than this once due")
	f.IntVar(&count, "count", 1, "how many times to submit it")
	f.BoolVar(&watch, "watch", false, "print the task's progress until it completes or fails")
	f.BoolVar(&create, "create", false, "create the task exchange (durable) if it does not exist")
	return cmd
}

func describeTaskEvent(ev courier.TaskEvent) string {
	switch ev.Kind {
	case courier.TaskProgress:
		return fmt.Sprintf("task %d: %d%% %s", ev.ID, ev.Percent, ev.Text)
	case courier.TaskRetry:
		return fmt.Sprintf("task %d: attempt %d failed, retry at %s", ev.ID, ev.Attempts, ev.Due.Format(time.TimeOnly))
	case courier.TaskCompleted:
		return fmt.Sprintf("task %d: completed by %s", ev.ID, ev.Worker)
	case courier.TaskFailed:
		return fmt.Sprintf("task %d: failed (%s) after %d attempt(s)", ev.ID, ev.Reason, ev.Attempts)
	}
	return fmt.Sprintf("task %d: %s", ev.ID, ev.Kind)
}

func taskWorkCmd() *cobra.Command {
	var cf connFlags
	var prefetch, count int
	var fail, reject bool
	var connTag string
	cmd := &cobra.Command{
		Use:   "work <exchange>",
		Short: "Take tasks from a task exchange, print them and ack them (--fail: nack them)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			conn, err := cf.dial(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			ex, err := conn.Tasks(ctx, args[0], courier.Passive())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			done := make(chan struct{}, 1024)
			n := 0
			w, err := ex.Work(ctx, func(j *courier.Job) error {
				n++
				var extra []string
				if j.Key != "" {
					extra = append(extra, "key "+j.Key)
				}
				if j.Redelivered() {
					extra = append(extra, fmt.Sprintf("attempt %d", j.Attempts+1))
				}
				note := ""
				if len(extra) > 0 {
					note = " (" + strings.Join(extra, ", ") + ")"
				}
				fmt.Fprintf(out, "[#%d] task %d%s: %s\n", n, j.ID, note, j.Body)
				// Settle before counting, so that the last one is settled
				// before the connection closes.
				var err error
				switch {
				case reject:
					err = j.Nack(false)
				case fail:
					err = j.Nack(true)
				default:
					err = j.Ack()
				}
				done <- struct{}{}
				return err
			}, courier.Prefetch(prefetch), courier.ConnTag(connTag))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "working on %s as %s (prefetch %d)\n", args[0], w.ID(), prefetch)
			return await(ctx, conn, w, done, count)
		},
	}
	cf.add(cmd)
	f := cmd.Flags()
	f.IntVar(&prefetch, "prefetch", 1, "tasks held at a time")
	f.IntVar(&count, "count", 0, "exit after this many tasks (0: never)")
	f.BoolVar(&fail, "fail", false, "nack every task, to be retried")
	f.BoolVar(&reject, "reject", false, "reject every task, to be dead-lettered")
	f.StringVar(&connTag, "conn-tag", "", "worker tag: a worker that comes back with it gets its keys back")
	return cmd
}
