package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/wire"
)

// Exit codes of the courier command. They are part of its interface:
// scripts branch on them, so they never change meaning.
const (
	exitOK       = 0 // success
	exitFailure  = 1 // the operation failed (the server refused it, a request failed, ...)
	exitUsage    = 2 // bad command, flag, argument, URL or configuration
	exitConnect  = 3 // no connection to the server, or the connection was lost
	exitNotFound = 4 // the exchange, queue or user does not exist
	exitRefused  = 5 // authentication failed, or a permission refused the operation
)

// exitCodesHelp documents the exit codes in `courier --help`.
const exitCodesHelp = `Exit codes:
  0  success
  1  the operation failed: the server refused it (clash, bad options, no
     handler, ...), a request or task failed, the server exited on a failure
  2  usage: unknown command or flag, bad argument, URL or configuration
  3  connection: the server cannot be reached (refused, unreachable, timeout,
     wrong port, TLS), or the connection was lost (server shut down)
  4  not found: the exchange, queue or user does not exist
  5  refused: bad credentials, or no permission for the operation`

// exitError gives an error its exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// withCode returns err with an exit code, nil for nil.
func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

// usageErrorf returns a usage error (exit 2).
func usageErrorf(format string, args ...any) error {
	return withCode(exitUsage, fmt.Errorf(format, args...))
}

// exitCode maps an error to the exit code the command ends with.
func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if errors.Is(err, courier.ErrConnectionLost) {
		return exitConnect
	}
	var we *wire.Error
	if errors.As(err, &we) {
		switch we.Code {
		case wire.CodeNotFound:
			return exitNotFound
		case wire.CodeUnauthorized:
			return exitRefused
		case wire.CodeShutdown, wire.CodeHeartbeat:
			return exitConnect
		}
		return exitFailure
	}
	var ne net.Error
	if errors.Is(err, courier.ErrClosed) || errors.As(err, &ne) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
		return exitConnect
	}
	return exitFailure
}

// connectError classifies an error from connecting: refused
// credentials exit 5, a bad URL 2, anything else 3.
func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return err
	case errors.Is(err, courier.ErrUnauthorized):
		return withCode(exitRefused, err)
	}
	return withCode(exitConnect, err)
}

// markUsage makes the argument and flag errors of cmd and its
// subcommands usage errors (exit 2).
func markUsage(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withCode(exitUsage, err) })
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if args := c.Args; args != nil {
			c.Args = func(c *cobra.Command, a []string) error { return withCode(exitUsage, args(c, a)) }
		} else if c.HasSubCommands() && !c.Runnable() {
			// A group such as `courier task`: help alone, an unknown
			// subcommand is a usage error.
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(c *cobra.Command, a []string) error {
				if len(a) > 0 {
					return usageErrorf("unknown command %q for %q; see %s --help", a[0], c.CommandPath(), c.CommandPath())
				}
				return c.Help()
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd)
}

// exit prints err, if any, and ends the process with its exit code.
func exit(err error) {
	if err == nil {
		os.Exit(exitOK)
	}
	fmt.Fprintln(os.Stderr, "error:", err)
	os.Exit(exitCode(err))
}
