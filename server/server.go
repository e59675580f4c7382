// Package server runs Leapgate's listeners around the rate-limit service: the
// gRPC listener (RateLimitService, ext_proc and access-log ingestion for the
// circuit breakers, grpc.health.v1.Health, reflection), the HTTP listener
// (/healthcheck, /json, /report, /metrics) and the loopback debug listener
// (/rlconfig, /breakers, pprof). It loads the rule directory, reloads it when
// it changes, and shuts down gracefully.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/internal/grpcservice"
	"github.com/leapgate/leapgate/observe"
	"github.com/leapgate/leapgate/rlqs"
	"github.com/leapgate/leapgate/service"
	"github.com/leapgate/leapgate/window"
)

// Server is one Leapgate process: its listeners are bound by New and served
// by Run.
type Server struct {
	settings config.Settings
	logger   *slog.Logger
	registry *prometheus.Registry
	metrics  *serverMetrics
	health   *healthState
	service  *service.Service
	breakers *breaker.Registry
	// quota is the RLQS server; nil with RLQS_ENABLED=false.
	quota   *rlqs.Server
	clock   window.Clock
	rules   *ruleLoader
	backend backend
	// streams are the guarded streaming methods by full method name.
	streams map[string]guardedMethod
	tracing tracing

	grpc   *grpc.Server
	http   *http.Server
	debug  *http.Server
	report *http.Server

	grpcLn, httpLn, debugLn, reportLn net.Listener
	// prom and promLn serve USE_PROMETHEUS's listener; nil without it.
	prom   *http.Server
	promLn net.Listener

	// stopping is closed when shutdown begins.
	stopping chan struct{}
}

// Option adjusts how New builds a Server.
type Option func(*options)

type options struct {
	wrapLimiter    func(window.Limiter) window.Limiter
	tracerProvider trace.TracerProvider
}

// WithTracerProvider traces the server's calls to tp instead of the
// exporter the OTEL_* environment asks for, for tests that read spans.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// WithLimiterWrapper makes the service use wrap(limiter) instead of the
// limiter chosen by BACKEND_TYPE, for tests that observe or delay calls.
func WithLimiterWrapper(wrap func(window.Limiter) window.Limiter) Option {
	return func(o *options) { o.wrapLimiter = wrap }
}

