package server

import (
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/service"
	"github.com/leapgate/leapgate/window"
)

// CheckConfig validates the rule directory dir offline, exactly as a server
// with settings would load it (including the window layout of every limit
// under WINDOW_BUCKETS). It writes every error to w, one per line as
// "file:line: reason", or a one-line summary when the rules are valid, and
// reports whether they are.
func CheckConfig(dir string, settings config.Settings, w io.Writer) bool {
	set, err := descriptors.Load(dir)
	if err == nil {
		var svc *service.Service
		svc, err = service.New(service.Options{
			Limiter:        window.NewStore(window.StoreOptions{}),
			Registry:       prometheus.NewRegistry(),
			DefaultBuckets: settings.WindowBuckets,
			NearLimitRatio: settings.NearLimitRatio,
		})
		if err == nil {
			err = svc.CheckRules(set)
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
