package service

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/leapgate/leapgate/internal/envoyhdr"
)

// HeaderMode selects the rate-limit response headers the service adds
// (LIMIT_RESPONSE_HEADERS_ENABLED).
type HeaderMode string

// Header modes.
const (
	// HeadersOff adds no rate-limit headers.
	HeadersOff HeaderMode = ""
	// HeadersDraft03 adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset (draft-ietf-httpapi-ratelimit-headers-03, as
	// envoyproxy/ratelimit does); the names are configurable.
	HeadersDraft03 HeaderMode = "draft03"
	// HeadersDraft11 adds the structured fields of the current draft:
	// RateLimit-Policy: "name";q=<quota>;w=<window seconds> and
	// RateLimit: "name";r=<remaining>;t=<seconds until reset>.
	HeadersDraft11 HeaderMode = "draft11"
)

// Default header names of HeadersDraft03, and the header names of the other
// modes.
const (
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
	PolicyHeader           = "RateLimit-Policy"
	RateLimitHeader        = "RateLimit"
)

// headerNames are the configured draft-03 header names.
type headerNames struct{ limit, remaining, reset string }

func (m HeaderMode) valid() bool {
	return m == HeadersOff || m == HeadersDraft03 || m == HeadersDraft11
}

// addHeaders adds the response headers: the rate-limit headers of the most
// constraining descriptor and, on a refusal, the reason and Retry-After (the
// time until this request could pass). The reason and Retry-After are added
// to a circuit breaker's refusal always, to a rate limit's only with
// RefusalHeaders (Retry-After also with HeadersDraft11), since upstream adds
// neither.
func (s *Service) addHeaders(sc *scratch, resp *rlsv3.RateLimitResponse, refused bool, reason string) {
	explain := refused && (s.refusalHeaders || reason == envoyhdr.ReasonCircuitOpen)
	if explain {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: envoyhdr.ReasonHeader, Value: reason})
	}
	if i := mostConstraining(sc.plans); i >= 0 && s.headers != HeadersOff {
		a := &sc.plans[i].answer
		limit := reportedLimit(a.limit)
		reset := envoyhdr.Seconds(a.reset)
		switch s.headers {
		case HeadersDraft03:
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
				&corev3.HeaderValue{Key: s.headerNames.limit, Value: strconv.FormatUint(uint64(limit), 10)},
				&corev3.HeaderValue{Key: s.headerNames.remaining, Value: strconv.FormatUint(uint64(a.remaining), 10)},
				&corev3.HeaderValue{Key: s.headerNames.reset, Value: strconv.FormatInt(reset, 10)},
			)
		case HeadersDraft11:
			name := sfString(policyName(&sc.plans[i]))
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
				&corev3.HeaderValue{Key: PolicyHeader, Value: fmt.Sprintf("%s;q=%d;w=%d", name, limit, windowSeconds(&sc.plans[i]))},
				&corev3.HeaderValue{Key: RateLimitHeader, Value: fmt.Sprintf("%s;r=%d;t=%d", name, a.remaining, reset)},
			)
		}
	}
	if explain || (refused && s.headers == HeadersDraft11) {
		retry := envoyhdr.RetryAfter(retryAfter(sc.plans))
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: envoyhdr.RetryAfterHeader, Value: strconv.FormatInt(retry, 10)})
	}
}

// enforcing reports whether a descriptor's OVER_LIMIT refuses the request by
// itself (not shadow mode, not quota mode).
func enforcing(p *plan) bool { return !p.shadow && !p.quota }

// mostConstraining returns the index of the descriptor whose limit the
// headers report, -1 if none has a limit: an enforcing over-limit descriptor
// if any (the longest wait), else the one with the least quota left (then
// the longest reset). Shadow-mode rules are not enforced and not reported.
func mostConstraining(plans []plan) int {
	best := -1
	var bestOver bool
	for i := range plans {
		p := &plans[i]
		st := &p.answer
		if st.limit == nil || p.shadow {
			continue
		}
		over := st.over && enforcing(p)
		if best < 0 {
			best, bestOver = i, over
			continue
		}
		b := &plans[best].answer
		reset, bestReset := st.reset, b.reset
		switch {
		case over != bestOver:
			if over {
				best, bestOver = i, over
			}
		case over:
			if reset > bestReset {
				best = i
			}
		case st.remaining != b.remaining:
			if st.remaining < b.remaining {
				best = i
			}
		case reset > bestReset:
			best = i
		}
	}
	return best
}

