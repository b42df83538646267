package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/spf13/cobra"

	"github.com/courier-mq/courier/internal/admin"
)

func init() { commands = append(commands, definitionsCmd) }

func definitionsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "definitions",
		Short: "Export or import a server's definitions (management API, as an administrator)",
		Long: `Export or import a server's definitions, as RabbitMQ's definitions file:
its exchanges (pattern, strategy, expressions, options), task queues,
durable subscriptions, users (password hashes, never passwords) and
permissions. Messages are not part of it.

  courier definitions export backup.json      # "-" writes to standard output
  courier definitions import backup.json      # "-" reads standard input

An import checks every entry as a declaration would before it applies
any, and leaves what the server has and the file does not alone; what is
already there as described stays as it is, so importing a file twice is
importing it once. An exchange there with another configuration is a
conflict, and nothing is applied.`,
	}
	cmd.AddCommand(definitionsExportCmd(), definitionsImportCmd())
	return cmd
}

func definitionsExportCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "export FILE",
		Short: "Write the server's definitions to FILE (- for standard output)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body, err := af.get(cmd.Context(), "/api/definitions", nil, nil)
			if err != nil {
				return err
			}
			if args[0] == "-" {
				return printJSON(cmd.OutOrStdout(), body)
			}
			f, err := os.OpenFile(args[0], os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			if err := printJSON(f, body); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			var d admin.Definitions
			if err := json.Unmarshal(body, &d); err != nil {
				return fmt.Errorf("bad answer from the management API: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d exchanges, %d queues, %d durable subscriptions, %d users written to %s\n",
				len(d.Exchanges), len(d.Queues), len(d.Subscriptions), len(d.Users), args[0])
			return nil
		},
	}
	af.add(cmd)
	return cmd
}

func definitionsImportCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "import FILE",
		Short: "Apply the definitions of FILE (- for standard input) to the server",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var in io.Reader = cmd.InOrStdin()
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			body, err := io.ReadAll(io.LimitReader(in, admin.MaxDefinitionsBytes+1))
			if err != nil {
				return err
			}
			if len(body) > admin.MaxDefinitionsBytes {
				return fmt.Errorf("%s: over %d bytes, the most a server takes", args[0], admin.MaxDefinitionsBytes)
			}
			if !json.Valid(body) {
				return fmt.Errorf("%s: not JSON", args[0])
			}
			var res admin.ImportResult
			out, err := af.call(cmd.Context(), http.MethodPost, "/api/definitions", nil, json.RawMessage(body), nil, &res)
			if err != nil {
				return err
			}
			if af.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "imported %d exchanges (%d new), %d durable subscriptions, %d users (%d new), %d permissions\n",
				res.Exchanges, res.ExchangesCreated, res.Subscriptions, res.Users, res.UsersCreated, res.Permissions)
			return nil
		},
	}
	af.add(cmd)
	return cmd
}
