// Command demo-upstream is the upstream service of Leapgate's demo: a tiny
// HTTP server whose latency and error rate can be changed while it runs, so
// that the circuit breakers in front of it can be watched opening and
// closing.
//
// It serves traffic on -listen (default :8080): every path answers 200 with
// a small JSON body after the configured latency, or the configured error
// status with probability error_rate. A request may override both with the
// query parameters latency (a Go duration, e.g. 800ms) and status (e.g. 503).
//
// It serves its admin API on -admin (default :8000):
//
//	GET    /faults                                   current settings
//	PUT    /faults?latency=800ms&error_rate=0.5&error_status=503
//	                                                 change the given settings
//	DELETE /faults                                   back to fast and healthy
//	GET    /healthz                                  200 "ok"
//
// POST works like PUT. Example:
//
//	curl -X PUT 'localhost:8000/faults?latency=800ms'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", envOr("LISTEN", ":8080"), "address of the traffic listener (env LISTEN)")
	admin := flag.String("admin", envOr("ADMIN_LISTEN", ":8000"), "address of the admin listener (env ADMIN_LISTEN)")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := run(ctx, logger, *listen, *admin); err != nil {
		logger.Error("demo-upstream stopped", "err", err)
		os.Exit(1)
	}
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

// run serves traffic and admin until ctx is cancelled.
func run(ctx context.Context, logger *slog.Logger, listenAddr, adminAddr string) error {
	up := newUpstream(rand.Float64, sleepContext)
	servers := []*http.Server{
		{Addr: listenAddr, Handler: up.trafficHandler(), ReadHeaderTimeout: 10 * time.Second},
		{Addr: adminAddr, Handler: up.adminHandler(), ReadHeaderTimeout: 10 * time.Second},
	}
	errc := make(chan error, len(servers))
	for _, s := range servers {
		logger.Info("listening", "addr", s.Addr)
		go func() {
			if err := s.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve %s: %w", s.Addr, err)
			}
		}()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(shutdownCtx)
	}
	return err
}
