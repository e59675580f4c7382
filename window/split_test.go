package window

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leapgate/leapgate/internal/testclock"
)

// failingLimiter fails every call.
type failingLimiter struct{}

func (failingLimiter) Do(context.Context, []Request) ([]Result, error) {
	return nil, errors.New("backend down")
}
func (failingLimiter) Undo(context.Context, []Request, []Result) error {
	return errors.New("backend down")
}

// TestSplitIsAllOrNothing: the split keeps Limiter's
// contract across its two limiters, as one limiter does.
func TestSplitIsAllOrNothing(t *testing.T) {
	second, _ := NewSpec(time.Second, 1)
	minute, _ := NewSpec(time.Minute, 1)
	fast := func(hits uint64) Request {
		return Request{Key: "fast", Spec: second, Limit: 2, Hits: hits, Veto: true}
	}
	slow := func(hits uint64) Request {
		return Request{Key: "slow", Spec: minute, Limit: 5, Hits: hits, Veto: true}
	}
	refund := Request{Key: "slow", Spec: minute, Limit: 5, Hits: 1, Negative: true}
	for _, tt := range []struct {
		name      string
		batch     []Request
		allowed   []bool
		remaining map[string]uint64 // after the batch, by key
	}{
		// The minute window holds one earlier hit: 4 left before the batch.
		{"both fit: both recorded", []Request{fast(1), slow(1)}, []bool{true, true}, map[string]uint64{"fast": 1, "slow": 3}},
		{"per-second refuses: minute not charged", []Request{fast(3), slow(1)}, []bool{false, true}, map[string]uint64{"fast": 2, "slow": 4}},
		{"minute refuses: per-second not charged", []Request{fast(1), slow(6)}, []bool{true, false}, map[string]uint64{"fast": 2, "slow": 4}},
		{"refund with a refusal elsewhere: not applied", []Request{fast(3), refund}, []bool{false, true}, map[string]uint64{"fast": 2, "slow": 4}},
		{"refund without a refusal: applied", []Request{fast(1), refund}, []bool{true, true}, map[string]uint64{"fast": 1, "slow": 5}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := testclock.At(time.Hour)
			main := NewStore(StoreOptions{Clock: clock})
			perSecond := NewStore(StoreOptions{Clock: clock})
			split := Split{Long: main, Short: perSecond, MaxShort: time.Second}
			ctx := context.Background()
			// One earlier hit on the minute window, for the refund.
			if _, err := split.Do(ctx, []Request{slow(1)}); err != nil {
				t.Fatal(err)
			}
			res, err := split.Do(ctx, tt.batch)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r.Allowed != tt.allowed[i] {
					t.Errorf("result %d allowed %t, want %t", i, r.Allowed, tt.allowed[i])
				}
			}
			check, err := split.Do(ctx, []Request{fast(0), slow(0)})
			if err != nil {
				t.Fatal(err)
			}
			if got := map[string]uint64{"fast": check[0].Remaining, "slow": check[1].Remaining}; got["fast"] != tt.remaining["fast"] || got["slow"] != tt.remaining["slow"] {
				t.Errorf("remaining %v, want %v", got, tt.remaining)
			}
		})
	}

	// A failing limiter: the other's hits are taken back, the error returned.
	main := NewStore(StoreOptions{Clock: testclock.At(time.Hour)})
	split := Split{Long: main, Short: failingLimiter{}, MaxShort: time.Second}
	if _, err := split.Do(context.Background(), []Request{fast(1), slow(1)}); err == nil {
		t.Fatal("no error with the per-second limiter down")
	}
	res, err := main.Do(context.Background(), []Request{slow(0)})
	if err != nil || res[0].Remaining != 5 {
		t.Errorf("main after a failed split: %v %v, want 5 remaining (nothing recorded)", res, err)
	}
}
