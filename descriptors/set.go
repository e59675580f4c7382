package descriptors

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/leapgate/leapgate/window"
)

// Set is an immutable, validated rule set: the descriptor trees of every
// loaded domain. It is safe for concurrent use. Build one with Load, LoadFS,
// Parse or FromProto.
type Set struct {
	domains map[string]*node
	rules   []*Rule          // every rule, sorted by ID
	byID    map[string]*Rule // rules by ID
	holders bool             // some rule has a HolderKey (see MatchHolder)
}

// node is one descriptor of a domain's tree (or the domain root).
type node struct {
	rule     *Rule // the descriptor's data; nil for a domain root
	limited  bool  // rule carries limits, unlimited or a breaker: Match returns it
	children map[string]*keyGroup
}

// keyGroup holds the children of a node that share one key, in the order
// matching tries them.
type keyGroup struct {
	exact    map[string]*node // literal values
	wildcard []wildcardChild  // values with '*', in file order
	any      *node            // the value-less key
}

type wildcardChild struct {
	pattern pattern
	node    *node
}

// child returns the child of n defined with exactly this key and value (a
// pattern compares as written), or nil.
func (n *node) child(key, value string) *node {
	g := n.children[key]
	switch {
	case g == nil:
		return nil
	case value == "":
		return g.any
	case isWildcard(value):
		for _, w := range g.wildcard {
			if p := w.node.rule.Path; p[len(p)-1].Value == value {
				return w.node
			}
		}
		return nil
	}
	return g.exact[value]
}

// Match returns the rule for one request descriptor of the domain, or nil
// when no rule limits it: unknown domain, no matching path, a request deeper
// or shallower than the rule, or a matching node that carries no limit (a
// whitelist entry). It follows envoyproxy/ratelimit: per level the exact
// value, then wildcards in file order, then the value-less key, without
// backtracking. Match does not allocate.
func (s *Set) Match(domain string, entries []Entry) *Rule {
	if s == nil || len(entries) == 0 {
		return nil
	}
	n := s.domains[domain]
	if n == nil {
		return nil
	}
	for i := range entries {
		e := &entries[i]
		g := n.children[e.Key]
		if g == nil {
			return nil
		}
		next := g.exact[e.Value]
		if next == nil {
			for j := range g.wildcard {
				if g.wildcard[j].pattern.match(e.Value) {
					next = g.wildcard[j].node
					break
				}
			}
		}
		if next == nil {
			next = g.any
		}
		if next == nil {
			return nil
		}
		n = next
	}
	if !n.limited {
		return nil
	}
	return n.rule
}

// MatchHolder is Match for a descriptor that may end with the entry naming
// its holder: when entries match no rule, and all but the last match a rule
// whose HolderKey is the last entry's key (a concurrency_limit), it returns
// that rule, the number of entries it matched (all but the last) and the
// last entry's value as the holder. Otherwise it returns Match's rule,
// len(entries) and "". It does not allocate.
func (s *Set) MatchHolder(domain string, entries []Entry) (rule *Rule, depth int, holder string) {
	if r := s.Match(domain, entries); r != nil || len(entries) < 2 || !s.holders {
		return r, len(entries), ""
	}
	n := len(entries) - 1
	if r := s.Match(domain, entries[:n]); r != nil && r.HolderKey != "" && r.HolderKey == entries[n].Key {
		return r, n, entries[n].Value
	}
	return nil, len(entries), ""
}

// HasDomain reports whether the set has rules for the domain.
func (s *Set) HasDomain(domain string) bool {
	if s == nil {
		return false
	}
	_, ok := s.domains[domain]
	return ok
}

