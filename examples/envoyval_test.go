package examples

// An offline Envoy config validator: Envoy's own protos (go-control-plane)
// and their protoc-gen-validate rules, applied also inside every
// google.protobuf.Any (which ValidateAll does not descend into), plus
// cross-reference checks that only a booted Envoy would otherwise report.

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	grpcalsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/leapgate/leapgate/descriptors"
)

// Blank-imported or named above: every extension type the examples use, so
// that protojson can resolve their "@type" URLs. A config naming any other
// type fails to parse ("unable to resolve").
var _ = []proto.Message{
	&grpcalsv3.HttpGrpcAccessLogConfig{}, &extprocv3.ExternalProcessor{},
	&ratelimitv3.RateLimit{}, &hcmv3.HttpConnectionManager{}, &httpv3.HttpProtocolOptions{},
}

// parseYAML decodes YAML into msg strictly: unknown fields, unknown "@type"
// URLs, bad enum values and malformed durations are errors.
func parseYAML(data []byte, msg proto.Message) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	return parseJSON(js, msg)
}

func parseJSON(js []byte, msg proto.Message) error {
	opts := protojson.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}
	if err := opts.Unmarshal(js, msg); err != nil {
		return fmt.Errorf("%s: %w", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

type validatorAll interface{ ValidateAll() error }

// validateDeep runs the PGV rules on msg and on every message packed in a
// google.protobuf.Any anywhere below it, recursively. visit, when not nil,
// is called on msg and every message below it, unpacked Anys included.
func validateDeep(msg proto.Message, visit func(proto.Message)) error {
	var errs []error
	var walk func(m protoreflect.Message, path string)
	walk = func(m protoreflect.Message, path string) {
		if a, ok := m.Interface().(*anypb.Any); ok {
			inner, err := a.UnmarshalNew()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: unpack %s: %w", path, a.GetTypeUrl(), err))
				return
			}
			path = fmt.Sprintf("%s(%s)", path, inner.ProtoReflect().Descriptor().Name())
			if v, ok := inner.(validatorAll); ok {
				if err := v.ValidateAll(); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", path, err))
				}
			}
			walk(inner.ProtoReflect(), path)
			return
		}
		if visit != nil {
			visit(m.Interface())
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.Message() == nil {
				return true
			}
			p := path + "." + string(fd.Name())
			switch {
			case fd.IsList():
				for i := 0; i < v.List().Len(); i++ {
					walk(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", p, i))
				}
			case fd.IsMap():
				if fd.MapValue().Message() == nil {
					return true
				}
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					walk(mv.Message(), fmt.Sprintf("%s[%v]", p, k.Interface()))
					return true
				})
			default:
				walk(v.Message(), p)
			}
			return true
		})
	}
	if v, ok := msg.(validatorAll); ok {
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, err)
		}
	}
	walk(msg.ProtoReflect(), string(msg.ProtoReflect().Descriptor().Name()))
	return errors.Join(errs...)
}

// ratelimitFilter is a ratelimit HTTP filter found in a config.
type ratelimitFilter struct {
	Name   string
	Config *ratelimitv3.RateLimit
}

// envoyFacts is what the cross-reference checks need from a config, all
// collected by one walk (unpacked Anys included).
type envoyFacts struct {
	Clusters      map[string]*clusterv3.Cluster
	GRPCClusters  []string // clusters named by envoy_grpc services
	RouteClusters []string
	Routes        []*routev3.Route
	RateLimits    []ratelimitFilter
	ExtProcs      []*extprocv3.ExternalProcessor
	HCMs          []*hcmv3.HttpConnectionManager
	AccessLogs    []*grpcalsv3.HttpGrpcAccessLogConfig
}

