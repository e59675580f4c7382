package descriptors

import (
	"errors"
	"os"
	"path"
	"strings"
	"testing"
)

// unwrapErrors returns the *Error values joined in err.
func unwrapErrors(t *testing.T, err error) []*Error {
	t.Helper()
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else if err != nil {
		errs = []error{err}
	}
	var out []*Error
	for _, e := range errs {
		var fe *Error
		if !errors.As(e, &fe) {
			t.Fatalf("error %v is not an *Error", e)
		}
		out = append(out, fe)
	}
	return out
}

// TestErrorFixtures loads each fixture of testdata/errors (a file, or a
// directory for errors spanning files) and checks the one error it must
// produce: file, line and reason.
func TestErrorFixtures(t *testing.T) {
	tests := []struct {
		fixture string
		line    int
		reason  string
	}{
		{"ambiguous_id.yaml", 7, "descriptor id 'd.a.b' is also the id of the descriptor at ambiguous_id.yaml:3 (keys or values containing '.' or '_' make paths ambiguous)"},
		{"bad_indentation.yaml", 4, "error loading config file: yaml: line 4: mapping values are not allowed in this context"},
		{"bool_not_bool.yaml", 4, "config error, shadow_mode must be true or false, got sometimes"},
		{"breaker_bad_status.yaml", 7, "config error, error_statuses must hold HTTP statuses (100-599), got 1000"},
		{"breaker_count_fraction.yaml", 6, "circuit_breaker: threshold of strategy error_count must be a whole number of at least 1, got 2.5"},
		{"breaker_count_below_one.yaml", 6, "circuit_breaker: threshold of strategy error_count must be a whole number of at least 1, got 0.5"},
		{"breaker_percentile_without_max.yaml", 5, "circuit_breaker: max_response_time is required for strategy latency_percentile"},
		{"breaker_percentile_above_one.yaml", 6, "circuit_breaker: threshold of latency_percentile (the percentile as a fraction, e.g. 0.99) must be in (0,1], got 99"},
		{"breaker_max_open_below_open.yaml", 8, "circuit_breaker: max_open_duration 5s is shorter than open_duration 10s"},
		{"breaker_max_on_error_ratio.yaml", 7, "circuit_breaker: max_response_time applies only to strategies slow_request_ratio and latency_percentile"},
		{"breaker_missing_strategy.yaml", 5, "circuit_breaker: strategy is required (slow_request_ratio, error_ratio, error_count or latency_percentile)"},
		{"breaker_missing_threshold.yaml", 5, "circuit_breaker: threshold is required"},
		{"breaker_negative_duration.yaml", 7, "config error, open_duration must be a positive duration such as 30s or 5m, got '-5s'"},
		{"breaker_ratio_above_one.yaml", 6, "circuit_breaker: threshold of a ratio strategy must be in (0,1], got 1.5"},
		{"breaker_ratio_zero.yaml", 7, "circuit_breaker: threshold of a ratio strategy must be in (0,1], got 0"},
		{"breaker_slow_without_max.yaml", 5, "circuit_breaker: max_response_time is required for strategy slow_request_ratio"},
		{"breaker_unknown_strategy.yaml", 5, "circuit_breaker: unknown strategy 'slow' (want slow_request_ratio, error_ratio, error_count or latency_percentile)"},
		{"breaker_window_not_divisible.yaml", 8, "circuit_breaker: window length 10s is not divisible into 3 equal buckets"},
		{"breaker_zero_probes.yaml", 7, "circuit_breaker: half_open_probes must be at least 1"},
		{"buckets_zero.yaml", 7, "buckets must be at least 1, got 0"},
		{"breaker_window_not_duration.yaml", 7, "config error, window must be a positive duration such as 30s or 5m, got '0s'"}, // and no second error for the window's buckets
		{"buckets_without_time_buckets.yaml", 7, "buckets applies only to algorithm time_buckets (sliding_window, the default, keeps no time buckets)"},
		{"descriptors_not_list.yaml", 3, "config error, descriptors must be a list, got a mapping"},
		{"duplicate_domain", 2, "duplicate domain 'shop' in config file (first defined at duplicate_domain/a.yaml:1)"},
		{"duplicate_field.yaml", 5, "config error, duplicate key 'rate_limit' (first at line 4)"},
		{"duplicate_key_nested.yaml", 6, "duplicate descriptor composite key 'd.a.b' (first at line 5)"},
		{"duplicate_key_value.yaml", 6, "duplicate descriptor composite key 'd.a_b' (first at line 3)"},
		{"empty_domain.yaml", 1, "config file cannot have empty domain"},
		{"empty_key.yaml", 4, "descriptor has empty key"},
		{"list_not_map.yaml", 4, "config error, yaml file contains list of type other than map: b"},
		{"malformed.yaml", 4, "error loading config file: yaml: line 4: did not find expected ',' or '}'"},
		{"merge_key.yaml", 4, "config error, YAML merge keys (<<) are not supported"},
		{"metadata_not_map.yaml", 4, "config error, metadata must be a mapping, got a list"},
		{"missing_unit.yaml", 5, "invalid rate limit unit ''"},
		{"non_string_key.yaml", 4, "config error, key is not of type string: 0.25"},
		{"replaces_empty.yaml", 8, "should not have an empty replaces entry"},
		{"replaces_self.yaml", 10, "replaces should not contain name of same descriptor"},
		{"requests_per_unit_negative.yaml", 6, "config error, requests_per_unit must be an integer between 0 and 4294967295, got -1"},
		{"root_not_mapping.yaml", 1, "config error, a rule file must be a YAML mapping with domain and descriptors"},
		{"share_threshold_without_wildcard.yaml", 5, "share_threshold can only be used with wildcard values (containing '*'), but found key 'a_b'"},
		{"sliding_log_over_cap.yaml", 6, "rule d.api_user: requests_per_unit 10001 is above the sliding_log maximum of 10000 (it keeps one 8-byte timestamp per hit); use sliding_window for large limits"},
		{"two_documents.yaml", 2, "a rule file must hold a single YAML document"},
		{"unit_multiplier_overflow.yaml", 6, "unit_multiplier 106752 makes the window longer than 2562047h47m16.854775807s"}, // 106751 days is the longest
		{"unit_multiplier_zero.yaml", 6, "unit_multiplier must be at least 1"},
		{"unit_with_unlimited.yaml", 6, "should not specify rate limit unit when unlimited"},
		{"unknown_algorithm.yaml", 7, "config error, unknown algorithm 'leaky_bucket' (want sliding_window, token_bucket, fixed_window, sliding_log or time_buckets)"},
		{"unknown_field_breaker.yaml", 7, "config error, unknown key 'open_for'"},
		{"unknown_field_descriptor.yaml", 4, "config error, unknown key 'ratelimit'"},
		{"unknown_field_nested.yaml", 6, "config error, unknown key 'shadowmode'"},
		{"unknown_field_rate_limit.yaml", 6, "config error, unknown key 'request_per_unit'"},
		{"unknown_field_replaces.yaml", 8, "config error, unknown key 'nam'"},
		{"unknown_field_root.yaml", 2, "config error, unknown key 'descriptor'"},
		{"unknown_unit.yaml", 6, "invalid rate limit unit 'fortnight'"},
		{"unlimited_with_limits.yaml", 7, "an unlimited rate limit cannot be combined with other rate limits on one descriptor"},
		{"window_not_divisible.yaml", 8, "window length 10s is not divisible into 3 equal buckets"},
		{"window_not_divisible_default.yaml", 7, "window length 1.000000001s is not divisible into 20 equal buckets (the default bucket count, WINDOW_BUCKETS); set buckets to a divisor of the window"},
		{"window_not_duration.yaml", 6, "config error, window must be a positive duration such as 30s or 5m, got '5 minutes'"},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		seen[tt.fixture] = true
		t.Run(tt.fixture, func(t *testing.T) {
			set, err := LoadFS(os.DirFS("testdata/errors"), tt.fixture, Options{})
			if err == nil {
				t.Fatalf("loaded without error: %s", set.Dump())
			}
			if set != nil {
				t.Error("a Set was returned with the error")
			}
			errs := unwrapErrors(t, err)
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1: %v", len(errs), err)
			}
			e := errs[0]
			wantFile := tt.fixture
			if !strings.HasSuffix(tt.fixture, ".yaml") {
				wantFile = path.Join(tt.fixture, "b.yaml") // the second definition
			}
			if e.File != wantFile || e.Line != tt.line || e.Reason != tt.reason {
				t.Errorf("got  %s:%d: %s\nwant %s:%d: %s", e.File, e.Line, e.Reason, wantFile, tt.line, tt.reason)
			}
		})
	}
	// Every fixture has a case.
	ents, err := os.ReadDir("testdata/errors")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !seen[e.Name()] {
			t.Errorf("fixture %s has no test case", e.Name())
		}
	}
}
