package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/ops"
)

// newHealthCmd asks a running relay's /readyz (or another of its health
// endpoints) over HTTP: a probe for containers whose image has no HTTP
// client (the distroless image, docker-compose.yml's healthchecks). It reads
// no configuration, as version.
func newHealthCmd() *cobra.Command {
	var (
		target  string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "health",
		Short: "Ask a running relay's /readyz (or --url) and exit 0 when it answers 200",
		Long: `health asks a running relay's health endpoint over HTTP, as a container
healthcheck does: exit 0 when it answers 200 (a standby that could lead answers
200 too), 1 when it answers anything else (the answer is printed: /readyz names the
failing check) or cannot be reached. It reads no configuration: --url names the
endpoint, http://127.0.0.1:9187/readyz by default (metrics.listen's default);
/healthz says whether the process is alive.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			u, err := url.Parse(target)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usageErrorf("--url %q: want http://host:port/readyz (or /healthz)", target)
			}
			if timeout <= 0 {
				return usageErrorf("--timeout %s: want a positive duration such as 5s", timeout)
			}
			return probe(cmd.Context(), cmd.OutOrStdout(), target, timeout)
		},
	}
	cmd.Flags().StringVar(&target, "url", "http://127.0.0.1:9187/readyz", "the relay's health endpoint")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the answer")
	return cmd
}

// probe GETs target and returns nil on 200, printing the answer either way.
func probe(ctx context.Context, w io.Writer, target string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w: is the relay running, with metrics.listen at that address?", target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	text := ops.PrintableText(strings.TrimSpace(string(body)))
	fmt.Fprintf(w, "%s: %s %s\n", target, resp.Status, text)
	if resp.StatusCode != http.StatusOK {
		return errReported
	}
	return nil
}
