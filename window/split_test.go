package window

import (
	"context"
	"errors"
	"strings"
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
			if len(res) != len(tt.batch) {
				t.Fatalf("%d results for %d requests", len(res), len(tt.batch))
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

// recordingLimiter is a Limiter that notes the keys of each call and can
// fail its Do calls after the first ok ones.
type recordingLimiter struct {
	Limiter
	calls []string // "do k1 k2", "undo k1"
	ok    int      // Do calls that succeed before the rest fail; -1: all
}

func (r *recordingLimiter) note(op string, reqs []Request) {
	call := op
	for _, q := range reqs {
		call += " " + q.Key
	}
	r.calls = append(r.calls, call)
}

func (r *recordingLimiter) Do(ctx context.Context, reqs []Request) ([]Result, error) {
	r.note("do", reqs)
	if r.ok == 0 {
		return nil, errors.New("backend down")
	}
	r.ok--
	return r.Limiter.Do(ctx, reqs)
}

func (r *recordingLimiter) Undo(ctx context.Context, reqs []Request, res []Result) error {
	r.note("undo", reqs)
	return r.Limiter.Undo(ctx, reqs, res)
}

// TestSplitRoutes: windows up to MaxShort go to Short and longer ones to
// Long, for Do and for Undo; neither is called with nothing to do; an error
// of the limiter applying a batch's refunds is returned.
func TestSplitRoutes(t *testing.T) {
	second, _ := NewSpec(time.Second, 1)
	longer, _ := NewSpec(time.Second+time.Millisecond, 1)
	ctx := context.Background()
	newSplit := func(longOK int) (Split, *recordingLimiter, *recordingLimiter) {
		clock := testclock.At(time.Hour)
		short := &recordingLimiter{Limiter: NewStore(StoreOptions{Clock: clock}), ok: -1}
		long := &recordingLimiter{Limiter: NewStore(StoreOptions{Clock: clock}), ok: longOK}
		return Split{Short: short, Long: long, MaxShort: time.Second}, short, long
	}
	at := Request{Key: "at", Spec: second, Limit: 5, Hits: 1}
	above := Request{Key: "above", Spec: longer, Limit: 5, Hits: 1}

	split, short, long := newSplit(-1)
	res, err := split.Do(ctx, []Request{at, above})
	if err != nil {
		t.Fatal(err)
	}
	if err := split.Undo(ctx, []Request{above}, res[1:]); err != nil {
		t.Fatal(err)
	}
	if err := split.Undo(ctx, []Request{at}, res[:1]); err != nil {
		t.Fatal(err)
	}
	// Refused by Short, a vetoing batch leaves Long, which recorded
	// nothing (a check), alone.
	refused := at
	refused.Hits, refused.Veto = 10, true
	check := above
	check.Hits = 0
	if res, err := split.Do(ctx, []Request{refused, check}); err != nil || res[0].Allowed {
		t.Fatalf("a vetoed batch: %+v %v", res, err)
	}
	if got, want := strings.Join(short.calls, "; "), "do at; undo at; do at"; got != want {
		t.Errorf("Short's calls %q, want %q", got, want)
	}
	if got, want := strings.Join(long.calls, "; "), "do above; undo above; do above"; got != want {
		t.Errorf("Long's calls %q, want %q", got, want)
	}

	// A vetoing batch with a refund: its second call, the refund's, fails.
	split, _, _ = newSplit(1)
	refund := above
	refund.Negative = true
	veto := at
	veto.Veto = true
	if res, err := split.Do(ctx, []Request{veto, refund}); err == nil {
		t.Errorf("the refund's limiter failed, yet Do answered %+v", res)
	}
}
