package descriptors

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse checks that the YAML loader never panics, that every error it
// reports is an *Error naming the file, and that a Set it returns is usable:
// rules whose path has only literal values are found by Match with that path.
// Seeds: testdata/fuzz/FuzzParse and the rule texts of the tests.
func FuzzParse(f *testing.F) {
	f.Add([]byte(matchRules))
	f.Add([]byte(extensionRules))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse([]File{{Name: "fuzz.yaml", Data: data}}, Options{})
		if err != nil {
			if s != nil {
				t.Fatal("Set returned with an error")
			}
			j, ok := err.(interface{ Unwrap() []error })
			if !ok {
				t.Fatalf("error is not a joined error: %v", err)
			}
			for _, e := range j.Unwrap() {
				var fe *Error
				if !errors.As(e, &fe) || fe.File != "fuzz.yaml" || fe.Line < 0 || fe.Reason == "" {
					t.Fatalf("bad error %#v", e)
				}
			}
			return
		}
		_ = s.Dump()
		for _, r := range s.Rules() {
			literal := true
			for _, p := range r.Path {
				literal = literal && p.Value != "" && !isWildcard(p.Value)
			}
			_ = r.AppendKey(nil, r.Path)
			_ = r.MetricKey(r.Path)
			if literal {
				if got := s.Match(r.Domain, r.Path); got != r {
					t.Fatalf("Match(%q, %v) = %v, want rule %s", r.Domain, r.Path, got, r.ID)
				}
			}
		}
	})
}

// FuzzMatch matches arbitrary descriptors against a fixed rule set and
// checks that a returned rule really matches them: same depth, same keys,
// and each value equal to, or matched by, the rule's value pattern.
// The descriptor is given as lines of key=value.
func FuzzMatch(f *testing.F) {
	s := mustParse(f, File{Name: "web.yaml", Data: []byte(matchRules)})
	for _, seed := range []struct{ domain, desc string }{
		{"web", "path=/admin"},
		{"web", "svc=api\nop=read"},
		{"web", "tenant=t\nplan=gold"},
		{"web", "ip=10.1.2.3"},
		{"mobile", "user=x"},
		{"web", ""},
	} {
		f.Add(seed.domain, seed.desc)
	}
	f.Fuzz(func(t *testing.T, domain, desc string) {
		var es []Entry
		if desc != "" {
			for _, line := range strings.Split(desc, "\n") {
				k, v, _ := strings.Cut(line, "=")
				es = append(es, Entry{Key: k, Value: v})
			}
		}
		r := s.Match(domain, es)
		if r == nil {
			return
		}
		if r.Domain != domain || len(r.Path) != len(es) {
			t.Fatalf("Match(%q, %v) = %s: wrong domain or depth", domain, es, r.ID)
		}
		for i, p := range r.Path {
			if p.Key != es[i].Key {
				t.Fatalf("Match(%q, %v) = %s: key %d differs", domain, es, r.ID, i)
			}
			switch {
			case p.Value == "":
			case isWildcard(p.Value):
				pat := compilePattern(p.Value)
				if !pat.match(es[i].Value) {
					t.Fatalf("Match(%q, %v) = %s: %q does not match %q", domain, es, r.ID, es[i].Value, p.Value)
				}
			case p.Value != es[i].Value:
				t.Fatalf("Match(%q, %v) = %s: value %d differs", domain, es, r.ID, i)
			}
		}
		_ = r.AppendKey(nil, es)
		_ = r.MetricKey(es)
	})
}

func TestPatternMatch(t *testing.T) {
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"*", "", true},
		{"*", "anything", true},
		{"foo*", "foo", true},
		{"foo*", "foobar", true},
		{"foo*", "fo", false},
		{"*bar", "foobar", true},
		{"*bar", "bars", false},
		{"a*b", "ab", true},
		{"a*b", "axxb", true},
		{"a*b", "axxbc", false},
		{"a*b*c", "abc", true},
		{"a*b*c", "a1b2c", true},
		{"a*b*c", "acb", false},
		{"a*b*c", "abbc", true},
		{"a*bc*bc", "abcbc", true},
		{"a*bc*bc", "abc", false},
		{"**", "x", true},
		{"a**b", "ab", true},
		{"*ab*ab*", "abab", true},
		{"*ab*ab*", "aba", false},
		{"aa*aa", "aaa", false},
		{"aa*aa", "aaaa", true},
	}
	for _, tt := range tests {
		p := compilePattern(tt.pattern)
		if got := p.match(tt.value); got != tt.want {
			t.Errorf("%q matches %q = %v, want %v", tt.pattern, tt.value, got, tt.want)
		}
	}
}
