// Command walcast runs walcast servers and talks to them.
//
//	walcast standalone            # everything in one process, data in ./walcast-data
//	walcast coord | walcast node  # cluster mode against external etcd and NATS/Kafka
//	walcast broadcast ...         # client commands against --addr
//
// Run `walcast help` for every command.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "walcast") {
			msg = "walcast: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a mistake in the command line.
type usageError struct{ error }
