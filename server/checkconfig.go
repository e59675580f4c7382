package server

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/window"
)

// CheckConfig validates the rule directory dir offline, exactly as a server
// with settings would load it: the same loader options (MERGE_DOMAIN_CONFIG)
// and the same check (the CheckRules of every rule sink, built from
// settings, so WINDOW_BUCKETS, RESPONSE_DYNAMIC_METADATA
// and every other setting that can refuse a rule apply), with the request
// checks of the backend BACKEND_TYPE selects (backendChecker), without
// connecting to it. It writes every
// error to w, one per line as "file:line: reason", or a one-line summary
// when the rules are valid, and reports whether they are.
func CheckConfig(dir string, settings config.Settings, w io.Writer) bool {
	set, err := descriptors.Load(dir, ruleOptions(settings))
	if err == nil {
		var targets ruleTargets
		targets, err = newRuleTargets(settings, window.NewStore(window.StoreOptions{}), backendChecker(settings.BackendType), nil, window.NewMonotonicClock(),
			prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
		if err == nil {
			err = targets.sinks.CheckRules(set)
		}
	}
	if err != nil {
		errs := flatten(err)
		for _, e := range errs {
			fmt.Fprintln(w, e)
		}
		fmt.Fprintf(w, "%s: %d error(s)\n", dir, len(errs))
		return false
	}
	fmt.Fprintf(w, "%s: OK, %d rules in %d domains\n", dir, len(set.Rules()), len(set.Domains()))
	return true
}
