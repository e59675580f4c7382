package descriptors

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/leapgate/leapgate/window"
)

// rawFile is one rule file (or xDS resource) after syntax checks, before the
// semantic checks shared by every source.
type rawFile struct {
	name        string
	line        int // of the domain field
	domain      string
	descriptors []*rawDescriptor
	bad         bool // the domain was malformed (already reported)
}

// rawDescriptor is one descriptor node; lines locate its fields for errors.
type rawDescriptor struct {
	line           int
	lines          map[string]int // field name -> line of its value
	key            string
	value          string
	limits         []*rawLimit // rate_limit first, then rate_limits
	shadowMode     bool
	quotaMode      bool
	detailedMetric bool
	valueToMetric  bool
	shareThreshold bool
	metadata       map[string]any
	breaker        *Breaker // validated and defaulted by the YAML reader
	concurrency    *rawConcurrency
	children       []*rawDescriptor
	bad            bool // key or value was malformed (already reported)
}

// rawLimit is one rate_limit block (or rate_limits item).
type rawLimit struct {
	line            int
	lines           map[string]int
	unit            string // as written; "" when absent
	requestsPerUnit uint32
	unlimited       bool
	name            string
	replaces        []rawReplace
	unitMultiplier  uint32 // 0 when absent
	multiplierSet   bool
	window          time.Duration // 0 when absent
	buckets         int           // 0 when absent
	bucketsSet      bool
	algorithm       window.Algorithm
	algorithmSet    bool
	charge          string // as written; "" when absent
	chargeSet       bool
	bad             bool // a field was malformed (already reported)
}

// rawConcurrency is one concurrency_limit block.
type rawConcurrency struct {
	line        int
	lines       map[string]int
	maxInFlight uint32
	maxSet      bool
	lease       time.Duration
	leaseSet    bool
	holderKey   string
	bad         bool // a field was malformed (already reported)
}

// rawReplace is one replaces entry.
type rawReplace struct {
	line int
	name string
}

// at returns the line of a field, or the fallback when unknown.
func at(lines map[string]int, field string, fallback int) int {
	if l := lines[field]; l > 0 {
		return l
	}
	return fallback
}

// builder turns raw files into a Set, collecting every error.
type builder struct {
	opts    Options
	set     *Set
	errs    []error
	domains map[string]string // domain -> "file:line" of its definition
	perFile map[string]int    // errors reported per file
	ids     map[string]*Rule  // every node's ID -> its rule, to catch collisions
	counted map[string]int    // descriptors read per domain
}

// MaxDepth is the deepest a descriptor may be nested (a top-level
// descriptor is at depth 1). A rule stores its whole path, so memory grows
// with depth times descriptors: the cap keeps it linear in the rules' size.
// A deeper descriptor is refused with its file and line (over xDS, in the
// NACK's reason), and nothing below it is read.
const MaxDepth = 32

// MaxDescriptorsPerDomain is the most descriptors, at every depth, one
// domain may have, over all its files or xDS resources; past it the
// domain is refused with the file and line of the first descriptor too
// many.
const MaxDescriptorsPerDomain = 100_000

func newBuilder(opts Options) *builder {
	return &builder{
		opts:    opts,
		set:     &Set{domains: map[string]*node{}, byID: map[string]*Rule{}},
		domains: map[string]string{},
		perFile: map[string]int{},
		ids:     map[string]*Rule{},
		counted: map[string]int{},
	}
}

func (b *builder) errorf(file string, line int, format string, args ...any) {
	b.perFile[file]++
	switch n := b.perFile[file]; {
	case n <= maxErrors:
		b.errs = append(b.errs, &Error{File: file, Line: line, Reason: fmt.Sprintf(format, args...)})
	case n == maxErrors+1:
		b.errs = append(b.errs, &Error{File: file, Line: line, Reason: "too many errors; stopped reporting"})
	}
}

// result returns the set, or the joined errors when there are any.
func (b *builder) result() (*Set, error) {
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	sort.Slice(b.set.rules, func(i, j int) bool { return b.set.rules[i].ID < b.set.rules[j].ID })
	return b.set, nil
}

func (b *builder) addFile(f *rawFile) {
	if f.bad {
		return
	}
	if f.domain == "" {
		b.errorf(f.name, f.line, "config file cannot have empty domain")
		b.checkOnly(f)
		return
	}
	root := b.set.domains[f.domain]
	if where, dup := b.domains[f.domain]; dup {
		if !b.opts.MergeDomains {
			b.errorf(f.name, f.line, "duplicate domain '%s' in config file (first defined at %s)", f.domain, where)
			b.checkOnly(f)
			return
		}
		if root == nil {
			return // its first definition was refused
		}
	} else {
		b.domains[f.domain] = location(f.name, f.line)
		root = &node{}
		b.set.domains[f.domain] = root
	}
	b.addChildren(f, root, f.domain, nil, nil, f.descriptors)
}

