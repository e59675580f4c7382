package descriptors

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"
	"testing"
)

const matchRules = `
domain: web
descriptors:
  # exact, then wildcards in file order, then value-less
  - key: path
    value: /admin
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /admin*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: "*.css"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /api/*/users/*
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: path
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: user
    value: root
  # two levels; the parent carries no limit
  - key: svc
    value: "*"
    descriptors:
      - key: op
        value: "*"
        rate_limit: {unit: minute, requests_per_unit: 7}
  - key: svc
    value: api
    descriptors:
      - key: op
        value: write
        rate_limit: {unit: minute, requests_per_unit: 8}
  # a limit on the parent and on the child
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 9}
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: hour, requests_per_unit: 10}
  - key: ip
    value: "10.*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 11}
  - key: free
    rate_limit: {unlimited: true}
  - key: backend
    circuit_breaker: {strategy: error_count, threshold: 5}
`

func mustParse(t testing.TB, files ...File) *Set {
	t.Helper()
	s, err := Parse(files, Options{})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return s
}

func entries(kv ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func TestMatch(t *testing.T) {
	s := mustParse(t, File{Name: "web.yaml", Data: []byte(matchRules)})
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		want    string // rule ID, "" for no limit
	}{
		{"exact beats wildcard", "web", entries("path", "/admin"), "web.path_/admin"},
		{"trailing wildcard", "web", entries("path", "/admin/users"), "web.path_/admin*"},
		{"leading wildcard", "web", entries("path", "/x/site.css"), "web.path_*.css"},
		{"middle wildcards", "web", entries("path", "/api/v1/users/42"), "web.path_/api/*/users/*"},
		{"middle wildcards need every part", "web", entries("path", "/api/v1/groups/42"), "web.path_*"},
		{"first wildcard in file order wins", "web", entries("path", "/admin.css"), "web.path_/admin*"},
		{"star matches empty", "web", entries("path", ""), "web.path_*"},
		{"value-less key", "web", entries("user", "alice"), "web.user"},
		{"exact value without limit is a whitelist", "web", entries("user", "root"), ""},
		{"two-level wildcard", "web", entries("svc", "billing", "op", "read"), "web.svc_*.op_*"},
		{"two-level exact", "web", entries("svc", "api", "op", "write"), "web.svc_api.op_write"},
		// From the reference: no backtracking to svc=* once svc=api matched.
		{"no backtracking", "web", entries("svc", "api", "op", "read"), ""},
		{"shallower than the rule", "web", entries("svc", "api"), ""},
		{"deeper than the rule", "web", entries("user", "alice", "op", "x"), ""},
		{"limit on the parent", "web", entries("tenant", "t1"), "web.tenant"},
		{"limit on the child", "web", entries("tenant", "t1", "plan", "gold"), "web.tenant.plan_gold"},
		{"unmatched child value", "web", entries("tenant", "t1", "plan", "free"), ""},
		{"share threshold", "web", entries("ip", "10.0.0.1"), "web.ip_10.*"},
		{"unlimited is a rule", "web", entries("free", "x"), "web.free"},
		{"breaker alone is a rule", "web", entries("backend", "b1"), "web.backend"},
		{"unknown key", "web", entries("nope", "x"), ""},
		{"unknown domain", "mobile", entries("user", "alice"), ""},
		{"empty domain", "", entries("user", "alice"), ""},
		{"no entries", "web", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ""
			if r := s.Match(tt.domain, tt.entries); r != nil {
				got = r.ID
			}
			if got != tt.want {
				t.Errorf("Match(%q, %v) = %q, want %q", tt.domain, tt.entries, got, tt.want)
			}
		})
	}
}

func TestMatchNilSet(t *testing.T) {
	var s *Set
	if r := s.Match("web", entries("user", "a")); r != nil {
		t.Errorf("nil Set matched %v", r.ID)
	}
	if s.HasDomain("web") || s.Rules() != nil || s.Dump() != "" {
		t.Error("nil Set is not empty")
	}
}

func TestHasDomainAndDomains(t *testing.T) {
	s := mustParse(t,
		File{Name: "a.yaml", Data: []byte("domain: a\n")},
		File{Name: "b.yaml", Data: []byte("domain: b\ndescriptors: [{key: k}]\n")})
	for _, d := range []string{"a", "b"} {
		if !s.HasDomain(d) {
			t.Errorf("HasDomain(%q) = false", d)
		}
	}
	if s.HasDomain("c") {
		t.Error("HasDomain(c) = true")
	}
	if got := s.Domains(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("Domains() = %v", got)
	}
	if len(s.Rules()) != 0 {
		t.Errorf("Rules() = %v, want none (no limits)", s.Rules())
	}
}

