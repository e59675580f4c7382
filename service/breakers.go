package service

import (
	"time"

	"github.com/leapgate/leapgate/descriptors"
)

// Breakers reports whether circuit breakers let a request through. It is
// implemented by package breaker; a nil Breakers in Options means none. The
// entries let a value-less breaker rule keep one breaker per distinct value.
type Breakers interface {
	// AllowProbe reports whether the breaker of rule, for the request's
	// entries (which matched rule), admits a request now and, if not, how
	// long until it may; for a request a half-open breaker admits as its
	// probe, probe is the probe's id (0 otherwise), which an admitted
	// request carries to the upstream in envoyhdr.ProbeHeader.
	AllowProbe(rule *descriptors.Rule, entries []descriptors.Entry) (ok bool, probe uint64, retryAfter time.Duration)
}