// checkOnly reports the problems of the descriptors of f, a file whose
// domain was refused, so that every problem of every file is reported at
// once; nothing of f joins the set (a builder of its own takes them).
func (b *builder) checkOnly(f *rawFile) {
	scratch := newBuilder(b.opts)
	scratch.perFile[f.name] = b.perFile[f.name]
	scratch.addChildren(f, &node{}, f.domain, nil, nil, f.descriptors)
	b.errs = append(b.errs, scratch.errs...)
	b.perFile[f.name] = scratch.perFile[f.name]
}

// addChildren validates and links the descriptors below parent, whose ID is
// parentID and whose path and levels are given.
func (b *builder) addChildren(f *rawFile, parent *node, parentID string, path []Entry, levels []level, descs []*rawDescriptor) {
	seen := map[string]int{} // composite key -> line
	for _, d := range descs {
		if d.bad {
			continue
		}
		if len(path) >= MaxDepth {
			b.errorf(f.name, d.line, "descriptor '%s' is nested %d deep, deeper than the %d levels allowed", parentID+"."+d.key, len(path)+1, MaxDepth)
			continue
		}
		if b.counted[f.domain]++; b.counted[f.domain] > MaxDescriptorsPerDomain {
			if b.counted[f.domain] == MaxDescriptorsPerDomain+1 {
				b.errorf(f.name, d.line, "domain '%s' has more than the %d descriptors allowed", f.domain, MaxDescriptorsPerDomain)
			}
			return
		}
		if d.key == "" {
			b.errorf(f.name, d.line, "descriptor has empty key")
			continue
		}
		if strings.IndexByte(d.key, 0) >= 0 || strings.IndexByte(d.value, 0) >= 0 {
			b.errorf(f.name, d.line, "descriptor key and value must not contain NUL bytes")
			continue
		}
		composite := d.key
		if d.value != "" {
			composite += "_" + d.value
		}
		id := parentID + "." + composite
		if first, dup := seen[composite]; dup {
			if first > 0 {
				b.errorf(f.name, d.line, "duplicate descriptor composite key '%s' (first at line %d)", id, first)
			} else {
				b.errorf(f.name, d.line, "duplicate descriptor composite key '%s'", id)
			}
			continue
		}
		seen[composite] = d.line
		if other := parent.child(d.key, d.value); other != nil {
			// Defined by another file of a merged domain.
			b.errorf(f.name, d.line, "duplicate descriptor composite key '%s' (first at %s)", id, location(other.rule.File, other.rule.Line))
			continue
		}
		wild := isWildcard(d.value)
		if d.shareThreshold && !wild {
			b.errorf(f.name, at(d.lines, "share_threshold", d.line),
				"share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", composite)
		}

		rule := &Rule{
			Domain:         f.domain,
			Path:           append(append([]Entry(nil), path...), Entry{Key: d.key, Value: d.value}),
			ID:             id,
			ShadowMode:     d.shadowMode,
			QuotaMode:      d.quotaMode,
			DetailedMetric: d.detailedMetric,
			ValueToMetric:  d.valueToMetric,
			ShareThreshold: d.shareThreshold,
			Metadata:       d.metadata,
			Breaker:        d.breaker,
			File:           f.name,
			Line:           d.line,
			levels: append(append([]level(nil), levels...), level{
				exact:         d.value != "" && !wild,
				share:         d.shareThreshold && wild,
				valueToMetric: d.valueToMetric,
			}),
		}
		b.addLimits(f, d, rule)
		b.addConcurrency(f, d, rule)
		if other, dup := b.ids[id]; dup {
			b.errorf(f.name, d.line, "descriptor id '%s' is also the id of the descriptor at %s (keys or values containing '.' or '_' make paths ambiguous)",
				id, location(other.File, other.Line))
			continue
		}
		b.ids[id] = rule

		setKeySuffixes(rule)
		n := &node{rule: rule, limited: len(rule.Limits) > 0 || rule.Unlimited || rule.Breaker != nil}
		if n.limited {
			b.set.rules = append(b.set.rules, rule)
			b.set.byID[id] = rule
		}
		if parent.children == nil {
			parent.children = map[string]*keyGroup{}
		}
		g := parent.children[d.key]
		if g == nil {
			g = &keyGroup{}
			parent.children[d.key] = g
		}
		switch {
		case d.value == "":
			g.any = n
		case wild:
			g.wildcard = append(g.wildcard, wildcardChild{pattern: compilePattern(d.value), node: n})
		default:
			if g.exact == nil {
				g.exact = map[string]*node{}
			}
			g.exact[d.value] = n
		}
		b.addChildren(f, n, id, rule.Path, rule.levels, d.children)
	}
}

// list renders names as an English list: "a, b and c" (conj "and").
func list(names []string, conj string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " " + conj + " " + names[len(names)-1]
}

// location renders file:line, or file alone when the line is unknown.
func location(file string, line int) string {
	if line > 0 {
		return fmt.Sprintf("%s:%d", file, line)
	}
	return file
}
