package descriptors

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

// chainYAML is a rule file whose one descriptor is nested depth deep, the
// innermost limited.
func chainYAML(depth int) string {
	var sb strings.Builder
	sb.WriteString("domain: deep\ndescriptors:\n")
	for i := range depth {
		indent := strings.Repeat("    ", i)
		fmt.Fprintf(&sb, "%s  - key: k%d\n", indent, i)
		if i == depth-1 {
			fmt.Fprintf(&sb, "%s    rate_limit: {unit: second, requests_per_unit: 1}\n", indent)
		} else {
			fmt.Fprintf(&sb, "%s    descriptors:\n", indent)
		}
	}
	return sb.String()
}

// chainProto is chainYAML as an xDS resource.
func chainProto(depth int) *rlsconfv3.RateLimitConfig {
	leaf := &rlsconfv3.RateLimitDescriptor{Key: fmt.Sprintf("k%d", depth-1),
		RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}}
	for i := depth - 2; i >= 0; i-- {
		leaf = &rlsconfv3.RateLimitDescriptor{Key: fmt.Sprintf("k%d", i), Descriptors: []*rlsconfv3.RateLimitDescriptor{leaf}}
	}
	return &rlsconfv3.RateLimitConfig{Name: "deep", Domain: "deep", Descriptors: []*rlsconfv3.RateLimitDescriptor{leaf}}
}

// TestDepthCap: a descriptor nested MaxDepth deep loads; one level more is
// refused with the file and line of the descriptor too deep (over xDS, the
// resource), in a file or an xDS resource, however deep the rest goes.
func TestDepthCap(t *testing.T) {
	if _, err := Parse([]File{{Name: "deep.yaml", Data: []byte(chainYAML(MaxDepth))}}, Options{}); err != nil {
		t.Fatalf("%d deep: %v", MaxDepth, err)
	}
	if _, err := FromProto([]*rlsconfv3.RateLimitConfig{chainProto(MaxDepth)}, Options{}); err != nil {
		t.Fatalf("%d deep over xDS: %v", MaxDepth, err)
	}
	for _, depth := range []int{MaxDepth + 1, 4000} {
		// (A file 5,000 deep would be 10,000 YAML levels, the YAML
		// parser's own bound, which would refuse it first.)
		_, err := Parse([]File{{Name: "deep.yaml", Data: []byte(chainYAML(depth))}}, Options{})
		var e *Error
		if depth == MaxDepth+1 && (!errors.As(err, &e) || e.File != "deep.yaml" || e.Line != 3+2*MaxDepth || !strings.Contains(e.Reason, fmt.Sprintf("deeper than the %d levels", MaxDepth))) {
			t.Errorf("%d deep: %v, want deep.yaml:%d refused as too deep", depth, err, 3+2*MaxDepth)
		}
		if err == nil || !strings.Contains(err.Error(), "deep.yaml") || !strings.Contains(err.Error(), "depth") && !strings.Contains(err.Error(), "deep,") {
			t.Errorf("%d deep: %v, want deep.yaml refused as too deep", depth, err)
		}
		_, err = FromProto([]*rlsconfv3.RateLimitConfig{chainProto(depth)}, Options{})
		if !errors.As(err, &e) || e.File != "xds:deep" || !strings.Contains(e.Reason, "deeper than") {
			t.Errorf("%d deep over xDS: %v, want the resource refused as too deep", depth, err)
		}
	}
}

// TestDescriptorsPerDomainCap: a domain of MaxDescriptorsPerDomain
// descriptors loads; one more, over several xDS resources of the domain
// (merged), is refused naming the domain.
func TestDescriptorsPerDomainCap(t *testing.T) {
	resources := func(n int) []*rlsconfv3.RateLimitConfig {
		var cfgs []*rlsconfv3.RateLimitConfig
		for r := 0; n > 0; r++ {
			cfg := &rlsconfv3.RateLimitConfig{Name: fmt.Sprintf("r%d", r), Domain: "big"}
			for i := range min(n, 25_000) {
				cfg.Descriptors = append(cfg.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: "user", Value: fmt.Sprintf("r%du%d", r, i),
					RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 10}})
			}
			n -= len(cfg.Descriptors)
			cfgs = append(cfgs, cfg)
		}
		return cfgs
	}
	if _, err := FromProto(resources(MaxDescriptorsPerDomain), Options{MergeDomains: true}); err != nil {
		t.Fatalf("%d descriptors: %v", MaxDescriptorsPerDomain, err)
	}
	_, err := FromProto(resources(MaxDescriptorsPerDomain+1), Options{MergeDomains: true})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("domain 'big' has more than the %d descriptors allowed", MaxDescriptorsPerDomain)) {
		t.Fatalf("%d descriptors: %v, want the domain refused", MaxDescriptorsPerDomain+1, err)
	}
}

