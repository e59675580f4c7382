package server

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/service"
)

// defaultRules is the example rule set served when the rule directory does
// not exist.
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

// ruleTargets hands each rule set to the rate-limit service and the
// circuit-breaker registry. The service checks it (the registry takes every
// set the loader built).
type ruleTargets struct {
	service  *service.Service
	breakers *breaker.Registry
}

// CheckRules reports what the service could not serve.
func (t ruleTargets) CheckRules(set *descriptors.Set) error {
	return t.service.CheckRules(set)
}

// SetRules swaps set in: breakers first, so that the service never
// consults a breaker rule the registry does not know yet. Rules with
// unchanged breakers keep their state.
func (t ruleTargets) SetRules(set *descriptors.Set) {
	// Sets come from the loader, whose rule IDs are unique: nothing to skip.
	_ = t.breakers.SetRules(set)
	t.service.SetRules(set)
}

// ruleLoader loads the rule directory into a ruleSink and keeps it current.
type ruleLoader struct {
	dir      string
	debounce time.Duration
	sink     ruleSink
	health   *healthState
	metrics  *serverMetrics
	logger   *slog.Logger

	// xds, when set, is the rule source instead of dir
	// (CONFIG_TYPE=GRPC_XDS_SOTW).
	xds *config.XDS

	// embedded is true when dir did not exist at start-up and the embedded
	// example rules are serving; nothing is then watched.
	embedded bool
	// loaded is true once any rule set has been put into service.
	loaded bool
	// watcher watches dir (FILE mode, not embedded); watch consumes it.
	watcher *fsnotify.Watcher
}

// loadInitial loads the rules once at start-up. A missing directory selects
// the embedded examples. A bad rule set is logged and leaves the server
// NOT_SERVING (every call answers Unavailable) until a reload succeeds; it
// is not fatal, so that a fixed ConfigMap heals the pod without a restart.
//
// The directory is watched from before this first load, so that no change
// between the load and Run is missed.
func (l *ruleLoader) loadInitial() error {
	if l.xds != nil {
		l.logger.Info("rules come from xDS; NOT_SERVING until the first valid RateLimitConfig arrives",
			"server", l.xds.ServerURL, "node_id", l.xds.NodeID)
		return nil
	}
	if _, err := os.Stat(l.dir); errors.Is(err, fs.ErrNotExist) {
		set, err := descriptors.LoadFS(defaultRules, defaultRulesDir)
		if err == nil {
			err = l.sink.CheckRules(set)
		}
		if err != nil {
			// A broken embedded file is a build defect, caught by tests.
			panic(fmt.Sprintf("server: embedded default rules do not load: %v", err))
		}
		l.embedded = true
		l.logger.Warn("rule directory does not exist; serving the EMBEDDED EXAMPLE rules (domain \"example\"). "+
			"Create the directory or set RUNTIME_ROOT, RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY to serve your own.",
			"rule_dir", l.dir)
		l.apply(set)
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching rule directory: %w", err)
	}
	if err := w.Add(l.dir); err != nil {
		w.Close()
		return fmt.Errorf("watching rule directory %s: %w", l.dir, err)
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
	set, err := descriptors.Load(l.dir)
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
		msg = "rule set rejected; no rules loaded: NOT_SERVING, every call answers Unavailable until the rules are fixed"
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
	l.health.set(true)
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
			l.logger.Debug("rule directory changed", "event", ev.String())
			if filepath.Clean(ev.Name) == dir && ev.Has(fsnotify.Remove|fsnotify.Rename) && rewatch == nil {
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