func collectFacts(msg proto.Message) (*envoyFacts, error) {
	f := &envoyFacts{Clusters: map[string]*clusterv3.Cluster{}}
	err := validateDeep(msg, func(m proto.Message) {
		switch m := m.(type) {
		case *clusterv3.Cluster:
			f.Clusters[m.GetName()] = m
		case *corev3.GrpcService_EnvoyGrpc:
			f.GRPCClusters = append(f.GRPCClusters, m.GetClusterName())
		case *routev3.Route:
			f.Routes = append(f.Routes, m)
		case *routev3.RouteAction:
			if c := m.GetCluster(); c != "" {
				f.RouteClusters = append(f.RouteClusters, c)
			}
			for _, w := range m.GetWeightedClusters().GetClusters() {
				f.RouteClusters = append(f.RouteClusters, w.GetName())
			}
		case *hcmv3.HttpFilter:
			if rl := new(ratelimitv3.RateLimit); m.GetTypedConfig().MessageIs(rl) {
				if err := m.GetTypedConfig().UnmarshalTo(rl); err == nil {
					f.RateLimits = append(f.RateLimits, ratelimitFilter{Name: m.GetName(), Config: rl})
				}
			}
		case *extprocv3.ExternalProcessor:
			f.ExtProcs = append(f.ExtProcs, m)
		case *hcmv3.HttpConnectionManager:
			f.HCMs = append(f.HCMs, m)
		case *grpcalsv3.HttpGrpcAccessLogConfig:
			f.AccessLogs = append(f.AccessLogs, m)
		}
	})
	return f, err
}

// isHTTP2 reports whether a cluster speaks HTTP/2 to its endpoints, as gRPC
// needs.
func isHTTP2(c *clusterv3.Cluster) bool {
	//lint:ignore SA1019 the deprecated form, still accepted by Envoy, counts too
	if c.GetHttp2ProtocolOptions() != nil {
		return true
	}
	a, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		return false
	}
	var opts httpv3.HttpProtocolOptions
	if err := a.UnmarshalTo(&opts); err != nil {
		return false
	}
	return opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}

// checkClusterRefs reports clusters named by routes or gRPC services that do
// not exist, and gRPC clusters that do not speak HTTP/2.
func checkClusterRefs(f *envoyFacts) error {
	var errs []error
	for _, name := range f.RouteClusters {
		if _, ok := f.Clusters[name]; !ok {
			errs = append(errs, fmt.Errorf("route names unknown cluster %q", name))
		}
	}
	for _, name := range f.GRPCClusters {
		c, ok := f.Clusters[name]
		if !ok {
			errs = append(errs, fmt.Errorf("gRPC service names unknown cluster %q", name))
			continue
		}
		if !isHTTP2(c) {
			errs = append(errs, fmt.Errorf("gRPC cluster %q does not enable HTTP/2 (explicit_http_config.http2_protocol_options)", name))
		}
	}
	return errors.Join(errs...)
}

// Representative values for the request-dependent descriptor entries: two
// each, so a rule that matches only one literal value is caught.
var sampleValues = map[string][2]string{
	"request_headers": {"alice", "bob"},
	"remote_address":  {"192.0.2.1", "198.51.100.7"},
	"source_cluster":  {"edge-proxy", "other-proxy"},
}

// descriptorsOf returns the descriptors one rate_limits entry produces for
// a request to cluster, once per sample (index 0 and 1). It fails on an
// action this checker does not model, so nothing goes unchecked silently.
func descriptorsOf(rl *routev3.RateLimit, cluster string, sample int) ([]descriptors.Entry, error) {
	var entries []descriptors.Entry
	for _, a := range rl.GetActions() {
		switch {
		case a.GetGenericKey() != nil:
			key := a.GetGenericKey().GetDescriptorKey()
			if key == "" {
				key = "generic_key"
			}
			entries = append(entries, descriptors.Entry{Key: key, Value: a.GetGenericKey().GetDescriptorValue()})
		case a.GetRequestHeaders() != nil:
			entries = append(entries, descriptors.Entry{Key: a.GetRequestHeaders().GetDescriptorKey(), Value: sampleValues["request_headers"][sample]})
		case a.GetRemoteAddress() != nil:
			entries = append(entries, descriptors.Entry{Key: "remote_address", Value: sampleValues["remote_address"][sample]})
		case a.GetSourceCluster() != nil:
			entries = append(entries, descriptors.Entry{Key: "source_cluster", Value: sampleValues["source_cluster"][sample]})
		case a.GetDestinationCluster() != nil:
			entries = append(entries, descriptors.Entry{Key: "destination_cluster", Value: cluster})
		default:
			return nil, fmt.Errorf("action %v is not modelled by the example checker", a)
		}
	}
	return entries, nil
}

// routeDescriptor is one descriptor a route sends to one rate-limit filter.
type routeDescriptor struct {
	Route   string
	Filter  ratelimitFilter
	Entries []descriptors.Entry
}

