package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// probeCmd checks a process's readiness from inside its own container:
// the image (distroless) has no shell, curl or wget for a healthcheck.
func probeCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "probe <url>",
		Short: "Exit 0 when a URL (a process's /readyz) answers 200: a container healthcheck",
		Long: `Ask a URL, a walcast process's /readyz on its metrics address in practice, and exit 0
when it answers 200 OK; otherwise print its answer (why the process is not ready) and exit 1.
The image has no shell or curl: compose's healthchecks run this (deploy/compose).`,
		Example: "  walcast probe http://127.0.0.1:7071/readyz",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			url := args[0]
			if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
				return usageError{fmt.Errorf("probe: %q is not an http:// or https:// URL", url)}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return usageError{err}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return runError{fmt.Errorf("probe %s: %w", url, err)}
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			if resp.StatusCode != http.StatusOK {
				return runError{errors.New(strings.TrimSpace(fmt.Sprintf("probe %s: %s\n%s", url, resp.Status, body)))}
			}
			_, err = cmd.OutOrStdout().Write(body)
			return err
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the answer")
	return cmd
}
