package descriptors

import (
	"slices"
	"strings"
)

// MaxUnorderedSteps bounds the search of MatchUnordered: the most tree
// nodes it visits for one descriptor before it gives up and reports no
// match. Only rule sets that define the same keys in many orders come
// near it.
const MaxUnorderedSteps = 4096

// MatchUnordered matches a descriptor whose entries have no order, as an
// RLQS bucket id (a map of key to value) has none: it looks for an order of
// all of bucket's pairs that Match would match to a rule that carries
// limits, unlimited or a breaker, and returns that rule and the pairs in
// that order (to pass to the rule's AppendCounterKey and MetricKey). At each
// level it tries the remaining pairs in key order and, for a pair, the
// child Match would take (the exact value, then wildcards in file order,
// then the value-less key); it backtracks over pairs, not over values, and
// the first order found wins. It returns nil and no entries when no order
// matches, when bucket is empty or has more than MaxDepth pairs, and when
// the search visits MaxUnorderedSteps nodes first.
func (s *Set) MatchUnordered(domain string, bucket map[string]string) (*Rule, []Entry) {
	if s == nil || len(bucket) == 0 || len(bucket) > MaxDepth {
		return nil, nil
	}
	root := s.domains[domain]
	if root == nil {
		return nil, nil
	}
	pairs := make([]Entry, 0, len(bucket))
	for k, v := range bucket {
		pairs = append(pairs, Entry{Key: k, Value: v})
	}
	slices.SortFunc(pairs, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	m := unorderedMatch{pairs: pairs, used: make([]bool, len(pairs)), order: make([]Entry, 0, len(pairs))}
	if r := m.search(root); r != nil {
		return r, m.order
	}
	return nil, nil
}

// unorderedMatch is the state of one MatchUnordered search.
type unorderedMatch struct {
	pairs []Entry // the bucket's pairs, by key
	used  []bool  // pairs already on the path
	order []Entry // the path so far
	steps int
}

// search returns the rule at the end of a path from n that uses every
// unused pair, or nil.
func (m *unorderedMatch) search(n *node) *Rule {
	if len(m.order) == len(m.pairs) {
		if n.limited {
			return n.rule
		}
		return nil
	}
	for i, p := range m.pairs {
		if m.used[i] {
			continue
		}
		next := n.next(p)
		if next == nil {
			continue
		}
		if m.steps++; m.steps > MaxUnorderedSteps {
			return nil
		}
		m.used[i] = true
		m.order = append(m.order, p)
		if r := m.search(next); r != nil || m.steps > MaxUnorderedSteps {
			return r
		}
		m.used[i] = false
		m.order = m.order[:len(m.order)-1]
	}
	return nil
}

// next returns the child of n that Match takes for the entry e, or nil.
func (n *node) next(e Entry) *node {
	g := n.children[e.Key]
	if g == nil {
		return nil
	}
	if next := g.exact[e.Value]; next != nil {
		return next
	}
	for j := range g.wildcard {
		if g.wildcard[j].pattern.match(e.Value) {
			return g.wildcard[j].node
		}
	}
	return g.any
}
