package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/courier-mq/courier/internal/auth"
)

func init() { commands = append(commands, usersCmd) }

// userInfo is a user as /api/users shows it.
type userInfo struct {
	Name        string           `json:"name"`
	Tags        []string         `json:"tags"`
	Permissions auth.Permissions `json:"permissions"`
}

func usersCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "users",
		Short: "Manage users and their permissions (management API, as an administrator)",
		Long: `Manage the users of a server through its management API. These commands
authenticate as an administrator with --user and --password (or
COURIER_USER and COURIER_PASSWORD, or user:password@ in --api).

A new user's password is read from the terminal (asked twice), or from the
first line of standard input when it is not a terminal:

  echo "$BOB_PASSWORD" | courier users add bob
  courier users grant bob --write 'orders.#' --read 'orders.#' --read 'replies.*'

Permissions are lists of exchange-name patterns: '*' matches one
dot-separated word, '#' any number of words, '#' alone every exchange.
configure: declare (create) and delete exchanges, attach as a controller;
write: publish and request; read: attach as a handler or subscriber.`,
	}
	cmd.AddCommand(usersListCmd(), usersAddCmd(), usersPasswdCmd(), usersDeleteCmd(), usersGrantCmd(), usersHashCmd())
	return cmd
}

func usersListCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List users with their tags and permissions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var list []userInfo
			if printed, err := af.getOrPrint(cmd, "/api/users", &list); printed || err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTAGS\tCONFIGURE\tWRITE\tREAD")
			for _, u := range list {
				p := u.Permissions
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", u.Name, dash(strings.Join(u.Tags, ",")),
					dash(strings.Join(p.Configure, " ")), dash(strings.Join(p.Write, " ")), dash(strings.Join(p.Read, " ")))
			}
			return tw.Flush()
		},
	}
	af.add(cmd)
	return cmd
}

