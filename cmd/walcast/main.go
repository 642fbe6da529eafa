// Command walcast runs walcast servers and talks to them.
//
//	walcast standalone            # everything in one process, data in ./walcast-data
//	walcast coord | walcast node  # cluster mode against external etcd and NATS/Kafka
//	walcast broadcast ...         # client commands against --addr
//
// Run `walcast help` for every command, and see docs/cli.md for exit codes,
// the JSON output's conventions and the client configuration file.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/server"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed
	exitUsage = 2 // a mistake in the command line
	// exitStorage: a server process stopped because the storage of its
	// embedded etcd or NATS failed (a full disk, an I/O error).
	exitStorage = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if version != "dev" {
		server.SetVersion(version) // walcast_build_info reports what the build stamped
	}
	root := newRoot()
	cmd, err := root.ExecuteContextC(ctx)
	stop()
	if err != nil {
		machine := false
		if cmd != nil {
			if f := cmd.Flags().Lookup("output"); f != nil {
				machine = f.Value.String() == "json" || f.Value.String() == "yaml"
			}
			if f := cmd.Flags().Lookup("json"); f != nil && f.Value.String() == "true" {
				machine = true
			}
		}
		os.Exit(report(os.Stderr, err, machine))
	}
	os.Exit(exitOK)
}

// usageError is a mistake in the command line (exit 2).
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

// runError is a failure of a command's own work (exit 1), as opposed to an
// error cobra found in the command line.
type runError struct{ error }

func (r runError) Unwrap() error { return r.error }

// exitCode is the exit code of a command that ended with err.
func exitCode(err error) int {
	var ue usageError
	var re runError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, server.ErrStorage):
		return exitStorage
	case errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &re):
		return exitError
	}
	// What cobra itself refuses (missing required flags, ...) is usage.
	return exitUsage
}

// report prints err for a human (or as JSON on stderr, for a script that
// asked for machine output) and returns the exit code.
func report(w io.Writer, err error, machine bool) int {
	code := exitCode(err)
	kind, msg := describe(err)
	if machine {
		e := object{"kind": kind, "message": msg, "exit_code": code}
		var ce *client.Error
		if errors.As(err, &ce) && ce.Holder != "" {
			// A --no-wait refusal (R13.15): which key, and who holds it.
			e["key"], e["holder"] = ce.Key, ce.Holder
		}
		_ = emit(w, formatJSON, object{"error": e})
		return code
	}
	if !strings.HasPrefix(msg, "walcast") {
		msg = "walcast: " + msg
	}
	fmt.Fprintln(w, msg)
	return code
}

// describe names the kind of an error ("usage", "unreachable", or the
// server's status code such as "not_found") and says it for a human.
func describe(err error) (kind, msg string) {
	msg = err.Error()
	var ce *client.Error
	switch {
	case exitCode(err) == exitUsage:
		return "usage", msg
	case errors.Is(err, client.ErrUnreachable):
		return "unreachable", msg
	case errors.As(err, &ce):
		// The server's message often starts with its kind in words
		// ("invalid_argument: invalid argument: ..."): say it once.
		kind := ce.Code.String()
		return kind, strings.Replace(msg, kind+": "+strings.ReplaceAll(kind, "_", " ")+": ", kind+": ", 1)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded.String(), msg
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled.String(), msg
	}
	var ke kindError
	if errors.As(err, &ke) {
		return ke.kind, msg
	}
	return "error", msg
}

// kindError is a failure the CLI found itself (a job that failed, a missed
// benchmark target), with the kind its JSON error names.
type kindError struct {
	kind string
	error
}

func (k kindError) Unwrap() error { return k.error }
