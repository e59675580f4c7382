// Command healthprobe is the container health check of Leapgate's images,
// which have no shell and no curl: it GETs one URL and exits 0 when the
// answer is 2xx, 1 otherwise.
//
//	healthprobe [-timeout 2s] http://127.0.0.1:8080/healthcheck
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	timeout := flag.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: healthprobe [-timeout 2s] URL")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := probe(ctx, http.DefaultClient, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "healthprobe:", err)
		os.Exit(1)
	}
}

// probe GETs url and returns nil when the status is 2xx.
func probe(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("probe %s: status %s", url, resp.Status)
	}
	return nil
}
