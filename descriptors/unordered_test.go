package descriptors

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestMatchUnordered: a bucket id matches as the descriptor of some order
// of its pairs, with Match's rules at every level.
func TestMatchUnordered(t *testing.T) {
	s := mustParse(t, File{Name: "web.yaml", Data: []byte(matchRules)}, File{Name: "orders.yaml", Data: []byte(`
domain: orders
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    value: only
    rate_limit: {unit: second, requests_per_unit: 2}
`)})
	tests := []struct {
		name   string
		domain string
		bucket map[string]string
		want   string // rule ID, "" for none
		order  string // keys in the returned order
	}{
		{"one pair", "web", map[string]string{"user": "alice"}, "web.user", "user"},
		{"wildcard as Match", "web", map[string]string{"path": "/x/site.css"}, "web.path_*.css", "path"},
		{"two levels in either order", "web", map[string]string{"op": "write", "svc": "api"}, "web.svc_api.op_write", "svc,op"},
		{"parent limit needs the exact depth", "web", map[string]string{"tenant": "t1"}, "web.tenant", "tenant"},
		{"child", "web", map[string]string{"plan": "gold", "tenant": "t1"}, "web.tenant.plan_gold", "tenant,plan"},
		{"unlimited is a rule", "web", map[string]string{"free": "x"}, "web.free", "free"},
		{"whitelist is no rule", "web", map[string]string{"user": "root"}, "", ""},
		{"extra pair is no rule", "web", map[string]string{"user": "alice", "x": "y"}, "", ""},
		{"backtracks over pairs", "orders", map[string]string{"a": "1", "b": "2"}, "orders.a.b", "a,b"},
		{"the other order matches first", "orders", map[string]string{"b": "only"}, "orders.b_only", "b"},
		{"unknown domain", "nope", map[string]string{"user": "alice"}, "", ""},
		{"empty bucket", "web", map[string]string{}, "", ""},
		{"empty key", "web", map[string]string{"": "x"}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, order := s.MatchUnordered(tt.domain, tt.bucket)
			got := ""
			if r != nil {
				got = r.ID
			}
			var keys []string
			for _, e := range order {
				keys = append(keys, e.Key)
				if tt.bucket[e.Key] != e.Value {
					t.Errorf("entry %s=%q is not the bucket's %q", e.Key, e.Value, tt.bucket[e.Key])
				}
			}
			if got != tt.want || strings.Join(keys, ",") != tt.order {
				t.Errorf("MatchUnordered = %q in order %q, want %q in order %q", got, strings.Join(keys, ","), tt.want, tt.order)
			}
			if r != nil {
				if m := s.Match(tt.domain, order); m != r {
					t.Errorf("Match of the returned order = %v, want the same rule", m)
				}
			}
		})
	}
}

// TestMatchUnorderedSearchIsBounded: a rule set with the same ten keys at
// every level and a bucket that matches no order ends after
// MaxUnorderedSteps nodes, not after 10! orders.
func TestMatchUnorderedSearchIsBounded(t *testing.T) {
	s := mustParse(t, File{Name: "d.yaml", Data: []byte(tenKeysYAML(nil))})
	bucket := map[string]string{}
	for k := 0; k < 10; k++ {
		bucket[fmt.Sprintf("k%d", k)] = "v"
	}
	// Four levels of ten keys; a bucket of ten pairs reaches depth four in
	// 10·9·8·7 ways and never uses all ten.
	if r, _ := s.MatchUnordered("d", bucket); r != nil {
		t.Fatalf("matched %s, want no rule", r.ID)
	}
	// The same search as MatchUnordered's, to count its steps: without the
	// bound it would visit 10+90+720+5040 nodes.
	pairs := make([]Entry, 0, len(bucket))
	for k := 0; k < 10; k++ {
		pairs = append(pairs, Entry{Key: fmt.Sprintf("k%d", k), Value: "v"})
	}
	m := unorderedMatch{pairs: pairs, used: make([]bool, len(pairs))}
	if r := m.search(s.domains["d"]); r != nil || m.steps != MaxUnorderedSteps+1 {
		t.Fatalf("search = %v after %d steps, want nil after %d", r, m.steps, MaxUnorderedSteps+1)
	}
	four := map[string]string{"k3": "v", "k1": "v", "k7": "v", "k0": "v"}
	if r, order := s.MatchUnordered("d", four); r == nil || r.ID != "d.k0.k1.k3.k7" || len(order) != 4 {
		t.Fatalf("four pairs matched %v, want d.k0.k1.k3.k7", r)
	}
}

// tenKeysYAML is a rule file of keys k0 to k9 at each of four levels, each
// node of the fourth limited; under the fourth-level node at path (key
// numbers), when given, a chain of the keys the path does not use, in
// order, ends in a limited rule that uses all ten.
func tenKeysYAML(path []int) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	var level func(at []int, indent string)
	level = func(at []int, indent string) {
		for k := range 10 {
			here := append(slices.Clone(at), k)
			fmt.Fprintf(&b, "%s- key: k%d\n", indent, k)
			if len(here) < 4 {
				fmt.Fprintf(&b, "%s  descriptors:\n", indent)
				level(here, indent+"    ")
				continue
			}
			fmt.Fprintf(&b, "%s  rate_limit: {unit: second, requests_per_unit: 1}\n", indent)
			if slices.Equal(here, path) {
				chain := indent
				for k := range 10 {
					if slices.Contains(path, k) {
						continue
					}
					fmt.Fprintf(&b, "%s  descriptors:\n%s    - key: k%d\n", chain, chain, k)
					chain += "    "
				}
				fmt.Fprintf(&b, "%s  rate_limit: {unit: second, requests_per_unit: 1}\n", chain)
			}
		}
	}
	level(nil, "  ")
	return b.String()
}

// TestMatchUnorderedFindsAtTheBound: a rule the search reaches at exactly
// its MaxUnorderedSteps-th node matches; one a node later does not.
func TestMatchUnorderedFindsAtTheBound(t *testing.T) {
	// The nodes the search visits in tenKeysYAML(nil), in order, for a
	// bucket of the ten keys: the unused keys in key order, depth first.
	var visits [][]int
	var search func(at []int)
	search = func(at []int) {
		for k := range 10 {
			if !slices.Contains(at, k) {
				visits = append(visits, append(slices.Clone(at), k))
				if len(at) < 3 {
					search(visits[len(visits)-1])
				}
			}
		}
	}
	search(nil)
	bucket := map[string]string{}
	for k := range 10 {
		bucket[fmt.Sprint("k", k)] = "v"
	}
	// The chain under a fourth-level node is 6 nodes, visited right after it.
	for _, tt := range []struct {
		step  int // the step of the chain's last node
		match bool
	}{
		{MaxUnorderedSteps, true},
		{MaxUnorderedSteps + 1, false},
	} {
		path := visits[tt.step-6-1]
		if len(path) != 4 {
			t.Fatalf("the node visited at step %d is %v, not of the fourth level", tt.step-6, path)
		}
		s := mustParse(t, File{Name: "d.yaml", Data: []byte(tenKeysYAML(path))})
		r, order := s.MatchUnordered("d", bucket)
		if got := r != nil && len(order) == 10; got != tt.match {
			t.Errorf("a rule of ten reached at step %d (under %v): matched %v (%v), want %v", tt.step, path, got, r, tt.match)
		}
	}
}
