package server

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/rlqs"
	"github.com/leapgate/leapgate/rlqs/quota"
	"github.com/leapgate/leapgate/service"
	"github.com/leapgate/leapgate/window"
)

// defaultRules is the example rule set served with EXAMPLE_RULES=true.
//
//go:embed defaultrules
var defaultRules embed.FS

// defaultRulesDir is the directory of defaultRules holding the rule files.
const defaultRulesDir = "defaultrules"

// ruleSink receives every rule set that loaded without error
// (*service.Service implements it).
type ruleSink interface {
	// CheckRules reports the rules the sink could not serve.
	CheckRules(set *descriptors.Set) error
	// SetRules swaps set in atomically.
	SetRules(set *descriptors.Set)
}

// ruleSinks is every consumer of rule sets, as one ruleSink: each set is
// checked by all of them, then handed to each in order.
type ruleSinks []ruleSink

// CheckRules reports everything in set that some sink could not serve: the
// one check every rule set passes before it serves, and the check of
// `ratelimit check-config`.
func (sinks ruleSinks) CheckRules(set *descriptors.Set) error {
	var errs []error
	for _, s := range sinks {
		errs = append(errs, s.CheckRules(set))
	}
	return errors.Join(errs...)
}

// SetRules hands set to every sink, in order.
func (sinks ruleSinks) SetRules(set *descriptors.Set) {
	for _, s := range sinks {
		s.SetRules(set)
	}
}

// breakerSink is the circuit-breaker registry as a ruleSink.
type breakerSink struct{ *breaker.Registry }

// SetRules swaps set in; rules with unchanged breakers keep their state.
func (b breakerSink) SetRules(set *descriptors.Set) {
	// CheckRules passed: the registry refuses nothing.
	_ = b.Registry.SetRules(set)
}

// ruleTargets are the consumers of the rules: the rate-limit service, the
// circuit-breaker registry it consults, the RLQS server (nil with
// RLQS_ENABLED=false), and the list of every sink.
type ruleTargets struct {
	service  *service.Service
	breakers *breaker.Registry
	rlqs     *rlqs.Server
	// sinks receive every rule set: the breakers first, so that the service
	// never consults a breaker rule the registry does not know yet. A new
	// consumer of rules is one more sink.
	sinks ruleSinks
}

// newRuleTargets creates the circuit-breaker registry and the rate-limit
// service that consults it, from settings: the one place that maps the
// settings to them, for the server and for CheckConfig alike. checker, when
// not nil, replaces limiter's own request checks (CheckConfig has no
// backend, only the configured backend's checks); ledger, when not nil,
// shares RLQS's division with the other replicas (the Redis backend's).
func newRuleTargets(settings config.Settings, limiter window.Limiter, checker window.RequestChecker, ledger quota.Ledger, clock window.Clock, reg *prometheus.Registry, logger *slog.Logger) (ruleTargets, error) {
	headers, err := breaker.ParseHeaderKeys(settings.BreakerHeaders)
	if err != nil {
		return ruleTargets{}, fmt.Errorf("BREAKER_HEADERS: %w", err)
	}
	breakers, err := breaker.NewRegistry(breaker.Options{
		Clock:   clock,
		Logger:  logger,
		Metrics: reg,
		Mapping: breaker.Mapping{ClusterKey: settings.BreakerClusterKey, RouteKey: settings.BreakerRouteKey, Headers: headers},
	})
	if err != nil {
		return ruleTargets{}, fmt.Errorf("creating the circuit-breaker registry: %w", err)
	}
	svc, err := service.New(service.Options{
		Limiter:         limiter,
		Checker:         checker,
		Breakers:        breakers,
		Registry:        reg,
		Logger:          logger,
		ShadowMode:      settings.ShadowMode,
		QuotaMode:       settings.QuotaMode,
		RefusalHeaders:  settings.RefusalHeaders,
		DefaultBuckets:  settings.WindowBuckets,
		NearLimitRatio:  settings.NearLimitRatio,
		ResponseHeaders: headerModes[settings.LimitResponseHeaders],
		LimitHeader:     settings.LimitLimitHeader,
		RemainingHeader: settings.LimitRemainingHeader,
		ResetHeader:     settings.LimitResetHeader,
		DynamicMetadata: settings.ResponseDynamicMetadata,
		MaxDescriptors:  settings.MaxDescriptors,
	})
	if err != nil {
		return ruleTargets{}, fmt.Errorf("creating the rate-limit service: %w", err)
	}
	targets := ruleTargets{service: svc, breakers: breakers, sinks: ruleSinks{breakerSink{breakers}, svc}}
	if settings.RLQSEnabled {
		quota, err := rlqs.New(rlqs.Options{
			Clock:               clock,
			Logger:              logger,
			Metrics:             reg,
			Tick:                settings.RLQSTick,
			AssignmentTTL:       settings.RLQSAssignmentTTL,
			BucketIdle:          settings.RLQSBucketIdle,
			MaxBucketsPerStream: settings.RLQSMaxBucketsPerStream,
			MaxBucketsPerDomain: settings.RLQSMaxBucketsPerDomain,
			ShadowMode:          settings.ShadowMode,
			StreamIdle:          settings.RLQSStreamIdleTimeout,
			Ledger:              ledger,
		})
		if err != nil {
			return ruleTargets{}, fmt.Errorf("creating the RLQS server: %w", err)
		}
		targets.rlqs = quota
		targets.sinks = append(targets.sinks, quota)
	}
	return targets, nil
}

