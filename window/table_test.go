package window

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// The algorithm table is the one description of each algorithm: names
// round-trip through ParseAlgorithm exactly for those rule files name, key
// suffixes are distinct (they are persisted Redis state), and every
// algorithm has a constructor whose counter reports its own algorithm.
func TestAlgorithmTable(t *testing.T) {
	spec := mustSpec(t, time.Second, 1)
	suffixes := map[string]Algorithm{}
	for _, a := range Algorithms() {
		info := a.Info()
		if info.Name == "" || a.String() != info.Name {
			t.Fatalf("%d: name %q, String %q", a, info.Name, a.String())
		}
		got, ok := ParseAlgorithm(info.Name)
		if ok != info.InRules || ok && got != a {
			t.Fatalf("ParseAlgorithm(%q) = %v, %v; InRules %v", info.Name, got, ok, info.InRules)
		}
		if prev, dup := suffixes[info.KeySuffix]; dup {
			t.Fatalf("%v and %v share the key suffix %q", prev, a, info.KeySuffix)
		}
		suffixes[info.KeySuffix] = a
		if _, alg := newMeter(spec, a).layout(); alg != a {
			t.Fatalf("newMeter(%v) makes a %v counter", a, alg)
		}
		if _, ok := newMeter(spec, a).(charger); ok != info.ChargeAlways {
			t.Fatalf("%v: ChargeAlways %v, but its counter serves charges: %v", a, info.ChargeAlways, ok)
		}
		if info.MaxLimit == 0 || info.MaxLimit > MaxLimit || (info.LimitErr == nil) != (info.MaxLimit == MaxLimit) {
			t.Fatalf("%v: MaxLimit %d with LimitErr %v", a, info.MaxLimit, info.LimitErr)
		}
	}
	if n := Algorithm(len(Algorithms())); n.Valid() || n.Info().Name != "" || n.String() != "Algorithm(6)" {
		t.Fatalf("%v past the table: valid %v, info %+v", n, n.Valid(), n.Info())
	}
	if _, ok := ParseAlgorithm("concurrency"); ok {
		t.Fatal("rule files name concurrency as a concurrency_limit block, not an algorithm")
	}
	if want := []string{"sliding_window", "token_bucket", "fixed_window", "sliding_log", "time_buckets"}; !slices.Equal(RuleAlgorithmNames(), want) {
		t.Fatalf("RuleAlgorithmNames() = %v, want %v", RuleAlgorithmNames(), want)
	}
}

// CheckRequest refuses exactly what no Limiter can serve, with an error
// that names why, and ignores every field that cannot make a request an
// error; the Store's Do refuses the same.
func TestCheckRequest(t *testing.T) {
	spec := mustSpec(t, time.Second, 1)
	for _, tc := range []struct {
		name string
		req  Request
		want error // nil: served
	}{
		{"plain", Request{Spec: spec, Limit: 10, Hits: 1}, nil},
		{"huge hits, refund, holder", Request{Spec: spec, Limit: 10, Hits: 1 << 63, Negative: true, Veto: true, Holder: "x", Key: "\x00"}, nil},
		{"zero spec", Request{Limit: 10}, ErrInvalidSpec},
		{"unknown algorithm", Request{Spec: spec, Limit: 1, Algorithm: Concurrency + 1}, ErrUnknownAlgorithm},
		{"sliding log at its maximum", Request{Spec: spec, Algorithm: SlidingLog, Limit: MaxLogLimit}, nil},
		{"sliding log above", Request{Spec: spec, Algorithm: SlidingLog, Limit: MaxLogLimit + 1}, ErrLogLimit},
		{"concurrency above", Request{Spec: spec, Algorithm: Concurrency, Limit: MaxLogLimit + 1}, ErrConcurrencyLimit},
		{"sliding window above MaxLimit is clamped", Request{Spec: spec, Limit: MaxLimit + 1}, nil},
		{"charge always, sliding window", Request{Spec: spec, Limit: 1, ChargeAlways: true}, nil},
		{"charge always, fixed window", Request{Spec: spec, Limit: 1, ChargeAlways: true, Algorithm: FixedWindow}, nil},
		{"charge always, token bucket", Request{Spec: spec, Limit: 1, ChargeAlways: true, Algorithm: TokenBucket}, ErrChargeAlways},
		{"charge always, time buckets", Request{Spec: spec, Limit: 1, ChargeAlways: true, Algorithm: TimeBuckets}, ErrChargeAlways},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckRequest(&tc.req)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("CheckRequest: %v, want %v", err, tc.want)
			}
			s := NewStore(StoreOptions{})
			_, doErr := s.Do(t.Context(), []Request{tc.req})
			if (doErr == nil) != (err == nil) || err != nil && !errors.Is(doErr, tc.want) {
				t.Fatalf("Store.Do: %v, CheckRequest: %v", doErr, err)
			}
			if CheckerOf(s).CheckRequest(&tc.req) != nil != (err != nil) {
				t.Fatal("the Store's checker disagrees with CheckRequest")
			}
		})
	}
}