// New builds a Server from settings (validated again here): it creates the
// limiter, the circuit breakers and the service, loads the rules, and binds
// the four listeners (port 0 picks a free port; see GRPCAddr, HTTPAddr,
// DebugAddr, ReportAddr). Nothing is served until Run. When it fails, it
// releases everything it had built.
func New(settings config.Settings, logger *slog.Logger, opts ...Option) (_ *Server, err error) {
	if err := settings.Validate(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	// undo releases, in reverse order, what New built, if it fails.
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	s := &Server{
		settings: settings,
		logger:   logger,
		registry: prometheus.NewRegistry(),
		health: newHealthState(healthPolicy{
			needDomains:   settings.HealthyWithAtLeastOneConfigLoaded,
			needFirstLoad: settings.XDS.ConfigType == config.SourceXDS && !settings.ForceStartWithoutInitialConfig,
		}),
		stopping: make(chan struct{}),
	}
	s.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	s.metrics = newServerMetrics(s.registry)
	registerBuildInfo(s.registry, Build())

	if settings.BackendReason() != "BACKEND_TYPE" {
		logger.Warn(settings.BackendReason())
	}
	s.tracing = tracing{provider: o.tracerProvider}
	if o.tracerProvider == nil {
		t, err := tracingFromEnv(context.Background(), settings.Tracing)
		if err != nil {
			return nil, err
		}
		s.tracing = t
	}
	undo = append(undo, func() { s.tracing.stop(logger) })
	b, err := newBackend(settings, s.registry, logger, s.tracing.provider)
	if err != nil {
		return nil, err
	}
	s.backend = b
	undo = append(undo, b.close)
	limiter := b.limiter
	if o.wrapLimiter != nil {
		limiter = o.wrapLimiter(limiter)
	}
	s.clock = window.NewMonotonicClock()
	targets, err := newRuleTargets(settings, limiter, nil, b.ledger, s.clock, s.registry, logger)
	if err != nil {
		return nil, err
	}
	s.service, s.breakers, s.quota = targets.service, targets.breakers, targets.rlqs
	s.rules = newRuleLoader(settings, targets.sinks, s.health, s.metrics, logger)
	undo = append(undo, s.rules.close) // (close is safe before a watcher exists)
	if err := s.rules.loadInitial(); err != nil {
		return nil, err
	}

	if err := s.buildGRPC(); err != nil {
		return nil, err
	}
	s.http = s.newHTTPServer(s.httpHandler(), true)
	s.debug = s.newHTTPServer(s.debugHandler(), false)
	s.report = s.newHTTPServer(s.reportHandler(), true)
	if settings.UsePrometheus {
		mux := http.NewServeMux()
		mux.Handle(settings.PrometheusPath, s.metricsHandler())
		s.prom = s.newHTTPServer(mux, true)
	}

	if err := s.listen(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) buildGRPC() error {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(s.settings.MaxRequestBytes),
		grpc.ForceServerCodecV2(grpcservice.Codec()),
		grpc.MaxConcurrentStreams(uint32(s.settings.GRPCMaxConcurrentStreams)),
		grpc.ChainUnaryInterceptor(s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.streamInterceptor),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      s.settings.GRPCMaxConnectionAge,
			MaxConnectionAgeGrace: s.settings.GRPCMaxConnectionAgeGrace,
			MaxConnectionIdle:     s.settings.GRPCMaxConnectionIdle,
		}),
		grpc.ConnectionTimeout(s.settings.GRPCConnectionTimeout),
	}
	if opt := s.tracing.grpcOption(); opt != nil {
		opts = append(opts, opt)
	}
	if s.settings.GRPCServerUseTLS {
		certs, err := newCertReloader(s.settings, s.logger)
		if err != nil {
			return err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(certs.serverConfig())))
	}
	s.grpc = grpc.NewServer(opts...)
	// The gRPC services, each as its package describes it; a new one is
	// one more line here.
	services := []grpcservice.Service{
		s.service.GRPC(),
		observe.ExtProcService(observe.Options{Registry: s.breakers, Clock: s.clock, StreamIdle: s.settings.ObservationStreamIdleTimeout}),
		observe.AccessLogService(observe.Options{Registry: s.breakers, StreamIdle: s.settings.ObservationStreamIdleTimeout}),
	}
	budgets := []streamBudget{{
		name: observe.StreamBudget, what: "ext_proc and access-log", max: s.settings.MaxObservationStreams,
		perPeer: s.settings.MaxObservationStreamsPerPeer,
		trust:   peerTrust{token: s.settings.FeedToken, anyPeer: s.settings.FeedAllowAnyPeer},
		setting: "MAX_OBSERVATION_STREAMS", peerSetting: "MAX_OBSERVATION_STREAMS_PER_PEER",
		idleSetting: "OBSERVATION_STREAM_IDLE_TIMEOUT",
	}}
	if s.quota != nil {
		services = append(services, s.quota.Service())
		budgets = append(budgets, streamBudget{
			name: rlqs.StreamBudget, what: "RLQS", max: s.settings.MaxRLQSStreams,
			perPeer: s.settings.MaxRLQSStreamsPerPeer,
			trust:   peerTrust{token: s.settings.FeedToken, anyPeer: s.settings.FeedAllowAnyPeer},
			setting: "MAX_RLQS_STREAMS", peerSetting: "MAX_RLQS_STREAMS_PER_PEER",
			idleSetting: "RLQS_STREAM_IDLE_TIMEOUT",
		})
	}
	streams, err := registerServices(s.grpc, services, budgets, s.registry, s.metrics)
	if err != nil {
		return err
	}
	s.streams = streams
	healthpb.RegisterHealthServer(s.grpc, s.health.grpc)
	if s.settings.GRPCReflection {
		reflection.Register(s.grpc)
	}
	return nil
}