// headerModes maps LIMIT_RESPONSE_HEADERS_ENABLED onto the service's modes.
var headerModes = map[config.HeaderMode]service.HeaderMode{
	config.HeadersOff:     service.HeadersOff,
	config.HeadersDraft03: service.HeadersDraft03,
	config.HeadersDraft11: service.HeadersDraft11,
}

// ruleOptions are the descriptors options the settings ask for.
func ruleOptions(settings config.Settings) descriptors.Options {
	return descriptors.Options{MergeDomains: settings.MergeDomainConfig, ChargeAlways: settings.DefaultCharge == config.ChargeAlways, DefaultBuckets: settings.WindowBuckets}
}

// ruleLoader loads the rule directory into a ruleSink and keeps it current.
type ruleLoader struct {
	dir      string
	opts     descriptors.Options
	debounce time.Duration
	sink     ruleSink
	health   *healthState
	metrics  *serverMetrics
	logger   *slog.Logger

	// root, when set (RUNTIME_WATCH_ROOT), is RUNTIME_ROOT: its parent is
	// watched too, so that replacing root (a symlink swap) reloads.
	root string

	// xds, when set, is the rule source instead of dir
	// (CONFIG_TYPE=GRPC_XDS_SOTW).
	xds *config.XDS

	// embedded is true when the embedded example rules serve
	// (EXAMPLE_RULES); nothing is then watched.
	embedded bool
	// loaded is true once any rule set has been put into service.
	loaded bool
	// watcher watches dir (FILE mode, not embedded); watch consumes it.
	watcher *fsnotify.Watcher
}

// newRuleLoader returns the loader of the rule source settings choose.
func newRuleLoader(settings config.Settings, sink ruleSink, health *healthState, metrics *serverMetrics, logger *slog.Logger) *ruleLoader {
	l := &ruleLoader{
		dir:      settings.ConfigDir(),
		opts:     ruleOptions(settings),
		debounce: settings.ReloadDebounce,
		sink:     sink,
		health:   health,
		metrics:  metrics,
		logger:   logger,
		embedded: settings.ExampleRules,
	}
	if settings.RuntimeWatchRoot {
		l.root = filepath.Clean(settings.RuntimeRoot)
	}
	if settings.XDS.ConfigType == config.SourceXDS {
		l.xds = &settings.XDS
	}
	return l
}

