package descriptors

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestBoundaries: every bound of the rule format holds at its edge, on the
// side that is allowed and the side that is not: a NUL as the first byte
// of a key or value, a breaker's least and greatest values, buckets: 1, the largest requests_per_unit, a zero
// window, a refused
// nesting's depth as reported, a counter key's value of exactly LongValue
// bytes (raw, not digested), and a bucket of exactly MaxDepth pairs.
func TestBoundaries(t *testing.T) {
	t.Run("NUL as the first byte", func(t *testing.T) {
		for _, d := range []string{`key: "\0user"`, `key: user` + "\n    value: \"\\0alice\""} {
			_, err := Parse([]File{{Name: "nul.yaml", Data: []byte("domain: d\ndescriptors:\n  - " + d + "\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}}, Options{})
			var e *Error
			if !errors.As(err, &e) || e.Line != 3 || !strings.Contains(e.Reason, "must not contain NUL bytes") {
				t.Errorf("%s: %v, want nul.yaml:3 refused for its NUL byte", d, err)
			}
		}
	})
	t.Run("the least buckets and the most requests", func(t *testing.T) {
		s := mustParse(t, File{Name: "edge.yaml", Data: []byte(`domain: d
descriptors:
  - key: a
    rate_limit: {window: 10s, requests_per_unit: 5, algorithm: time_buckets, buckets: 1}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 4294967295}
`)})
		if l := s.Rule("d.b").Limits[0]; l.RequestsPerUnit != 4294967295 {
			t.Errorf("d.b: %d requests, want 4294967295", l.RequestsPerUnit)
		}
	})
	t.Run("a breaker at every least or greatest allowed value", func(t *testing.T) {
		s := mustParse(t, File{Name: "b.yaml", Data: []byte(`domain: d
descriptors:
  - key: a
    circuit_breaker:
      strategy: error_count
      threshold: 1
      error_statuses: [100, 599]
      window: 10s
      buckets: 1
      half_open_probes: 1
      open_duration: 10s
      max_open_duration: 10s
`)})
		b := s.Rule("d.a").Breaker
		if b == nil || b.Threshold != 1 || !slices.Equal(b.ErrorStatuses, []int{100, 599}) || b.Spec.Buckets() != 1 || b.HalfOpenProbes != 1 || b.MaxOpenDuration != b.OpenDuration {
			t.Errorf("breaker %+v, want every edge value kept", b)
		}
	})
	t.Run("a zero window is refused", func(t *testing.T) {
		_, err := Parse([]File{{Name: "w.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {window: 0s, requests_per_unit: 1}\n")}}, Options{})
		if err == nil || !strings.Contains(err.Error(), "must be a positive duration") {
			t.Errorf("%v, want window 0s refused", err)
		}
	})
	t.Run("a refused nesting names its depth", func(t *testing.T) {
		_, err := Parse([]File{{Name: "deep.yaml", Data: []byte(chainYAML(MaxDepth + 1))}}, Options{})
		if want := fmt.Sprintf("is nested %d deep", MaxDepth+1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v, want %q", err, want)
		}
	})
	t.Run("a value of LongValue bytes is keyed raw", func(t *testing.T) {
		s := mustParse(t, File{Name: "k.yaml", Data: []byte("domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")})
		v := strings.Repeat("v", LongValue)
		if got := string(s.Rule("shop.user").AppendCounterKey(nil, []Entry{{"user", v}}, 0)); !strings.Contains(got, v) {
			t.Errorf("counter key %q does not hold the %d-byte value raw", got, LongValue)
		}
	})
	t.Run("a bucket of MaxDepth pairs matches", func(t *testing.T) {
		s := mustParse(t, File{Name: "deep.yaml", Data: []byte(chainYAML(MaxDepth))})
		bucket := map[string]string{}
		for i := range MaxDepth {
			bucket[fmt.Sprintf("k%d", i)] = "x"
		}
		if r, _ := s.MatchUnordered("deep", bucket); r == nil {
			t.Errorf("a bucket of %d pairs matched nothing, want the %d-deep rule", MaxDepth, MaxDepth)
		}
		bucket["extra"] = "x"
		if r, _ := s.MatchUnordered("deep", bucket); r != nil {
			t.Errorf("a bucket of %d pairs matched %s, want nothing", MaxDepth+1, r.ID)
		}
	})
}