func usersAddCmd() *cobra.Command {
	var af apiFlags
	var tags []string
	cmd := &cobra.Command{
		Use:   "add NAME",
		Short: "Create a user; its password is read from the terminal or standard input",
		Long: `Create a user. Its password is read from the terminal, or from the first line
of standard input. A new user has no permissions: grant some with
'courier users grant'. Tags open the management API: administrator (all of
it), monitoring (read only).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := auth.CheckName(name); err != nil {
				return withCode(exitUsage, err)
			}
			pw, err := readNewPassword(cmd, name)
			if err != nil {
				return err
			}
			body := map[string]any{"password": pw, "tags": append([]string{}, tags...)}
			return af.changeUser(cmd, http.MethodPut, name, body, []string{"If-None-Match", "*"}, "user %s added\n")
		},
	}
	af.add(cmd)
	cmd.Flags().StringSliceVar(&tags, "tag", nil, "tag: administrator or monitoring (repeat or comma-separate)")
	return cmd
}

func usersPasswdCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "passwd NAME",
		Short: "Change a user's password; it is read from the terminal or standard input",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pw, err := readNewPassword(cmd, args[0])
			if err != nil {
				return err
			}
			return af.changeUser(cmd, http.MethodPut, args[0], map[string]string{"password": pw}, []string{"If-Match", "*"}, "password of %s changed\n")
		},
	}
	af.add(cmd)
	return cmd
}

func usersDeleteCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a user (its open connections lose every permission at once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return af.changeUser(cmd, http.MethodDelete, args[0], nil, nil, "user %s deleted\n")
		},
	}
	af.add(cmd)
	return cmd
}

// changeUser sends method to /api/users/{name} and says done (a format
// taking the name) when it succeeds.
func (a *apiFlags) changeUser(cmd *cobra.Command, method, name string, body any, hdr []string, done string) error {
	if _, err := a.call(cmd.Context(), method, "/api/users/"+url.PathEscape(name), nil, body, hdr, nil); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), done, name)
	return nil
}

func usersGrantCmd() *cobra.Command {
	var af apiFlags
	var configure, write, read []string
	var none bool
	cmd := &cobra.Command{
		Use:   "grant NAME",
		Short: "Set a user's permissions on exchange-name patterns",
		Long: `Set a user's permissions. Each of --configure, --write and --read given
replaces that permission's patterns (repeat the flag for several; give it
as "" for none); those not given stay as they are. --none takes every
permission away. Connections open as the user see the change on their
next operation; attachments it no longer allows are detached.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "/api/permissions/" + url.PathEscape(args[0])
			f := cmd.Flags()
			if none {
				if f.Changed("configure") || f.Changed("write") || f.Changed("read") {
					return usageErrorf("--none takes no --configure, --write or --read")
				}
				if _, err := af.call(cmd.Context(), http.MethodDelete, path, nil, nil, nil, nil); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s has no permissions\n", args[0])
				return nil
			}
			if !f.Changed("configure") && !f.Changed("write") && !f.Changed("read") {
				return usageErrorf("give --configure, --write or --read (or --none)")
			}
			var p auth.Permissions
			if _, err := af.get(cmd.Context(), path, nil, &p); err != nil {
				return err
			}
			for _, x := range []struct {
				flag string
				val  []string
				dst  *auth.Patterns
			}{{"configure", configure, &p.Configure}, {"write", write, &p.Write}, {"read", read, &p.Read}} {
				if f.Changed(x.flag) {
					*x.dst = nonEmpty(x.val)
				}
			}
			if _, err := af.call(cmd.Context(), http.MethodPut, path, nil, p, nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s may configure %s, write %s, read %s\n", args[0],
				patternsText(p.Configure), patternsText(p.Write), patternsText(p.Read))
			return nil
		},
	}
	af.add(cmd)
	cmd.Flags().StringArrayVar(&configure, "configure", nil, "patterns of exchanges it may declare and delete")
	cmd.Flags().StringArrayVar(&write, "write", nil, "patterns of exchanges it may publish and send requests to")
	cmd.Flags().StringArrayVar(&read, "read", nil, "patterns of exchanges it may subscribe to and handle")
	cmd.Flags().BoolVar(&none, "none", false, "take every permission away")
	return cmd
}

func nonEmpty(list []string) auth.Patterns {
	out := auth.Patterns{}
	for _, p := range list {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func patternsText(p auth.Patterns) string {
	if len(p) == 0 {
		return "nothing"
	}
	return strings.Join(p, " ")
}

func usersHashCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "hash-password",
		Short: "Print the argon2id hash of a password read from the terminal or standard input, for users.json",
		Long: `Print the argon2id hash of a password, in the form the "password_hash" field
of users.json holds: for an operator who edits that file and reloads the
server with SIGHUP. It needs no server.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pw, err := readNewPassword(cmd, "the user")
			if err != nil {
				return err
			}
			h, err := auth.HashPassword(pw)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), h)
			return nil
		},
	}
}

// readNewPassword reads a password: from the terminal, without echo and
// twice, or else the first line of standard input.
func readNewPassword(cmd *cobra.Command, who string) (string, error) {
	in := cmd.InOrStdin()
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		errw := cmd.ErrOrStderr()
		fmt.Fprintf(errw, "New password for %s: ", who)
		a, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(errw)
		if err != nil {
			return "", err
		}
		fmt.Fprint(errw, "Again: ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(errw)
		if err != nil {
			return "", err
		}
		if string(a) != string(b) {
			return "", errors.New("the passwords differ")
		}
		return checkNewPassword(string(a))
	}
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read the password from standard input: %w", err)
	}
	return checkNewPassword(strings.TrimRight(line, "\r\n"))
}

func checkNewPassword(pw string) (string, error) {
	if pw == "" {
		return "", usageErrorf("no password: type one, or give it on the first line of standard input")
	}
	return pw, nil
}