// Domains returns the set's domains, sorted.
func (s *Set) Domains() []string {
	if s == nil {
		return nil
	}
	ds := make([]string, 0, len(s.domains))
	for d := range s.domains {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	return ds
}

// Rules returns every rule of the set that carries limits, unlimited or a
// circuit breaker, sorted by ID. The slice is the caller's; the rules are
// shared and must not be modified.
func (s *Set) Rules() []*Rule {
	if s == nil {
		return nil
	}
	return append([]*Rule(nil), s.rules...)
}

// Rule returns the rule with the given ID, or nil.
func (s *Set) Rule(id string) *Rule {
	if s == nil {
		return nil
	}
	return s.byID[id]
}

// Dump returns a readable listing of the rules, one per line in ID order,
// in the spirit of envoyproxy/ratelimit's /rlconfig:
//
//	api.user: unit=MINUTE requests_per_unit=100, shadow_mode: false
func (s *Set) Dump() string {
	if s == nil {
		return ""
	}
	var b strings.Builder
	for _, r := range s.rules {
		b.WriteString(r.ID)
		b.WriteString(":")
		if r.Unlimited {
			b.WriteString(" unlimited")
			if r.unlimitedName != "" {
				fmt.Fprintf(&b, " name=%s", r.unlimitedName)
			}
		}
		for i, l := range r.Limits {
			if i > 0 {
				b.WriteString(";")
			}
			fmt.Fprintf(&b, " unit=%s requests_per_unit=%d", l.Unit, l.RequestsPerUnit)
			if l.Length > 0 || l.UnitMultiplier > 1 {
				fmt.Fprintf(&b, " window=%s", l.Window())
			}
			if l.Buckets > 0 {
				fmt.Fprintf(&b, " buckets=%d", l.Buckets)
			}
			if l.Algorithm != window.SlidingWindow {
				fmt.Fprintf(&b, " algorithm=%s", l.Algorithm)
			}
			if l.ChargeAlways {
				b.WriteString(" charge=always")
			}
			if l.Name != "" {
				fmt.Fprintf(&b, " name=%s", l.Name)
			}
		}
		if r.HolderKey != "" {
			fmt.Fprintf(&b, ", holder_key: %s", r.HolderKey)
		}
		fmt.Fprintf(&b, ", shadow_mode: %t", r.ShadowMode)
		if r.QuotaMode {
			b.WriteString(", quota_mode: true")
		}
		if len(r.Replaces) > 0 {
			fmt.Fprintf(&b, ", replaces: [%s]", strings.Join(r.Replaces, ","))
		}
		if r.Breaker != nil {
			br := r.Breaker
			fmt.Fprintf(&b, ", circuit_breaker: {strategy=%s threshold=%g", br.Strategy, br.Threshold)
			if br.MaxResponseTime > 0 {
				fmt.Fprintf(&b, " max_response_time=%s", br.MaxResponseTime)
			}
			fmt.Fprintf(&b, " min_requests=%d window=%s buckets=%d open_duration=%s half_open_probes=%d probe_timeout=%s}",
				br.MinRequests, br.Spec.Length(), br.Spec.Buckets(), br.OpenDuration, br.HalfOpenProbes, br.ProbeTimeout)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// LongValue is the length in bytes above which a request value is keyed by
// its SHA-256 digest instead of its bytes (AppendKey) and shown in metrics by
// a prefix of that digest (MetricKey). Such a value is limited like any
// other, and its counter and breaker keys stay short whatever its length.
const LongValue = 128

// AppendKey appends the counter key of a request descriptor matched by the
// rule to dst and returns the extended slice. The key is the rule's ID
// followed, for each level of the rule's path, by a 0x00 byte, the length of
// the value as a uvarint and the value: the request's value, or for a
// share_threshold wildcard level the pattern, so that every value matching
// it shares one counter. A request value longer than LongValue is written as
// its 32-byte SHA-256 digest after its true length, so that the length
// alone tells the two forms apart. IDs contain no 0x00 byte and the values
// are length prefixed, so distinct rules or values never produce the same
// key (except through a SHA-256 collision). Entries beyond the rule's depth
// are ignored; missing ones count as empty. Values may hold any bytes,
// including invalid UTF-8.
func (r *Rule) AppendKey(dst []byte, entries []Entry) []byte {
	dst = append(dst, r.ID...)
	for i := range r.Path {
		v := ""
		switch {
		case !r.VariesAt(i):
			v = r.Path[i].Value
		case i < len(entries):
			v = entries[i].Value
		}
		dst = append(dst, 0)
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		if len(v) > LongValue {
			sum := sha256.Sum256([]byte(v))
			dst = append(dst, sum[:]...)
			continue
		}
		dst = append(dst, v...)
	}
	return dst
}

// AppendCounterKey appends the full counter key of the limit-th limit of
// the rule for a request descriptor matched by it: AppendKey, then the
// limit's KeySuffix. It is the one place counter keys are made (with
// AppendOverrideKey), and persisted state on Redis: a change to it resets
// every counter on deploy (TestCounterKeysAreStable pins it).
func (r *Rule) AppendCounterKey(dst []byte, entries []Entry, limit int) []byte {
	return append(r.AppendKey(dst, entries), r.Limits[limit].KeySuffix...)
}

// AppendOverrideKey appends the counter key of a request descriptor
// limited by its own limit override (a RateLimitDescriptor's limit field)
// in domain: its entries, length-prefixed so that no two distinct
// descriptors share a key, and the window layout. It never equals a rule's
// counter key (rule IDs do not start with 0x00).
func AppendOverrideKey(dst []byte, domain string, entries []Entry, spec window.Spec) []byte {
	dst = append(dst, "\x00override\x00"...)
	dst = appendLenString(dst, domain)
	for _, e := range entries {
		dst = appendLenString(dst, e.Key)
		dst = appendLenString(dst, e.Value)
	}
	dst = append(dst, 'w')
	dst = strconv.AppendUint(dst, uint64(spec.Length()), 10)
	dst = append(dst, '/')
	return strconv.AppendUint(dst, uint64(spec.Buckets()), 10)
}

// appendLenString appends len(s) in decimal, ':' and s.
func appendLenString(dst []byte, s string) []byte {
	dst = strconv.AppendUint(dst, uint64(len(s)), 10)
	dst = append(dst, ':')
	return append(dst, s...)
}

// VariesAt reports whether the request's value at element i of the rule's
// path takes part in its counter and breaker keys (AppendKey): true for a
// value-less level and for a wildcard level without share_threshold, false
// for a literal value and for a share_threshold wildcard, whose pattern
// stands for every value it matches. share_threshold applies to the level it
// is set on only.
func (r *Rule) VariesAt(i int) bool { return !r.levels[i].exact && !r.levels[i].share }

// Varies reports whether any level VariesAt: whether requests matching the
// rule can have different counter and breaker keys.
func (r *Rule) Varies() bool {
	for i := range r.Path {
		if r.VariesAt(i) {
			return true
		}
	}
	return false
}

// MetricKey returns the stats key of a request descriptor matched by the
// rule, as envoyproxy/ratelimit names its stats: the rule's ID, unless
//   - the rule has detailed_metric: the request's own path,
//     "domain.key_value.key_value...";
//   - a level of its path has value_to_metric: that level appears as
//     key_<request value> instead of key or key_<pattern>.
//
// A share_threshold level always shows its pattern, never the request's
// value. Only these options put request values, and so unbounded
// cardinality, into metrics. A request value longer than LongValue shows as
// "sha256:" and the first 16 hex digits of its digest, and invalid UTF-8 in
// a value as U+FFFD, so that the key is always a valid, short label value.
// A level beyond the last of entries shows the rule's own value.
func (r *Rule) MetricKey(entries []Entry) string {
	if !r.MetricVaries() {
		return r.ID
	}
	var b strings.Builder
	b.WriteString(r.Domain)
	for i, p := range r.Path {
		v := p.Value
		useRequest := (r.DetailedMetric || r.levels[i].valueToMetric) && !r.levels[i].share
		if useRequest && i < len(entries) {
			v = MetricValue(entries[i].Value)
		}
		b.WriteByte('.')
		b.WriteString(p.Key)
		if v != "" {
			b.WriteByte('_')
			b.WriteString(v)
		}
	}
	return b.String()
}

// MetricVaries reports whether MetricKey depends on the request's values:
// the rule has detailed_metric, or value_to_metric on any level of its path
// (not only its own). When it is false, MetricKey is always the rule's ID.
func (r *Rule) MetricVaries() bool {
	if r.DetailedMetric {
		return true
	}
	for _, l := range r.levels {
		if l.valueToMetric {
			return true
		}
	}
	return false
}

// MetricValue is a request value as MetricKey shows it: valid UTF-8 (U+FFFD
// for invalid bytes), and a value longer than LongValue as "sha256:" and the
// first 16 hex digits of its digest. Metrics and logs that name request
// values use it.
func MetricValue(v string) string {
	if len(v) > LongValue {
		sum := sha256.Sum256([]byte(v))
		return "sha256:" + hex.EncodeToString(sum[:8])
	}
	return strings.ToValidUTF8(v, "\uFFFD")
}

// pattern is a value with '*' wildcards, each matching any run of bytes
// (including none).
type pattern struct {
	prefix string   // before the first '*'
	suffix string   // after the last '*'
	middle []string // the non-empty parts between, in order
	min    int      // len(prefix)+len(suffix)+len of middle parts
}

// isWildcard reports whether a configured value is a wildcard pattern.
func isWildcard(v string) bool { return strings.Contains(v, "*") }

func compilePattern(v string) pattern {
	parts := strings.Split(v, "*")
	p := pattern{prefix: parts[0], suffix: parts[len(parts)-1]}
	p.min = len(p.prefix) + len(p.suffix)
	for _, m := range parts[1 : len(parts)-1] {
		if m != "" {
			p.middle = append(p.middle, m)
			p.min += len(m)
		}
	}
	return p
}

// match reports whether v matches the pattern. Matching the middle parts
// leftmost-first is exact for '*'-only patterns.
func (p *pattern) match(v string) bool {
	if len(v) < p.min || !strings.HasPrefix(v, p.prefix) || !strings.HasSuffix(v, p.suffix) {
		return false
	}
	rest := v[len(p.prefix) : len(v)-len(p.suffix)]
	for _, m := range p.middle {
		i := strings.Index(rest, m)
		if i < 0 {
			return false
		}
		rest = rest[i+len(m):]
	}
	return true
}