func TestAppendKey(t *testing.T) {
	s := mustParse(t, File{Name: "web.yaml", Data: []byte(matchRules)})
	key := func(domain string, es []Entry) string {
		r := s.Match(domain, es)
		if r == nil {
			t.Fatalf("no rule for %v", es)
		}
		return string(r.AppendKey(nil, es))
	}
	tests := []struct {
		name      string
		a, b      []Entry
		sameCount bool
	}{
		{"value-less: distinct values count apart", entries("user", "alice"), entries("user", "bob"), false},
		{"value-less: same value shares", entries("user", "alice"), entries("user", "alice"), true},
		{"wildcard without share_threshold counts apart", entries("path", "/admin/a"), entries("path", "/admin/b"), false},
		{"share_threshold shares one counter", entries("ip", "10.0.0.1"), entries("ip", "10.9.9.9"), true},
		{"two wildcard levels count apart", entries("svc", "a", "op", "b"), entries("svc", "a", "op", "c"), false},
		{"values are not confused across levels", entries("svc", "a\x00", "op", "b"), entries("svc", "a", "op", "\x00b"), false},
		{"different rules differ", entries("path", "/admin"), entries("path", "/admin/"), false},
		{"long values count apart", entries("user", strings.Repeat("a", 5000)), entries("user", strings.Repeat("a", 4999)+"b"), false},
		{"a long value shares with itself", entries("user", strings.Repeat("a", 5000)), entries("user", strings.Repeat("a", 5000)), true},
		{"a digested value never meets a raw one", entries("user", strings.Repeat("x", LongValue+1)), entries("user", string(digestOf(strings.Repeat("x", LongValue+1)))), false},
		{"invalid UTF-8 is a value like any other", entries("user", "\xff\xfe"), entries("user", "\xff\xfd"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ka, kb := key("web", tt.a), key("web", tt.b)
			if (ka == kb) != tt.sameCount {
				t.Errorf("keys %q and %q: equal=%v, want %v", ka, kb, ka == kb, tt.sameCount)
			}
		})
	}

	r := s.Match("web", entries("user", "alice"))
	got := r.AppendKey([]byte("prefix:"), entries("user", "alice"))
	want := append([]byte("prefix:web.user\x00\x05"), "alice"...)
	if !bytes.Equal(got, want) {
		t.Errorf("AppendKey = %q, want %q", got, want)
	}
	// Fewer entries than levels must not panic.
	_ = r.AppendKey(nil, nil)

	// A long value costs a fixed 32 bytes after its length.
	long := strings.Repeat("v", 1<<20)
	if got, want := len(r.AppendKey(nil, entries("user", long))), len("web.user")+1+3+32; got != want {
		t.Errorf("key of a 1 MiB value is %d bytes, want %d", got, want)
	}
}

// digestOf is the SHA-256 of v, as AppendKey writes a long value.
func digestOf(v string) []byte {
	sum := sha256.Sum256([]byte(v))
	return sum[:]
}

func TestMetricKey(t *testing.T) {
	s := mustParse(t, File{Name: "m.yaml", Data: []byte(`
domain: m
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: client
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value_to_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: host
    value: "*.example.com"
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: svc
    value: api
    descriptors:
      - key: method
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: ip
    value: "10.*"
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: agent
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
`)})
	tests := []struct {
		entries []Entry
		want    string
	}{
		{entries("user", "alice"), "m.user"},
		{entries("client", "c1"), "m.client_c1"},
		{entries("route", "/a", "user", "alice"), "m.route_/a.user"},
		{entries("host", "www.example.com"), "m.host_www.example.com"},
		{entries("svc", "api", "method", "GET"), "m.svc_api.method_GET"},
		// share_threshold keeps the pattern even with detailed_metric or value_to_metric.
		{entries("ip", "10.1.2.3", "agent", "curl"), "m.ip_10.*.agent_curl"},
		// Request values in metrics are valid UTF-8 and short.
		{entries("client", "a\xffb"), "m.client_a\uFFFDb"},
		{entries("client", strings.Repeat("z", LongValue)), "m.client_" + strings.Repeat("z", LongValue)},
		{entries("client", strings.Repeat("z", LongValue+1)), "m.client_sha256:" + fmt.Sprintf("%x", digestOf(strings.Repeat("z", LongValue+1))[:8])},
	}
	for _, tt := range tests {
		r := s.Match("m", tt.entries)
		if r == nil {
			t.Fatalf("no rule for %v", tt.entries)
		}
		if got := r.MetricKey(tt.entries); got != tt.want {
			t.Errorf("MetricKey(%v) = %q, want %q", tt.entries, got, tt.want)
		}
	}
	// Fewer entries than the rule has levels: a level without one shows
	// the rule's own value (none, here).
	r := s.Match("m", entries("svc", "api", "method", "GET"))
	if got := r.MetricKey(entries("svc", "api")); got != "m.svc_api.method" {
		t.Errorf("MetricKey of one entry for a rule of two levels = %q, want %q", got, "m.svc_api.method")
	}
}

