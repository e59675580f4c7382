package ruletest_test

import (
	"testing"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"
)

func TestParse(t *testing.T) {
	set := ruletest.Parse(t, descriptors.Options{},
		"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	if !set.HasDomain("a") || !set.HasDomain("b") {
		t.Fatalf("domains %v, want a and b", set.Domains())
	}
	if r := set.Rule("b.k"); r == nil || r.File != "rulesb.yaml" {
		t.Fatalf("rule b.k %+v, want it from rulesb.yaml", r)
	}
}

// refusal records a Fatalf instead of stopping the test.
type refusal struct {
	testing.TB
	msg string
}

func (r *refusal) Helper() {}
func (r *refusal) Fatalf(format string, args ...any) {
	r.msg = format
	panic(r)
}

func TestParseRefusalFailsTheTest(t *testing.T) {
	r := &refusal{TB: t}
	func() {
		defer func() {
			if p := recover(); p != nil && p != any(r) {
				panic(p)
			}
		}()
		ruletest.Parse(r, descriptors.Options{}, "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	}()
	if r.msg == "" {
		t.Fatal("a refused rule file did not fail the test")
	}
}