// loadInitial loads the rules once at start-up: the embedded examples
// (EXAMPLE_RULES), or the rule directory, which must exist. A bad rule set
// is logged and leaves no rules in service (every call answers Unavailable)
// until a reload succeeds; it is not fatal, so that a fixed ConfigMap heals
// the pod without a restart.
//
// The directory is watched from before this first load, so that no change
// between the load and Run is missed.
func (l *ruleLoader) loadInitial() error {
	if l.xds != nil {
		l.logger.Info("rules come from xDS; calls answer Unavailable until the first valid RateLimitConfig arrives",
			"server", l.xds.ServerURL, "node_id", l.xds.NodeID)
		return nil
	}
	if l.embedded {
		set, err := descriptors.LoadFS(defaultRules, defaultRulesDir, l.opts)
		if err == nil {
			err = l.sink.CheckRules(set)
		}
		if err != nil {
			// A broken embedded file is a build defect, caught by tests.
			panic(fmt.Sprintf("server: embedded default rules do not load: %v", err))
		}
		l.logger.Warn("EXAMPLE_RULES=true: serving the EMBEDDED EXAMPLE rules (domain \"example\"), not the rule directory",
			"rule_dir", l.dir)
		l.apply(set)
		return nil
	}
	if _, err := os.Stat(l.dir); err != nil {
		return fmt.Errorf("rule directory %s (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY): %w; "+
			"mount or create it, correct those settings, or set EXAMPLE_RULES=true to try the service with the embedded example rules", l.dir, err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching rule directory: %w", err)
	}
	if err := w.Add(l.dir); err != nil {
		w.Close()
		return fmt.Errorf("watching rule directory %s: %w", l.dir, err)
	}
	if l.root != "" {
		if err := w.Add(filepath.Dir(l.root)); err != nil {
			// The rule directory itself is still watched: only a swap of
			// RUNTIME_ROOT goes unnoticed.
			l.logger.Warn("cannot watch the parent of RUNTIME_ROOT; a swap of RUNTIME_ROOT will not reload the rules (RUNTIME_WATCH_ROOT=false silences this)",
				"runtime_root", l.root, "error", err)
			l.root = ""
		}
	}
	l.watcher = w
	l.reload()
	return nil
}

// close releases the directory watch (for a server that never ran).
func (l *ruleLoader) close() {
	if l.watcher != nil {
		l.watcher.Close()
	}
}

// reload loads the whole directory and, if every file is valid, swaps the
// rules in; otherwise it logs each error and keeps the last good rules.
func (l *ruleLoader) reload() bool {
	set, err := descriptors.Load(l.dir, l.opts)
	if err != nil {
		l.reject(err)
		return false
	}
	return l.offer(set)
}

// offer puts set into service if the service and the breakers can serve
// it, and reports whether it did.
func (l *ruleLoader) offer(set *descriptors.Set) bool {
	if err := l.sink.CheckRules(set); err != nil {
		l.reject(err)
		return false
	}
	l.apply(set)
	return true
}

// reject logs every error of a rule set that was not put into service.
func (l *ruleLoader) reject(err error) {
	l.metrics.configError.Inc()
	msg := "rule set rejected; the last good rules keep serving"
	if !l.loaded {
		msg = "rule set rejected; no rules loaded: every call answers Unavailable until the rules are fixed"
	}
	for _, e := range flatten(err) {
		l.logger.Error(msg, "source", l.source(), "error", e.Error())
	}
}

// source names where the rules come from, for logs.
func (l *ruleLoader) source() string {
	if l.xds != nil {
		return "xDS " + l.xds.ServerURL
	}
	return l.dir
}

func (l *ruleLoader) apply(set *descriptors.Set) {
	l.sink.SetRules(set)
	l.loaded = true
	l.metrics.configSuccess.Inc()
	l.health.setRules(len(set.Domains()) > 0)
	l.logger.Info("rules loaded", "source", l.source(), "embedded", l.embedded, "rules", len(set.Rules()))
}

// flatten unwraps errors.Join trees into their leaves.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// watch reloads the rules whenever the directory changes, until ctx ends.
// It watches the directory itself, which sees both plain edits and the
// Kubernetes ConfigMap update (a new hidden directory and an atomic rename
// of the ..data symlink); events are debounced so that one update makes one
// reload.
func (l *ruleLoader) watch(ctx context.Context) error {
	if l.xds != nil {
		return l.subscribe(ctx, *l.xds)
	}
	if l.watcher == nil {
		return nil // embedded rules
	}
	w := l.watcher
	defer w.Close()
	// Stopped until the first event (Go ≥ 1.23 timers deliver no stale tick).
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// rewatch ticks while the directory itself is gone (deleted or renamed
	// away), until it can be watched again.
	var rewatch <-chan time.Time
	var ticker *time.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	dir := filepath.Clean(l.dir)
	for {
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			name := filepath.Clean(ev.Name)
			if l.root != "" && filepath.Dir(name) == filepath.Dir(l.root) && name != dir {
				if name != l.root {
					continue // a neighbour of RUNTIME_ROOT
				}
				// RUNTIME_ROOT was replaced (a symlink swap): the rule
				// directory is now another one; watch it instead.
				l.logger.Info("RUNTIME_ROOT replaced; reloading", "runtime_root", l.root, "event", ev.String())
				_ = w.Remove(l.dir)
				if err := w.Add(l.dir); err != nil && rewatch == nil {
					ticker = time.NewTicker(rewatchInterval)
					rewatch = ticker.C
					continue
				}
				timer.Reset(l.debounce)
				continue
			}
			l.logger.Debug("rule directory changed", "event", ev.String())
			if name == dir && ev.Has(fsnotify.Remove|fsnotify.Rename) && rewatch == nil {
				l.logger.Warn("rule directory removed; the last good rules keep serving until it is back", "rule_dir", l.dir)
				ticker = time.NewTicker(rewatchInterval)
				rewatch = ticker.C
				continue
			}
			timer.Reset(l.debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// An overflow loses events: reload to be safe.
			l.logger.Error("watching rule directory", "rule_dir", l.dir, "error", err)
			timer.Reset(l.debounce)
		case <-rewatch:
			if err := w.Add(l.dir); err != nil {
				l.logger.Debug("rule directory not back yet", "rule_dir", l.dir, "error", err)
				continue
			}
			ticker.Stop()
			ticker, rewatch = nil, nil
			l.logger.Info("rule directory is back; reloading", "rule_dir", l.dir)
			timer.Reset(l.debounce)
		case <-timer.C:
			l.reload()
		}
	}
}

// rewatchInterval is how often a removed rule directory is looked for.
const rewatchInterval = time.Second
