package descriptors

import (
	"testing"
	"time"

	"github.com/leapgate/leapgate/window"
)

// layoutless returns a copy of limits without what the loader compiles
// (Spec, KeySuffix), for tests that compare what was read.
func layoutless(limits []Limit) []Limit {
	out := make([]Limit, len(limits))
	for i, l := range limits {
		l.Spec, l.KeySuffix = window.Spec{}, ""
		out[i] = l
	}
	return out
}

// TestCounterKeysAreStable pins the full counter key of each kind of
// limit, byte for byte: it is persisted state (Redis keys are built from
// it), so a change to it resets every counter on deploy. Change it only on
// purpose, and say so in the release notes.
func TestCounterKeysAreStable(t *testing.T) {
	set := mustParse(t, File{Name: "shop.yaml", Data: []byte(`
domain: shop
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 20}
      - {unit: second, requests_per_unit: 5, algorithm: token_bucket}
  - key: path
    value: /cart
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: time_buckets, buckets: 4}
  - key: upload
    concurrency_limit: {max_in_flight: 3, lease: 30s}
`)})
	long := string(make([]byte, LongValue+1))
	for _, tc := range []struct {
		rule    string
		entries []Entry
		limit   int
		want    string
	}{
		{"shop.user", []Entry{{"user", "alice"}}, 0, "shop.user\x00\x05alice\x00w60000000000/1"},
		{"shop.user", []Entry{{"user", "alice"}}, 1, "shop.user\x00\x05alice\x00w60000000000/1#1"},
		{"shop.user", []Entry{{"user", "alice"}}, 2, "shop.user\x00\x05alice\x00w1000000000/1/token_bucket"},
		{"shop.user", []Entry{{"user", long}}, 0, "shop.user\x00\x81\x01" +
			"\x2c\x80\x61\x9d\x7e\x7c\x58\x25\x72\x93\xcd\xa3\xa8\x78\xc1\x3e\x58\x56\xf4\xe0\x6f\x6f\x90\x60\x12\x76\xf7\xb9\x17\x9c\x9e\x07" /* SHA-256 of 129 zero bytes */ +
			"\x00w60000000000/1"},
		{"shop.path_/cart", nil, 0, "shop.path_/cart\x00\x05/cart\x00w1000000000/4/time_buckets"},
		{"shop.upload", []Entry{{"upload", "x"}}, 0, "shop.upload\x00\x01x\x00w30000000000/1/concurrency"},
	} {
		r := set.Rule(tc.rule)
		if r == nil {
			t.Fatalf("no rule %s", tc.rule)
		}
		if got := string(r.AppendCounterKey(nil, tc.entries, tc.limit)); got != tc.want {
			t.Errorf("%s limit %d: key %q, want %q", tc.rule, tc.limit, got, tc.want)
		}
	}
	for _, tc := range []struct {
		domain  string
		entries []Entry
		window  time.Duration
		want    string
	}{
		{"shop", []Entry{{"user", "bob"}}, time.Minute, "\x00override\x004:shop4:user3:bobw60000000000/1"},
		{"", nil, time.Second, "\x00override\x000:w1000000000/1"},
	} {
		spec, err := window.NewSpec(tc.window, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(AppendOverrideKey(nil, tc.domain, tc.entries, spec)); got != tc.want {
			t.Errorf("override key %q, want %q", got, tc.want)
		}
	}
}

// TestLimitLayout: the loader lays out every limit's window once, with
// the configured default bucket count for time_buckets.
func TestLimitLayout(t *testing.T) {
	rules := "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1, algorithm: time_buckets}\n      - {unit: minute, requests_per_unit: 1, algorithm: time_buckets, buckets: 6}\n      - {unit: minute, requests_per_unit: 1}\n"
	for _, tc := range []struct {
		defaultBuckets int
		want           []int // buckets per limit
	}{{0, []int{window.DefaultBuckets, 6, 1}}, {50, []int{50, 6, 1}}} {
		set, err := Parse([]File{{Name: "a.yaml", Data: []byte(rules)}}, Options{DefaultBuckets: tc.defaultBuckets})
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range set.Rule("d.k").Limits {
			if l.Spec.Buckets() != tc.want[i] || l.Spec.Length() != l.Window() {
				t.Errorf("default %d, limit %d: spec %v/%d, want %v/%d", tc.defaultBuckets, i, l.Spec.Length(), l.Spec.Buckets(), l.Window(), tc.want[i])
			}
		}
	}
	if _, err := Parse([]File{{Name: "a.yaml", Data: []byte(rules)}}, Options{DefaultBuckets: 7}); err == nil {
		t.Fatal("7 default buckets, which do not divide a second: no error")
	}
}
