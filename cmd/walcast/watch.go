package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/client"
)

// pollEvery is how often waiting and following commands ask the server.
var pollEvery = 2 * time.Second

// describeTimeout bounds one look at why a call waits (a few RPCs): apart
// from pollEvery, so that a test polling every 50 ms still gives the look
// the time a loaded machine needs.
var describeTimeout = 2 * time.Second

// terminal reports whether w is a terminal (a progress display may redraw
// its line there; elsewhere it prints one line per change).
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// ages matches the durations of a progress line ("12s", "1m5s"), which
// change every time without saying anything new.
var ages = regexp.MustCompile(`\b\d[\dhm.]*s\b`)

// progress says on stderr, every pollEvery while a call runs, what it
// waits for (describe's answer, asked with a short deadline), when that
// changes (but for its durations) or at least every 10 s. It returns a function that stops it. It
// says nothing with machine output.
func (g *globals) progress(cmd *cobra.Command, describe func(context.Context) string) func() {
	if g.machine() {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	w := cmd.ErrOrStderr()
	wg.Go(func() {
		t := time.NewTicker(pollEvery)
		defer t.Stop()
		last, lastAt := "", time.Time{}
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), describeTimeout)
			what := describe(ctx)
			cancel()
			select {
			case <-done:
				return // the call ended meanwhile: its result says it
			default:
			}
			if what == "" {
				what = "waiting for the server's answer"
			}
			if key := ages.ReplaceAllString(what, "_"); key != last || time.Since(lastAt) >= 10*time.Second {
				fmt.Fprintf(w, "  ... %s: %s\n", time.Since(start).Round(time.Second), what)
				last, lastAt = key, time.Now()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// watch fetches a result every pollEvery and prints it whenever it
// changes, until fetch reports done, a fetch fails for good, or the command
// is interrupted (Ctrl-C: exit 0). On a terminal the display is redrawn;
// elsewhere each change is printed after a "--- <time>" line, and in a
// machine format each change is one compact JSON document per line. Each
// fetch has the command's timeout; the watch has none.
func (g *globals) watch(cmd *cobra.Command, fetch func(context.Context, *client.Client) (any, bool, error),
	human func(io.Writer, any) error, machine func(any) any) error {
	f, err := g.format()
	if err != nil {
		return err
	}
	quietStdLog()
	r, err := g.resolve(cmd)
	if err != nil {
		return err
	}
	opts, err := r.options()
	if err != nil {
		return err
	}
	c, err := client.New(r.addrs(), append(opts, client.WithUnreachable(unreachableAfter))...)
	if err != nil {
		return usageError{err}
	}
	defer c.Close()
	w := cmd.OutOrStdout()
	tty := terminal(w) && !f.machine()
	var last []byte
	for {
		ctx, cancel := context.WithTimeout(cmd.Context(), r.timeout)
		v, done, err := fetch(ctx, c)
		cancel()
		if cmd.Context().Err() != nil {
			return nil // interrupted: watching ends there
		}
		if err != nil {
			return g.connError(cmd, err)
		}
		var buf bytes.Buffer
		if f.machine() {
			b, err := json.Marshal(machine(v))
			if err != nil {
				return err
			}
			buf.Write(b)
			buf.WriteByte('\n')
		} else if err := human(&buf, v); err != nil {
			return err
		}
		if !bytes.Equal(buf.Bytes(), last) {
			switch {
			case tty:
				fmt.Fprint(w, "\x1b[H\x1b[2J")
				fmt.Fprintf(w, "every %s, %s (Ctrl-C ends)\n\n", pollEvery, time.Now().Format(time.TimeOnly))
			case !f.machine() && last != nil:
				fmt.Fprintf(w, "--- %s\n", time.Now().Format(time.TimeOnly))
			}
			if _, err := w.Write(buf.Bytes()); err != nil {
				return err
			}
			last = buf.Bytes()
		}
		if done {
			return nil
		}
		select {
		case <-cmd.Context().Done():
			return nil
		case <-time.After(pollEvery):
		}
	}
}

// bar is a progress bar of done of total, width characters wide.
func bar(done, total, width int) string {
	if total <= 0 {
		return ""
	}
	n := min(width, done*width/total)
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}
