package window_test

import (
	"testing"
	"time"

	"github.com/leapgate/leapgate/window"
	"github.com/leapgate/leapgate/window/limitertest"
)

// The in-memory Store keeps the Limiter contract.
func TestStoreConformance(t *testing.T) {
	limitertest.Run(t, func(_ *testing.T, clock *limitertest.Clock) window.Limiter {
		return window.NewStore(window.StoreOptions{Clock: clock})
	})
}

// A Split of two Stores keeps it too, its requests spread over both.
func TestSplitConformance(t *testing.T) {
	for _, maxShort := range []time.Duration{0, time.Hour} {
		limitertest.Run(t, func(_ *testing.T, clock *limitertest.Clock) window.Limiter {
			return window.Split{
				Short:    window.NewStore(window.StoreOptions{Clock: clock}),
				Long:     window.NewStore(window.StoreOptions{Clock: clock}),
				MaxShort: maxShort,
			}
		})
	}
}
