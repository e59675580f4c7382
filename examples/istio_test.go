package examples

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"sigs.k8s.io/yaml"

	"github.com/leapgate/leapgate/descriptors"
)

const istioDir = "istio"

// k8sObject is a parsed Kubernetes manifest document.
type k8sObject struct {
	File     string
	Kind     string
	Name     string
	NS       string
	Raw      map[string]any
	Spec     map[string]any
	Data     map[string]any
	metadata map[string]any
}

// loadManifests parses every document of every *.yaml file in files.
func loadManifests(files map[string][]byte) ([]k8sObject, error) {
	var out []k8sObject
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range files {
			if !yield(n) {
				return
			}
		}
	})
	for _, name := range names {
		for i, doc := range bytes.Split(files[name], []byte("\n---")) {
			var raw map[string]any
			if err := yaml.Unmarshal(doc, &raw); err != nil {
				return nil, fmt.Errorf("%s document %d: %w", name, i+1, err)
			}
			if raw == nil {
				continue
			}
			md, _ := raw["metadata"].(map[string]any)
			o := k8sObject{File: name, Raw: raw, metadata: md}
			o.Kind, _ = raw["kind"].(string)
			o.Name, _ = md["name"].(string)
			o.NS, _ = md["namespace"].(string)
			o.Spec, _ = raw["spec"].(map[string]any)
			o.Data, _ = raw["data"].(map[string]any)
			if o.Kind == "" || o.Name == "" {
				return nil, fmt.Errorf("%s document %d: no kind or metadata.name", name, i+1)
			}
			out = append(out, o)
		}
	}
	return out, nil
}

func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	out := map[string][]byte{}
	for _, f := range files {
		out[filepath.Base(f)] = readAbs(t, f)
	}
	return out
}

// get walks nested maps and lists: get(m, "a", "b", 0, "c").
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v any) string { s, _ := v.(string); return s }

// svcPort is one port of a Service.
type svcPort struct {
	Name, AppProtocol string
	Port              int
}

// isGRPC reports whether Istio gives the port an HTTP/2 cluster.
func (p svcPort) isGRPC() bool {
	return strings.HasPrefix(p.Name, "grpc") || p.AppProtocol == "grpc" || p.AppProtocol == "http2"
}

// checkIstio validates the Istio example: EnvoyFilter patch values as the
// Envoy types they stand for (PGV inside Anys), cluster references against
// the Services, route actions against the VirtualService routes and the
// rules in the ConfigMap, the Deployment's wiring and the ALS provider.
func checkIstio(files map[string][]byte) error {
	_, err := istioExample(files)
	return err
}

// istioGateway is what the Istio example makes of the ingress gateway: its
// filters and routes (as envoyFacts), the rules, and the ALS provider.
type istioGateway struct {
	Facts      *envoyFacts
	RuleFiles  []descriptors.File
	Rules      *descriptors.Set
	ALSLogName string
}

