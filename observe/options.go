package observe

import (
	"log/slog"
	"time"

	"github.com/leapgate/leapgate/breaker"
	"github.com/leapgate/leapgate/window"
)

// Options are what the feeds need; each constructor reads the fields it
// uses. Registry is required.
type Options struct {
	// Registry receives the observations.
	Registry *breaker.Registry
	// Clock times ext_proc requests; if nil, the Registry's clock.
	Clock window.Clock
	// Logger receives malformed streams and entries; if nil, they are
	// discarded.
	Logger *slog.Logger
	// After returns a channel that receives once d has passed: the timer
	// that notices an ext_proc request still waiting past its breaker's
	// max_response_time; if nil, time.After. With Clock it lets the
	// timing be driven without sleeping.
	After func(d time.Duration) <-chan time.Time
}