// routeDescriptors lists every descriptor the routes' rate_limits produce
// (and those of their RateLimitPerRoute configs), with the filter (by stage,
// or by name for a per-route config) that sends it. A rate_limits entry whose stage
// no filter evaluates is an error: it would never be sent.
func routeDescriptors(f *envoyFacts, extraRateLimits map[string][]*routev3.RateLimit) ([]routeDescriptor, error) {
	var out []routeDescriptor
	var errs []error
	// add lists the descriptors of rls, sent by the filter named filter
	// (a RateLimitPerRoute's) or, when filter is "", by each filter of
	// their stage.
	add := func(route, cluster, filter string, rls []*routev3.RateLimit) {
		for _, rl := range rls {
			var filters []ratelimitFilter
			for _, flt := range f.RateLimits {
				if filter == "" && flt.Config.GetStage() == rl.GetStage().GetValue() || filter != "" && flt.Name == filter {
					filters = append(filters, flt)
				}
			}
			if len(filters) == 0 {
				errs = append(errs, fmt.Errorf("route %q: rate_limits stage %d is evaluated by no ratelimit filter", route, rl.GetStage().GetValue()))
			}
			for sample := range 2 {
				entries, err := descriptorsOf(rl, cluster, sample)
				if err != nil {
					errs = append(errs, fmt.Errorf("route %q: %w", route, err))
					break
				}
				for _, flt := range filters {
					out = append(out, routeDescriptor{Route: route, Filter: flt, Entries: entries})
				}
			}
		}
	}
	for _, r := range f.Routes {
		add(r.GetName(), r.GetRoute().GetCluster(), "", r.GetRoute().GetRateLimits())
		for filter, cfg := range r.GetTypedPerFilterConfig() {
			if per := new(ratelimitv3.RateLimitPerRoute); cfg.MessageIs(per) {
				if err := cfg.UnmarshalTo(per); err != nil {
					errs = append(errs, fmt.Errorf("route %q: %s: %w", r.GetName(), filter, err))
					continue
				}
				add(r.GetName(), r.GetRoute().GetCluster(), filter, per.GetRateLimits())
			}
		}
	}
	for route, rls := range extraRateLimits {
		add(route, "", "", rls)
	}
	return out, errors.Join(errs...)
}

// checkRules reports filter domains without rules and route descriptors no
// rule matches. A descriptor sent by a filter whose rate_limited_status is
// 503 (the breaker stage) must match a rule with a circuit breaker.
func checkRules(set *descriptors.Set, f *envoyFacts, rds []routeDescriptor) error {
	var errs []error
	for _, flt := range f.RateLimits {
		if !set.HasDomain(flt.Config.GetDomain()) {
			errs = append(errs, fmt.Errorf("filter %q: no rules for domain %q", flt.Name, flt.Config.GetDomain()))
		}
	}
	for _, rd := range rds {
		domain := rd.Filter.Config.GetDomain()
		rule, _, _ := set.MatchHolder(domain, rd.Entries)
		switch {
		case rule == nil:
			errs = append(errs, fmt.Errorf("route %q: descriptor %v in domain %q matches no rule", rd.Route, rd.Entries, domain))
		case rd.Filter.Config.GetRateLimitedStatus().GetCode() == 503 && rule.Breaker == nil:
			errs = append(errs, fmt.Errorf("route %q: descriptor %v in breaker domain %q matches rule %s, which has no circuit_breaker", rd.Route, rd.Entries, domain, rule.ID))
		}
	}
	return errors.Join(errs...)
}

// hasBreakers reports whether any rule of set has a circuit breaker.
func hasBreakers(set *descriptors.Set) bool {
	for _, r := range set.Rules() {
		if r.Breaker != nil {
			return true
		}
	}
	return false
}

// checkBreakersReachable reports breaker rules keyed on a route or cluster
// name that the config does not have: such a breaker would never see an
// observation. Value-less keys (one breaker per value) are always reachable.
func checkBreakersReachable(set *descriptors.Set, routes, clusters []string) error {
	var errs []error
	for _, r := range set.Rules() {
		if r.Breaker == nil || len(r.Path) == 0 {
			continue
		}
		last := r.Path[len(r.Path)-1]
		var known []string
		switch last.Key {
		case "route":
			known = routes
		case "destination_cluster":
			known = clusters
		default:
			continue
		}
		if last.Value != "" && !strings.Contains(last.Value, "*") && !slices.Contains(known, last.Value) {
			errs = append(errs, fmt.Errorf("%s:%d: breaker on %s=%q, which the Envoy config does not have (known: %v)", r.File, r.Line, last.Key, last.Value, known))
		}
	}
	return errors.Join(errs...)
}