// istioExample checks the Istio example (see checkIstio) and returns the
// gateway it configures; the gateway is nil when the example does not load.
func istioExample(files map[string][]byte) (*istioGateway, error) {
	objs, err := loadManifests(files)
	if err != nil {
		return nil, err
	}
	gw := &istioGateway{}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	services := map[string][]svcPort{} // by FQDN
	var vsRoutes []string
	routeCluster := map[string]string{}
	var vsClusters []string
	var ruleFiles []descriptors.File
	configMaps := map[string]bool{}
	for _, o := range objs {
		switch o.Kind {
		case "Service":
			var ports []svcPort
			for _, p := range get(o.Spec, "ports").([]any) {
				port, _ := get(p, "port").(float64)
				ports = append(ports, svcPort{Name: str(get(p, "name")), AppProtocol: str(get(p, "appProtocol")), Port: int(port)})
			}
			services[o.Name+"."+o.NS+".svc.cluster.local"] = ports
		case "VirtualService":
			http, _ := get(o.Spec, "http").([]any)
			for _, h := range http {
				name := str(get(h, "name"))
				if name == "" {
					fail("%s: VirtualService %s has an unnamed http route: xds.route_name would be Istio's default", o.File, o.Name)
				}
				host := str(get(h, "route", 0, "destination", "host"))
				port, _ := get(h, "route", 0, "destination", "port", "number").(float64)
				cluster := fmt.Sprintf("outbound|%d||%s", int(port), host)
				vsRoutes = append(vsRoutes, name)
				routeCluster[name] = cluster
				vsClusters = append(vsClusters, cluster)
			}
		case "ConfigMap":
			configMaps[o.Name] = true
			for k, v := range o.Data {
				if strings.HasSuffix(k, ".yaml") || strings.HasSuffix(k, ".yml") {
					ruleFiles = append(ruleFiles, descriptors.File{Name: o.File + ":" + o.Name + "/" + k, Data: []byte(str(v))})
				}
			}
		}
	}
	set, err := descriptors.Parse(ruleFiles, descriptors.Options{})
	if err != nil {
		return nil, fmt.Errorf("rules in the ConfigMap: %w", err)
	}

	// EnvoyFilter patches, decoded as Envoy protos.
	f := &envoyFacts{}
	routeRateLimits := map[string][]*routev3.RateLimit{}
	for _, o := range objs {
		if o.Kind != "EnvoyFilter" {
			continue
		}
		patches, _ := get(o.Spec, "configPatches").([]any)
		for i, p := range patches {
			where := fmt.Sprintf("%s: EnvoyFilter %s patch %d", o.File, o.Name, i)
			value, err := json.Marshal(get(p, "patch", "value"))
			if err != nil {
				fail("%s: %v", where, err)
				continue
			}
			op := str(get(p, "patch", "operation"))
			switch applyTo := str(get(p, "applyTo")); applyTo {
			case "HTTP_FILTER":
				if op == "MERGE" || op == "REMOVE" {
					fail("%s: unexpected operation %s", where, op)
					continue
				}
				var hf hcmv3.HttpFilter
				if err := parseJSON(value, &hf); err != nil {
					fail("%s: %w", where, err)
					continue
				}
				ff, err := collectFacts(&hf)
				if err != nil {
					fail("%s: %w", where, err)
				}
				f.GRPCClusters = append(f.GRPCClusters, ff.GRPCClusters...)
				f.RateLimits = append(f.RateLimits, ff.RateLimits...)
				f.ExtProcs = append(f.ExtProcs, ff.ExtProcs...)
			case "HTTP_ROUTE":
				// A MERGE fragment: a partial Route, so parse only; its
				// rate_limits entries are whole messages and are validated.
				var r routev3.Route
				if err := parseJSON(value, &r); err != nil {
					fail("%s: %w", where, err)
					continue
				}
				name := str(get(p, "match", "routeConfiguration", "vhost", "route", "name"))
				if !slices.Contains(vsRoutes, name) {
					fail("%s: matches route %q, which no VirtualService names (routes: %v)", where, name, vsRoutes)
				}
				for _, rl := range r.GetRoute().GetRateLimits() {
					if err := validateDeep(rl, nil); err != nil {
						fail("%s: %w", where, err)
					}
				}
				routeRateLimits[name] = append(routeRateLimits[name], r.GetRoute().GetRateLimits()...)
			default:
				fail("%s: applyTo %s is not checked by this test", where, applyTo)
			}
		}
	}
	// Behind the sidecar every peer is loopback, and Istio's access-log
	// provider cannot send metadata: the mesh's AuthorizationPolicy, not
	// FEED_TOKEN, says who may feed (checked below).
	if err := checkExtProc(f, true, false); err != nil {
		errs = append(errs, err)
	}
	checkGRPC := func(what, host string, port int) {
		ports, ok := services[host]
		if !ok {
			fail("%s: no Service %s in the example", what, host)
			return
		}
		i := slices.IndexFunc(ports, func(p svcPort) bool { return p.Port == port })
		if i < 0 {
			fail("%s: Service %s has no port %d", what, host, port)
		} else if !ports[i].isGRPC() {
			fail("%s: Service %s port %d (%s) is not named grpc-... nor appProtocol grpc: Istio would not use HTTP/2", what, host, port, ports[i].Name)
		}
	}
	for _, c := range f.GRPCClusters {
		parts := strings.Split(c, "|")
		if len(parts) != 4 || parts[0] != "outbound" {
			fail("gRPC cluster %q is not an Istio outbound|port||host cluster", c)
			continue
		}
		port, _ := strconv.Atoi(parts[1])
		checkGRPC("gRPC cluster "+c, parts[3], port)
	}

	// Route descriptors against the rules: the gateway's routes are the
	// VirtualService's, with the actions the HTTP_ROUTE patches merge in.
	for _, name := range vsRoutes {
		f.Routes = append(f.Routes, &routev3.Route{Name: name, Action: &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: routeCluster[name]},
			RateLimits:       routeRateLimits[name],
		}}})
	}
	rds, err := routeDescriptors(f, nil)
	errs = append(errs, err, checkRules(set, f, rds), checkBreakersReachable(set, vsRoutes, vsClusters))

	// Deployment wiring, who may feed the breakers, and the ALS provider.
	if err := checkFeedPolicy(objs); err != nil {
		errs = append(errs, err)
	}
	for _, o := range objs {
		switch o.Kind {
		case "Deployment":
			if o.Name != "leapgate" {
				continue
			}
			c := get(o.Spec, "template", "spec", "containers", 0)
			envs := map[string]string{}
			for _, e := range get(c, "env").([]any) {
				envs[str(get(e, "name"))] = str(get(e, "value"))
			}
			rulesDir := path.Join(envs["RUNTIME_ROOT"], envs["RUNTIME_SUBDIRECTORY"], envs["RUNTIME_APPDIRECTORY"])
			var mounted string
			for _, m := range get(c, "volumeMounts").([]any) {
				if str(get(m, "mountPath")) == rulesDir {
					mounted = str(get(m, "name"))
				}
			}
			cm := ""
			for _, v := range get(o.Spec, "template", "spec", "volumes").([]any) {
				if str(get(v, "name")) == mounted {
					cm = str(get(v, "configMap", "name"))
				}
			}
			if !configMaps[cm] {
				fail("%s: Deployment mounts no rules ConfigMap at %s (RUNTIME_* settings)", o.File, rulesDir)
			}
			httpPort, _ := strconv.Atoi(envs["PORT"])
			if p, _ := get(c, "readinessProbe", "httpGet", "port").(float64); int(p) != httpPort || str(get(c, "readinessProbe", "httpGet", "path")) != "/healthcheck" {
				fail("%s: readinessProbe must GET /healthcheck on PORT %d", o.File, httpPort)
			}
			grpcPort, _ := strconv.Atoi(envs["GRPC_PORT"])
			if p, _ := get(c, "livenessProbe", "grpc", "port").(float64); int(p) != grpcPort {
				fail("%s: livenessProbe must use gRPC health on GRPC_PORT %d", o.File, grpcPort)
			}
			checkGRPC("Deployment GRPC_PORT", o.Name+"."+o.NS+".svc.cluster.local", grpcPort)
			if envs["BACKEND_TYPE"] == "redis" {
				host, port, err := net.SplitHostPort(envs["REDIS_URL"])
				p, _ := strconv.Atoi(port)
				if err != nil || !slices.ContainsFunc(services[host], func(sp svcPort) bool { return sp.Port == p }) {
					fail("%s: REDIS_URL %q is no Service of the example", o.File, envs["REDIS_URL"])
				}
			}
		case "IstioOperator":
			providers, _ := get(o.Spec, "meshConfig", "extensionProviders").([]any)
			for _, pr := range providers {
				als := get(pr, "envoyHttpAls")
				if als == nil {
					continue
				}
				port, _ := get(als, "port").(float64)
				gw.ALSLogName = str(get(als, "logName"))
				checkGRPC("envoyHttpAls provider "+str(get(pr, "name")), str(get(als, "service")), int(port))
				used := false
				for _, t := range objs {
					if t.Kind == "Telemetry" && str(get(t.Spec, "accessLogging", 0, "providers", 0, "name")) == str(get(pr, "name")) {
						used = true
					}
				}
				if !used {
					fail("%s: no Telemetry uses the provider %s", o.File, str(get(pr, "name")))
				}
			}
		}
	}
	gw.Facts, gw.RuleFiles, gw.Rules = f, ruleFiles, set
	return gw, errors.Join(errs...)
}