func TestRulesAndDump(t *testing.T) {
	s := mustParse(t, File{Name: "web.yaml", Data: []byte(matchRules)})
	rules := s.Rules()
	wantIDs := []string{
		"web.backend", "web.free", "web.ip_10.*", "web.path_*", "web.path_*.css", "web.path_/admin",
		"web.path_/admin*", "web.path_/api/*/users/*", "web.svc_*.op_*", "web.svc_api.op_write",
		"web.tenant", "web.tenant.plan_gold", "web.user",
	}
	if len(rules) != len(wantIDs) {
		var got []string
		for _, r := range rules {
			got = append(got, r.ID)
		}
		t.Fatalf("Rules() = %v, want %v", got, wantIDs)
	}
	for i, r := range rules {
		if r.ID != wantIDs[i] {
			t.Errorf("Rules()[%d] = %q, want %q", i, r.ID, wantIDs[i])
		}
		if s.Rule(r.ID) != r {
			t.Errorf("Rule(%q) does not return the rule", r.ID)
		}
	}
	// Rules returns a copy.
	rules[0] = nil
	if s.Rules()[0] == nil {
		t.Error("Rules() exposes the set's slice")
	}
	dump := s.Dump()
	for _, line := range []string{
		"web.user: unit=MINUTE requests_per_unit=6, shadow_mode: false\n",
		"web.free: unlimited, shadow_mode: false\n",
		"web.backend:, shadow_mode: false, circuit_breaker: {strategy=error_count threshold=5 min_requests=0 window=10s buckets=10 open_duration=5s half_open_probes=1 probe_timeout=5s}\n",
	} {
		if !bytes.Contains([]byte(dump), []byte(line)) {
			t.Errorf("Dump() lacks %q:\n%s", line, dump)
		}
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	s := mustParse(t, File{Name: "web.yaml", Data: []byte(matchRules)})
	es := entries("svc", "billing", "op", "read")
	if n := testing.AllocsPerRun(100, func() { s.Match("web", es) }); n != 0 {
		t.Errorf("Match allocates %v times per call", n)
	}
}

func BenchmarkMatch(b *testing.B) {
	s := mustParse(b, File{Name: "web.yaml", Data: []byte(matchRules)})
	cases := []struct {
		name    string
		entries []Entry
	}{
		{"exact", entries("path", "/admin")},
		{"wildcard", entries("path", "/api/v1/users/42")},
		{"valueless", entries("user", "alice")},
		{"two-levels", entries("svc", "api", "op", "write")},
		{"miss", entries("nope", "x")},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if s.Match("web", c.entries) == nil && c.name != "miss" {
					b.Fatal("no match")
				}
			}
		})
	}
}

func BenchmarkAppendKey(b *testing.B) {
	s := mustParse(b, File{Name: "web.yaml", Data: []byte(matchRules)})
	es := entries("svc", "billing", "op", "read")
	r := s.Match("web", es)
	buf := make([]byte, 0, 128)
	b.ReportAllocs()
	for b.Loop() {
		buf = r.AppendKey(buf[:0], es)
	}
}

// BenchmarkParse parses a generated file of 1000 descriptors (500 exact
// values, 250 wildcards, 250 two-level rules): the cost of a reload.
func BenchmarkParse(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("domain: bench\ndescriptors:\n")
	for i := 0; i < 500; i++ {
		fmt.Fprintf(&sb, "  - key: user\n    value: u%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, i+1)
	}
	for i := 0; i < 250; i++ {
		fmt.Fprintf(&sb, "  - key: path\n    value: /p%d/*\n    rate_limits:\n      - {unit: second, requests_per_unit: 10}\n      - {window: 30s, requests_per_unit: 100, buckets: 30, algorithm: time_buckets}\n", i)
	}
	for i := 0; i < 250; i++ {
		fmt.Fprintf(&sb, "  - key: svc\n    value: s%d\n    descriptors:\n      - key: op\n        rate_limit: {unit: hour, requests_per_unit: 5}\n", i)
	}
	data := []byte(sb.String())
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse([]File{{Name: "bench.yaml", Data: data}}, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMatchConcurrent reads one Set from many goroutines (run with -race).
func TestMatchConcurrent(t *testing.T) {
	s := mustParse(t, File{Name: "web.yaml", Data: []byte(matchRules)})
	es := entries("svc", "billing", "op", "read")
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for i := 0; i < 1000; i++ {
				r := s.Match("web", es)
				if r == nil || r.ID != "web.svc_*.op_*" {
					t.Errorf("Match = %v", r)
					return
				}
				buf = r.AppendKey(buf[:0], es)
				_ = r.MetricKey(es)
				_ = s.Rules()
			}
		}()
	}
	wg.Wait()
}
