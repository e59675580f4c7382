package descriptors

import (
	"strings"
	"testing"

	"github.com/leapgate/leapgate/window"
)

// TestCharge reads rate_limit's charge field and the Options default: which
// limits charge always, and the file, line and reason of each refusal.
func TestCharge(t *testing.T) {
	rule := func(fields string) string {
		return "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n" + fields
	}
	for _, tc := range []struct {
		name    string
		yaml    string
		opts    Options
		want    bool   // Limit.ChargeAlways
		wantErr string // the one error, "c.yaml:N: reason"
	}{
		{name: "default", yaml: rule(""), want: false},
		{name: "always", yaml: rule("      charge: always\n"), want: true},
		{name: "when_allowed", yaml: rule("      charge: when_allowed\n"), want: false},
		{name: "fixed window", yaml: rule("      algorithm: fixed_window\n      charge: always\n"), want: true},
		{name: "default always", yaml: rule(""), opts: Options{ChargeAlways: true}, want: true},
		{name: "default always, rule opts out", yaml: rule("      charge: when_allowed\n"), opts: Options{ChargeAlways: true}, want: false},
		{name: "default always skips token bucket", yaml: rule("      algorithm: token_bucket\n"), opts: Options{ChargeAlways: true}, want: false},
		{name: "token bucket", yaml: rule("      algorithm: token_bucket\n      charge: always\n"),
			wantErr: "c.yaml:8: charge always applies only to algorithms sliding_window and fixed_window (token_bucket cannot count beyond its limit)"},
		{name: "sliding log", yaml: rule("      charge: always\n      algorithm: sliding_log\n"),
			wantErr: "c.yaml:7: charge always applies only to algorithms sliding_window and fixed_window (sliding_log cannot count beyond its limit)"},
		{name: "unknown", yaml: rule("      charge: sometimes\n"), wantErr: "c.yaml:7: unknown charge 'sometimes' (want when_allowed or always)"},
		{name: "unlimited", yaml: "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      charge: always\n",
			wantErr: "c.yaml:6: should not specify charge when unlimited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := parseOrWantError(t, tc.yaml, tc.opts, tc.wantErr)
			if set == nil {
				return
			}
			r := set.Match("d", []Entry{{Key: "k", Value: "v"}})
			if r == nil || len(r.Limits) != 1 {
				t.Fatalf("rule %+v", r)
			}
			if got := r.Limits[0].ChargeAlways; got != tc.want {
				t.Fatalf("ChargeAlways %v, want %v", got, tc.want)
			}
			if r.Limits[0].ChargeAlways && !window.ChargeAlwaysSupported(r.Limits[0].Algorithm) {
				t.Fatalf("ChargeAlways on %v", r.Limits[0].Algorithm)
			}
			if shown := strings.Contains(set.Dump(), " charge=always"); shown != tc.want {
				t.Fatalf("the dump shows charge=always: %v, want %v:\n%s", shown, tc.want, set.Dump())
			}
		})
	}
}

// parseOrWantError parses one rule file, c.yaml. With wantErr set it
// checks that the file is refused with exactly that one error and returns
// nil; otherwise it returns the Set.
func parseOrWantError(t *testing.T, yaml string, opts Options, wantErr string) *Set {
	t.Helper()
	set, err := Parse([]File{{Name: "c.yaml", Data: []byte(yaml)}}, opts)
	if wantErr != "" {
		if errs := unwrapErrors(t, err); len(errs) != 1 || errs[0].Error() != wantErr {
			t.Fatalf("errors %v, want one: %s", err, wantErr)
		}
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return set
}