// checkExtProc reports ext_proc filters that would not give Leapgate what
// the breakers need: observability mode, request and response headers, and
// the route and cluster attributes; and, with token, feeds (ext_proc, the
// gRPC access log) that do not send a FEED_TOKEN. With breakers (rules
// that have one) a config without ext_proc is an error too: they would get
// no timings.
func checkExtProc(f *envoyFacts, breakers, token bool) error {
	var errs []error
	if len(f.ExtProcs) == 0 && breakers {
		errs = append(errs, errors.New("no ext_proc filter: the breakers would get no timings"))
	}
	for _, ep := range f.ExtProcs {
		if !ep.GetObservabilityMode() {
			errs = append(errs, errors.New("ext_proc is not in observability_mode: it would add latency to every request"))
		}
		if !ep.GetFailureModeAllow() {
			errs = append(errs, errors.New("ext_proc has failure_mode_allow false: traffic would fail when Leapgate is down"))
		}
		pm := ep.GetProcessingMode()
		if pm.GetRequestHeaderMode() == extprocv3.ProcessingMode_SKIP || pm.GetResponseHeaderMode() == extprocv3.ProcessingMode_SKIP {
			errs = append(errs, errors.New("ext_proc skips request or response headers: no timings"))
		}
		for _, attr := range []string{"xds.route_name", "xds.cluster_name"} {
			if !slices.Contains(ep.GetRequestAttributes(), attr) {
				errs = append(errs, fmt.Errorf("ext_proc does not request attribute %s", attr))
			}
		}
		if token && feedToken(ep.GetGrpcService()) == "" {
			errs = append(errs, errors.New("ext_proc sends no \"authorization: Bearer <FEED_TOKEN>\" initial_metadata: Leapgate refuses breaker feeds from another host without it"))
		}
	}
	for _, al := range f.AccessLogs {
		if token && feedToken(al.GetCommonConfig().GetGrpcService()) == "" {
			errs = append(errs, errors.New("the gRPC access log sends no \"authorization: Bearer <FEED_TOKEN>\" initial_metadata: Leapgate refuses breaker feeds from another host without it"))
		}
	}
	return errors.Join(errs...)
}

// feedToken returns the FEED_TOKEN a gRPC service sends Leapgate, the
// token of its "authorization: Bearer <token>" initial_metadata, or "".
func feedToken(gs *corev3.GrpcService) string {
	for _, kv := range gs.GetInitialMetadata() {
		scheme, token, ok := strings.Cut(kv.GetValue(), " ")
		if strings.EqualFold(kv.GetKey(), "authorization") && ok && strings.EqualFold(scheme, "Bearer") && token != "" {
			return token
		}
	}
	return ""
}

// checkBootstrap is the whole offline validation of an Envoy bootstrap and
// its rules: schema, PGV inside Anys, cluster references, rule coverage.
func checkBootstrap(data []byte, set *descriptors.Set) (*envoyFacts, error) {
	var bs bootstrapv3.Bootstrap
	if err := parseYAML(data, &bs); err != nil {
		return nil, err
	}
	f, err := collectFacts(&bs)
	if err != nil {
		return f, err
	}
	var errs []error
	errs = append(errs, checkClusterRefs(f), checkExtProc(f, hasBreakers(set), true))
	var routeNames []string
	for _, r := range f.Routes {
		if r.GetName() == "" {
			errs = append(errs, fmt.Errorf("route %v has no name: xds.route_name would be empty", r.GetMatch()))
		}
		routeNames = append(routeNames, r.GetName())
	}
	for _, h := range f.HCMs {
		for _, r := range f.Routes {
			for _, rl := range r.GetRoute().GetRateLimits() {
				for _, a := range rl.GetActions() {
					if a.GetRemoteAddress() != nil && !h.GetUseRemoteAddress().GetValue() && h.GetXffNumTrustedHops() == 0 {
						errs = append(errs, fmt.Errorf("route %q uses remote_address but the HCM neither uses the remote address nor trusts XFF hops", r.GetName()))
					}
				}
			}
		}
	}
	rds, err := routeDescriptors(f, nil)
	errs = append(errs, err, checkRules(set, f, rds))
	errs = append(errs, checkBreakersReachable(set, routeNames, slices.Collect(maps.Keys(f.Clusters))))
	return f, errors.Join(errs...)
}