// newHTTPServer returns an HTTP server for h with the HTTP_* timeouts;
// writeTimeout false leaves writes unbounded (the debug listener's
// profiles run as long as asked).
func (s *Server) newHTTPServer(h http.Handler, writeTimeout bool) *http.Server {
	hs := &http.Server{
		Handler:           serving(h),
		ConnContext:       connContext,
		ConnState:         connState,
		ReadHeaderTimeout: min(s.settings.HTTPReadTimeout, 10*time.Second),
		ReadTimeout:       s.settings.HTTPReadTimeout,
		IdleTimeout:       s.settings.HTTPIdleTimeout,
		MaxHeaderBytes:    maxHTTPHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
	if writeTimeout {
		hs.WriteTimeout = s.settings.HTTPWriteTimeout
	}
	return hs
}

// maxHTTPHeaderBytes bounds an HTTP request's headers (Go's default is
// 1 MiB): no endpoint needs more than a few hundred bytes.
const maxHTTPHeaderBytes = 64 << 10

// listen binds the four listeners, closing any already bound on error.
func (s *Server) listen() error {
	var err error
	bind := func(name, addr string) net.Listener {
		if err != nil {
			return nil
		}
		var ln net.Listener
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			err = fmt.Errorf("%s listener on %s: %w", name, addr, err)
		}
		return ln
	}
	var grpcLn net.Listener
	if uds := s.settings.GRPCUDS; uds != "" {
		grpcLn, err = listenUnix(uds)
	} else {
		grpcLn = bind("gRPC", s.settings.GRPCAddr())
	}
	if grpcLn != nil {
		s.grpcLn = s.limitGRPCConns(grpcLn)
	}
	s.httpLn = s.limitConns(bind("HTTP", s.settings.HTTPAddr()), "http")
	s.debugLn = s.limitConns(bind("debug", s.settings.DebugAddr()), "debug")
	s.reportLn = s.limitConns(bind("report", s.settings.ReportAddr()), "report")
	if s.prom != nil {
		s.promLn = s.limitConns(bind("Prometheus", s.settings.PrometheusAddr), "prometheus")
	}
	if err != nil {
		for _, ln := range []net.Listener{s.grpcLn, s.httpLn, s.debugLn, s.reportLn, s.promLn} {
			if ln != nil {
				ln.Close()
			}
		}
	}
	return err
}

// listenUnix listens on the Unix domain socket path (GRPC_UDS), first
// removing a socket file a previous process left there; any other file at
// path is an error, never removed.
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("GRPC_UDS %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("GRPC_UDS: removing the stale socket %s: %w", path, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("gRPC listener on unix socket %s: %w", path, err)
	}
	return ln, nil
}

// GRPCAddr, HTTPAddr, DebugAddr and ReportAddr return the bound listener
// addresses (GRPCAddr is a *net.UnixAddr with GRPC_UDS).
func (s *Server) GRPCAddr() net.Addr   { return s.grpcLn.Addr() }
func (s *Server) HTTPAddr() net.Addr   { return s.httpLn.Addr() }
func (s *Server) DebugAddr() net.Addr  { return s.debugLn.Addr() }
func (s *Server) ReportAddr() net.Addr { return s.reportLn.Addr() }

// MetricsAddr returns the bound address of the USE_PROMETHEUS listener, nil
// without it.
func (s *Server) MetricsAddr() net.Addr {
	if s.promLn == nil {
		return nil
	}
	return s.promLn.Addr()
}