func TestIstioExample(t *testing.T) {
	files := readDir(t, istioDir)
	if err := checkIstio(files); err != nil {
		t.Fatal(err)
	}
	objs, _ := loadManifests(files)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.Kind]++
	}
	for _, k := range []string{"ConfigMap", "Deployment", "Service", "EnvoyFilter", "VirtualService", "Telemetry", "IstioOperator"} {
		if kinds[k] == 0 {
			t.Errorf("the Istio example has no %s", k)
		}
	}
}

// TestIstioValidatorCatchesBreakage mutates the real Istio example and
// checks each breakage is reported.
func TestIstioValidatorCatchesBreakage(t *testing.T) {
	good := readDir(t, istioDir)
	tests := []struct {
		name, file, old, new, wantError string
		count                           int // occurrences of old to replace (-1: all); anchors must match exactly this many
	}{
		{name: "typo in a MERGE fragment", file: "envoyfilter.yaml", old: "generic_key: {descriptor_value: checkout}", new: "generic_kye: {descriptor_value: checkout}", wantError: `unknown field "generic_kye"`, count: 1},
		{name: "empty actions in a MERGE fragment", file: "envoyfilter.yaml", old: "          - stage: 1\n            actions:\n            - generic_key: {descriptor_key: route, descriptor_value: checkout}", new: "          - stage: 1\n            actions: []", wantError: "Actions", count: 1},
		{name: "stage out of range inside the filter's Any", file: "envoyfilter.yaml", old: "stage: 1\n          timeout", new: "stage: 11\n          timeout", wantError: "Stage", count: 1},
		{name: "filter to the HTTP port", file: "envoyfilter.yaml", old: "outbound|8081||", new: "outbound|8080||", wantError: "not named grpc-", count: -1},
		{name: "filter to an unknown Service", file: "envoyfilter.yaml", old: "||leapgate.leapgate.svc", new: "||ratelimit.leapgate.svc", wantError: "no Service ratelimit.leapgate", count: -1},
		{name: "grpc port renamed", file: "leapgate.yaml", old: "name: grpc-leapgate, port: 8081, targetPort: 8081, appProtocol: grpc", new: "name: tcp-leapgate, port: 8081, targetPort: 8081", wantError: "not named grpc-", count: 1},
		{name: "route actions on a route no VirtualService names", file: "virtualservice.yaml", old: "- name: checkout", new: "- name: pay", wantError: `matches route "checkout"`, count: 1},
		{name: "descriptor without rule", file: "leapgate.yaml", old: "- key: user ", new: "- key: customer ", wantError: "matches no rule", count: 1},
		{name: "rules not mounted where RUNTIME_* look", file: "leapgate.yaml", old: "mountPath: /data/ratelimit/config", new: "mountPath: /etc/rules", wantError: "mounts no rules ConfigMap", count: 1},
		{name: "ALS provider on the HTTP port", file: "als.yaml", old: "port: 8081", new: "port: 8080", wantError: "envoyHttpAls provider leapgate-als", count: 1},
		{name: "ALS provider not used", file: "als.yaml", old: "  - providers:\n    - name: leapgate-als", new: "  - providers:\n    - name: other", wantError: "no Telemetry uses", count: 1},
		{name: "readiness probe on the wrong port", file: "leapgate.yaml", old: "httpGet: {path: /healthcheck, port: 8080}", new: "httpGet: {path: /healthcheck, port: 8081}", wantError: "readinessProbe", count: 1},
		{name: "ext_proc without route attribute", file: "envoyfilter.yaml", old: "request_attributes: [xds.route_name, xds.cluster_name]", new: "request_attributes: [xds.cluster_name]", wantError: "xds.route_name", count: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string][]byte{}
			for k, v := range good {
				files[k] = v
			}
			src := string(good[tt.file])
			if n := strings.Count(src, tt.old); (tt.count >= 0 && n != tt.count) || n == 0 {
				t.Fatalf("anchor %q found %d times in %s; fix the test", tt.old, n, tt.file)
			}
			files[tt.file] = []byte(strings.Replace(src, tt.old, tt.new, tt.count))
			err := checkIstio(files)
			if err == nil || !strings.Contains(err.Error(), tt.wantError) {
				t.Fatalf("error = %v; want one containing %q", err, tt.wantError)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(istioDir, "envoyfilter.yaml")); err != nil {
		t.Fatal(err)
	}
}

// feedPaths are the gRPC paths of the services that feed the breakers.
var feedPaths = []string{"/envoy.service.accesslog.v3.AccessLogService/*", "/envoy.service.ext_proc.v3.ExternalProcessor/*"}

// checkFeedPolicy requires, when Leapgate runs without FEED_TOKEN behind
// the sidecar (where every peer is loopback), an AuthorizationPolicy on
// its pods that denies both feed services to every principal but the
// ingress gateway's, and leaves the rate-limit service alone.
func checkFeedPolicy(objs []k8sObject) error {
	for _, o := range objs {
		if o.Kind != "AuthorizationPolicy" || str(get(o.Spec, "selector", "matchLabels", "app")) != "leapgate" || str(get(o.Spec, "action")) != "DENY" {
			continue
		}
		rules, _ := get(o.Spec, "rules").([]any)
		for _, r := range rules {
			var not []string
			principals, _ := get(r, "from", 0, "source", "notPrincipals").([]any)
			for _, p := range principals {
				not = append(not, str(p))
			}
			var paths []string
			ops, _ := get(r, "to", 0, "operation", "paths").([]any)
			for _, p := range ops {
				paths = append(paths, str(p))
			}
			slices.Sort(paths)
			if len(not) == 1 && strings.HasSuffix(not[0], "/sa/istio-ingressgateway-service-account") && slices.Equal(paths, feedPaths) {
				return nil
			}
		}
	}
	return fmt.Errorf("no AuthorizationPolicy on app=leapgate denies %v to every principal but the ingress gateway's: any workload could open breakers", feedPaths)
}
