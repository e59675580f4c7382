package descriptors

import (
	"strings"
	"testing"
	"time"

	"github.com/leapgate/leapgate/window"
)

// TestConcurrencyLimit reads concurrency_limit blocks: the Limit they
// become, the holder key, and the file, line and reason of each refusal.
func TestConcurrencyLimit(t *testing.T) {
	rule := func(block string) string {
		return "domain: d\ndescriptors:\n  - key: uploads\n" + block
	}
	for _, tc := range []struct {
		name    string
		yaml    string
		want    Limit
		holder  string
		wantErr string
	}{
		{name: "with holder", yaml: rule("    concurrency_limit:\n      max_in_flight: 10\n      lease: 5m\n      holder_key: request_id\n"),
			want: Limit{RequestsPerUnit: 10, Length: 5 * time.Minute, Unit: UnitMinute, UnitMultiplier: 5, Algorithm: window.Concurrency}, holder: "request_id"},
		{name: "without holder", yaml: rule("    concurrency_limit: {max_in_flight: 3, lease: 30s}\n"),
			want: Limit{RequestsPerUnit: 3, Length: 30 * time.Second, Unit: UnitSecond, UnitMultiplier: 30, Algorithm: window.Concurrency}},
		{name: "no max", yaml: rule("    concurrency_limit: {lease: 30s}\n"),
			wantErr: "c.yaml:4: concurrency_limit: max_in_flight is required"},
		{name: "no lease", yaml: rule("    concurrency_limit: {max_in_flight: 3}\n"),
			wantErr: "c.yaml:4: concurrency_limit: lease is required (the longest a request may hold its slot when its end is never reported)"},
		{name: "too many", yaml: rule("    concurrency_limit:\n      max_in_flight: 10001\n      lease: 1m\n"),
			wantErr: "c.yaml:5: concurrency_limit: max_in_flight 10001 is above the maximum of 10000"},
		{name: "with a rate limit", yaml: rule("    rate_limit: {unit: second, requests_per_unit: 1}\n    concurrency_limit: {max_in_flight: 3, lease: 30s}\n"),
			wantErr: "c.yaml:5: concurrency_limit cannot be combined with rate_limit or rate_limits on one descriptor (a refund would give back both)"},
		{name: "own key as holder", yaml: rule("    concurrency_limit: {max_in_flight: 3, lease: 30s, holder_key: uploads}\n"),
			wantErr: "c.yaml:4: concurrency_limit: holder_key 'uploads' is the descriptor's own key"},
		{name: "unknown field", yaml: rule("    concurrency_limit: {max_in_flight: 3, lease: 30s, leases: 2}\n"),
			wantErr: "c.yaml:4: config error, unknown key 'leases'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := parseOrWantError(t, tc.yaml, Options{}, tc.wantErr)
			if set == nil {
				return
			}
			r := set.Match("d", []Entry{{Key: "uploads", Value: "x"}})
			if r == nil || len(r.Limits) != 1 || layoutless(r.Limits)[0] != tc.want || r.HolderKey != tc.holder {
				t.Fatalf("rule %+v, want limit %+v and holder key %q", r, tc.want, tc.holder)
			}
		})
	}
}

// TestMatchHolder: a descriptor that ends with the holder entry matches the
// concurrency rule without it, and only that rule's holder key does.
func TestMatchHolder(t *testing.T) {
	set, err := Parse([]File{{Name: "c.yaml", Data: []byte(`domain: d
descriptors:
  - key: uploads
    concurrency_limit: {max_in_flight: 2, lease: 1m, holder_key: request_id}
  - key: api
    rate_limit: {unit: second, requests_per_unit: 1}
`)}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := func(kv ...string) []Entry {
		var out []Entry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tc := range []struct {
		entries []Entry
		rule    string
		depth   int
		holder  string
	}{
		{e("uploads", "x", "request_id", "r1"), "d.uploads", 1, "r1"},
		{e("uploads", "x"), "d.uploads", 1, ""},
		{e("uploads", "x", "user", "r1"), "", 2, ""},
		{e("api", "x", "request_id", "r1"), "", 2, ""},
		{e("uploads", "x", "request_id", "r1", "request_id", "r2"), "", 3, ""},
	} {
		r, depth, holder := set.MatchHolder("d", tc.entries)
		id := ""
		if r != nil {
			id = r.ID
		}
		if id != tc.rule || depth != tc.depth || holder != tc.holder {
			t.Errorf("%v: rule %q depth %d holder %q, want %q %d %q", tc.entries, id, depth, holder, tc.rule, tc.depth, tc.holder)
		}
	}
	if d := set.Dump(); !strings.Contains(d, "requests_per_unit=2 window=1m0s algorithm=concurrency") || !strings.Contains(d, "holder_key: request_id") {
		t.Errorf("the dump does not show the concurrency limit:\n%s", d)
	}
}