// Registry returns the registry served on /metrics.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Run serves until ctx is done, then shuts down gracefully: health turns
// NOT_SERVING at once, the listeners stop accepting, and in-flight calls get
// DRAIN_TIMEOUT to finish before connections are closed. It returns nil
// after a shutdown asked for by ctx, or the error of a listener that
// failed. Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	build := Build()
	s.logger.Info("serving", "version", build.Version, "commit", build.Commit, "go", build.GoVersion,
		"grpc", s.GRPCAddr().String(), "http", s.HTTPAddr().String(), "debug", s.DebugAddr().String(),
		"report", s.ReportAddr().String(), "report_token", s.settings.ReportToken != "",
		"feeds", peerTrust{token: s.settings.FeedToken, anyPeer: s.settings.FeedAllowAnyPeer}.describe(s.settings.GRPCClientTLSCACert != ""), "tls", s.settings.GRPCServerUseTLS, "backend", s.settings.BackendType, "rule_dir", s.settings.ConfigDir())
	if s.settings.FeedAllowAnyPeer {
		s.logger.Warn("FEED_ALLOW_ANY_PEER=true: any peer that reaches the gRPC port can open and close circuit breakers; set FEED_TOKEN or use mutual TLS unless only Envoy can reach it")
	}

	errc := make(chan error, 5)
	serve := func(name string, fn func() error) {
		err := fn()
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("%s listener: %w", name, err)
		} else {
			err = fmt.Errorf("%s listener stopped", name)
		}
		errc <- err
	}
	go serve("gRPC", func() error { return s.grpc.Serve(s.grpcLn) })
	go serve("HTTP", func() error { return s.http.Serve(s.httpLn) })
	go serve("debug", func() error { return s.debug.Serve(s.debugLn) })
	go serve("report", func() error { return s.report.Serve(s.reportLn) })
	if s.prom != nil {
		go serve("Prometheus", func() error { return s.prom.Serve(s.promLn) })
	}

	bgCtx, stopBackground := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Go(func() {
		if err := s.rules.watch(bgCtx); err != nil {
			s.logger.Error("rule reload disabled", "error", err)
		}
	})
	bg.Go(func() { s.backend.run(bgCtx) })
	if s.quota != nil {
		bg.Go(func() { s.quota.Run(bgCtx) })
	}
	if s.backend.healthy != nil {
		bg.Go(func() { s.health.watchBackend(bgCtx, s.backend.healthy, backendHealthInterval) })
	}

	var runErr error
	select {
	case <-ctx.Done():
		s.logger.Info("shutdown requested")
	case runErr = <-errc:
		s.logger.Error("listener failed; shutting down", "error", runErr)
	}
	s.shutdown()
	stopBackground()
	bg.Wait()
	s.backend.close()
	s.tracing.stop(s.logger)
	s.logger.Info("stopped")
	return runErr
}

// shutdown turns health NOT_SERVING, then drains all listeners in parallel,
// each bounded by the drain timeout.
func (s *Server) shutdown() {
	s.health.shutDown()
	close(s.stopping)
	s.logger.Info("health NOT_SERVING; draining in-flight calls", "drain_timeout", s.settings.DrainTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), s.settings.DrainTimeout)
	defer cancel()

	var wg sync.WaitGroup
	wg.Go(func() {
		done := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			s.logger.Warn("drain timeout: closing gRPC connections with calls in flight")
			s.grpc.Stop() // cancels the calls' contexts
			// A handler that ignores its context must not hold the
			// process: wait only briefly for the handlers to return.
			select {
			case <-done:
			case <-time.After(time.Second):
				s.logger.Error("gRPC handlers still running after the drain timeout; exiting anyway")
			}
		}
	})
	for _, hs := range []*http.Server{s.http, s.debug, s.report, s.prom} {
		if hs == nil {
			continue
		}
		wg.Go(func() {
			if err := hs.Shutdown(ctx); err != nil {
				hs.Close()
			}
		})
	}
	wg.Wait()
}