// TestFileBounds: a file of maxNodes descriptors, which is also
// MaxDescriptorsPerDomain, loads; one more is refused by the reader's bound
// on list items, before any is built.
func TestFileBounds(t *testing.T) {
	file := func(n int) []File {
		var sb strings.Builder
		sb.WriteString("domain: d\ndescriptors:\n")
		for i := range n - 1 {
			fmt.Fprintf(&sb, "- {key: k, value: v%d}\n", i)
		}
		sb.WriteString("- {key: k, value: last, rate_limit: {unit: second, requests_per_unit: 1}}\n")
		return []File{{Name: "big.yaml", Data: []byte(sb.String())}}
	}
	if maxNodes != MaxDescriptorsPerDomain {
		t.Fatalf("maxNodes %d, MaxDescriptorsPerDomain %d: the test assumes them equal", maxNodes, MaxDescriptorsPerDomain)
	}
	s, err := Parse(file(maxNodes), Options{})
	if err != nil {
		t.Fatalf("%d descriptors: %v", maxNodes, err)
	}
	if s.Rule("d.k_last") == nil {
		t.Errorf("%d descriptors: the last one was dropped", maxNodes)
	}
	_, err = Parse(file(maxNodes+1), Options{})
	var e *Error
	if !errors.As(err, &e) || e.File != "big.yaml" || e.Line != 3+maxNodes || e.Reason != fmt.Sprintf("config error, more than %d descriptors and list items (YAML aliases?)", maxNodes) {
		t.Errorf("%d descriptors: %v, want big.yaml:%d refused as too large", maxNodes+1, err, 3+maxNodes)
	}
}

// manyYAML is a rule file of n descriptors: n/2 exact values with a limit,
// n/4 wildcard values with two limits, n/4 in n/8 two-level rules.
func manyYAML(n int) []byte {
	var sb strings.Builder
	sb.WriteString("domain: bench\ndescriptors:\n")
	for i := range n / 2 {
		fmt.Fprintf(&sb, "  - key: user\n    value: u%d\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", i, i+1)
	}
	for i := range n / 4 {
		fmt.Fprintf(&sb, "  - key: path\n    value: /p%d/*\n    rate_limits:\n      - {unit: second, requests_per_unit: 10}\n      - {window: 30s, requests_per_unit: 100, buckets: 30, algorithm: time_buckets}\n", i)
	}
	for i := range n / 8 {
		fmt.Fprintf(&sb, "  - key: svc\n    value: s%d\n    descriptors:\n      - key: op\n        rate_limit: {unit: hour, requests_per_unit: 5}\n", i)
	}
	return []byte(sb.String())
}

// BenchmarkLoad10000Descriptors is the cost of loading (or reloading) a
// domain of 10,000 descriptors, from a rule file and over xDS: time and
// bytes allocated per load, and the heap the loaded Set keeps
// (retained-B/descriptor), which the depth cap keeps linear in the rules'
// size.
func BenchmarkLoad10000Descriptors(b *testing.B) {
	const n = 10_000
	data := manyYAML(n)
	var cfg rlsconfv3.RateLimitConfig
	cfg.Name, cfg.Domain = "bench", "bench"
	for i := range n {
		cfg.Descriptors = append(cfg.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: "user", Value: fmt.Sprintf("u%d", i),
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: uint32(i + 1)}})
	}
	for _, bc := range []struct {
		name string
		load func() (*Set, error)
	}{
		{"yaml", func() (*Set, error) { return Parse([]File{{Name: "bench.yaml", Data: data}}, Options{}) }},
		{"xds", func() (*Set, error) { return FromProto([]*rlsconfv3.RateLimitConfig{&cfg}, Options{}) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var set *Set
			for b.Loop() {
				s, err := bc.load()
				if err != nil {
					b.Fatal(err)
				}
				set = s
			}
			b.StopTimer()
			b.ReportMetric(float64(retained(b, bc.load))/n, "retained-B/descriptor")
			_ = set
		})
	}
}

// retained is the heap a loaded Set keeps alive.
func retained(b *testing.B, load func() (*Set, error)) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	set, err := load()
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(set)
	return after.HeapAlloc - min(before.HeapAlloc, after.HeapAlloc)
}