// retryAfter is the time until a refused request could pass: the longest
// wait of the descriptors answered OVER_LIMIT (rate limits and breakers).
func retryAfter(plans []plan) time.Duration {
	var longest time.Duration
	for i := range plans {
		if a := &plans[i].answer; a.over {
			longest = max(longest, a.reset)
		}
	}
	return longest
}

// policyName names a descriptor's limit in draft-11 headers: the limit's
// name, else the rule's ID ("override" for a descriptor's own limit).
func policyName(p *plan) string {
	switch {
	case p.kind == kindOverride && (p.best < 0 || p.best == p.first):
		return "override"
	case p.best >= 0 && p.limitOf(p.best-p.first).name != "":
		return p.limitOf(p.best - p.first).name
	}
	return p.info.rule.ID
}

// windowSeconds is the window length of a descriptor's reported limit, in
// whole seconds (at least 1).
func windowSeconds(p *plan) int64 {
	return envoyhdr.RetryAfter(p.limitOf(p.best - p.first).spec.Length())
}

// sfString encodes s as a structured-field string (RFC 8941 §3.3.3):
// quoted, with '"' and '\' escaped; bytes outside printable ASCII, which
// the format cannot carry, become '_'.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('_')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// Keys of the response dynamic metadata, as envoyproxy/ratelimit sets them,
// and metaRules, under which the matched rules' metadata is merged.
const (
	metaDomain      = "domain"
	metaDescriptors = "descriptors"
	metaEntries     = "entries"
	metaLimit       = "limit"
	metaHitsAddend  = "hitsAddend"
	metaRules       = "metadata"
)

// validUTF8 is a request string as a protobuf string field can carry it:
// invalid UTF-8 (which a request may hold, see ShouldRateLimit) becomes
// U+FFFD, since a response with invalid UTF-8 cannot be encoded.
func validUTF8(v string) string { return strings.ToValidUTF8(v, "\uFFFD") }

// dynamicMetadata builds the response's dynamic metadata
// (RESPONSE_DYNAMIC_METADATA) field for field as envoyproxy/ratelimit does:
//   - domain;
//   - descriptors: per request descriptor, its entries as "key=value"
//     strings, its limit override in protobuf text form when it has one,
//     and its own hitsAddend when set;
//   - hitsAddend: the request's, only when it is not 0;
//   - metadata: the metadata of the matched rules of the descriptors that
//     passed (answered OK, by a limit rather than by an unlimited rule),
//     merged in request order; on a clash the earlier descriptor's value
//     wins, and maps present in both are merged key by key; only when
//     there is any.
//
// plans is nil for a request no rule could match.
func dynamicMetadata(req *rlsv3.RateLimitRequest, plans []plan) *structpb.Struct {
	descs := make([]*structpb.Value, len(req.GetDescriptors()))
	for i, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			entries[j] = structpb.NewStringValue(validUTF8(e.GetKey() + "=" + e.GetValue()))
		}
		fields := map[string]*structpb.Value{metaEntries: structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			fields[metaLimit] = structpb.NewStringValue(l.String())
		}
		if h := d.GetHitsAddend(); h != nil {
			fields[metaHitsAddend] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs[i] = structpb.NewStructValue(&structpb.Struct{Fields: fields})
	}
	md := &structpb.Struct{Fields: map[string]*structpb.Value{
		metaDomain:      structpb.NewStringValue(validUTF8(req.GetDomain())),
		metaDescriptors: structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}}
	if h := req.GetHitsAddend(); h != 0 {
		md.Fields[metaHitsAddend] = structpb.NewNumberValue(float64(h))
	}
	var rules *structpb.Struct
	for i := range plans {
		p := &plans[i]
		if p.info == nil || p.info.metadata == nil || p.answer.over || p.kind == kindUnlimited {
			continue
		}
		if rules == nil {
			rules = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		}
		mergeAbsent(rules, p.info.metadata)
	}
	if rules != nil {
		md.Fields[metaRules] = structpb.NewStructValue(rules)
	}
	return md
}

// mergeAbsent copies into dst the fields of src that dst lacks, merging
// maps that both hold; a value dst already has otherwise stays.
func mergeAbsent(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
			continue
		}
		if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
			if hs.Fields == nil {
				hs.Fields = map[string]*structpb.Value{}
			}
			mergeAbsent(hs, vs)
		}
	}
}
