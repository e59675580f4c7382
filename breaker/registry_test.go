package breaker

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/ruletest"

	"github.com/leapgate/leapgate/internal/testclock"
)

const rulesYAML = `
domain: breaker
descriptors:
  - key: destination_cluster
    value: orders
    circuit_breaker:
      strategy: error_ratio
      threshold: 0.5
      min_requests: 2
      open_duration: 5s
  - key: destination_cluster
    value: payments
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: destination_cluster
    circuit_breaker:
      strategy: error_count
      threshold: 2
      open_duration: 5s
  - key: route
    value: checkout
    descriptors:
      - key: destination_cluster
        value: backend
        circuit_breaker:
          strategy: slow_request_ratio
          threshold: 0.5
          max_response_time: 100ms
          min_requests: 2
          open_duration: 5s
  - key: user
    value: "vip*"
    circuit_breaker:
      strategy: error_count
      threshold: 1
`

func parseSet(t testing.TB, yaml string) *descriptors.Set {
	t.Helper()
	return ruletest.Parse(t, descriptors.Options{}, yaml)
}

func newTestRegistry(t testing.TB, yaml string, opts Options) (*Registry, *testclock.Clock, *descriptors.Set) {
	t.Helper()
	clock := &testclock.Clock{}
	clock.Set(time.Hour)
	opts.Clock = clock
	r, err := NewRegistry(opts)
	if err != nil {
		t.Fatal(err)
	}
	set := parseSet(t, yaml)
	if err := r.SetRules(set); err != nil {
		t.Fatalf("SetRules: %v", err)
	}
	return r, clock, set
}

func entries(kv ...string) []descriptors.Entry {
	var out []descriptors.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, descriptors.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// allow asks the registry as ShouldRateLimit does: Match, then Allow.
func allow(t *testing.T, r *Registry, set *descriptors.Set, kv ...string) (bool, time.Duration) {
	t.Helper()
	es := entries(kv...)
	rule := set.Match("breaker", es)
	if rule == nil || rule.Breaker == nil {
		return true, 0
	}
	return r.Allow(rule, es)
}

func TestObservationMapping(t *testing.T) {
	headers := []HeaderKey{{Header: "x-user-id", Key: "user"}}
	tests := []struct {
		name string
		obs  Observation
		want []string // rule IDs fed
	}{
		{"exact cluster shadows value-less", Observation{Cluster: "orders"}, []string{"breaker.destination_cluster_orders"}},
		{"value-less cluster", Observation{Cluster: "inventory"}, []string{"breaker.destination_cluster"}},
		{"sibling without breaker shadows value-less", Observation{Cluster: "payments"}, nil},
		{"route and cluster", Observation{Route: "checkout", Cluster: "backend"},
			[]string{"breaker.destination_cluster", "breaker.route_checkout.destination_cluster_backend"}},
		{"route alone", Observation{Route: "checkout"}, nil},
		{"other route", Observation{Route: "browse", Cluster: "backend"}, []string{"breaker.destination_cluster"}},
		{"header wildcard", Observation{Headers: entries("x-user-id", "vip-7")}, []string{"breaker.user_vip*"}},
		{"header not matching", Observation{Headers: entries("x-user-id", "bob")}, nil},
		{"unconfigured header", Observation{Headers: entries("user", "vip-7")}, nil},
	}
	r, _, _ := newTestRegistry(t, rulesYAML, Options{Mapping: Mapping{Headers: headers}})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, tg := range r.Targets(nil, &tt.obs) {
				got = append(got, tg.RuleID())
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("targets = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestCustomMappingKeys(t *testing.T) {
	r, _, set := newTestRegistry(t, `
domain: d
descriptors:
  - key: upstream
    value: a
    circuit_breaker: {strategy: error_count, threshold: 1}
`, Options{Mapping: Mapping{ClusterKey: "upstream"}})
	r.Observe(Observation{Cluster: "a", Status: 500})
	es := entries("upstream", "a")
	if ok, _ := r.Allow(set.Match("d", es), es); ok {
		t.Error("breaker keyed by a custom cluster key did not open")
	}
}

func TestRegistryEnforcesAndRecovers(t *testing.T) {
	r, clock, set := newTestRegistry(t, rulesYAML, Options{})
	// Envoy's descriptor for the stage-1 action pair: route, then cluster.
	desc := []string{"route", "checkout", "destination_cluster", "backend"}
	if ok, _ := allow(t, r, set, desc...); !ok {
		t.Fatal("fresh breaker refused")
	}
	r.Observe(Observation{Route: "checkout", Cluster: "backend", ResponseTime: 300 * ms, Status: 200})
	r.Observe(Observation{Route: "checkout", Cluster: "backend", ResponseTime: 300 * ms, Status: 200})
	ok, wait := allow(t, r, set, desc...)
	if ok || wait != 5*s {
		t.Fatalf("after 2 slow: Allow = %v, %v; want false, 5s", ok, wait)
	}
	clock.Advance(5 * s)
	if ok, _ := allow(t, r, set, desc...); !ok {
		t.Fatal("half-open probe refused")
	}
	if ok, _ := allow(t, r, set, desc...); ok {
		t.Fatal("second request admitted with one probe slot")
	}
	r.Observe(Observation{Route: "checkout", Cluster: "backend", ResponseTime: 20 * ms, Status: 200, Source: SourceALS})
	if ok, _ := allow(t, r, set, desc...); !ok {
		t.Fatal("not closed after the probe succeeded")
	}
}

func TestDistinctValueBreakers(t *testing.T) {
	r, _, set := newTestRegistry(t, rulesYAML, Options{})
	for range 2 {
		r.Observe(Observation{Cluster: "inventory", Status: 503})
	}
	if ok, _ := allow(t, r, set, "destination_cluster", "inventory"); ok {
		t.Error("inventory breaker did not open after 2 errors")
	}
	if ok, _ := allow(t, r, set, "destination_cluster", "search"); !ok {
		t.Error("search shares inventory's breaker")
	}
	r.Observe(Observation{Cluster: "search", Status: 503})
	if ok, _ := allow(t, r, set, "destination_cluster", "search"); !ok {
		t.Error("search opened after one error")
	}
	snap := r.Snapshot()
	var resources []string
	for _, b := range snap {
		if b.Rule == "breaker.destination_cluster" {
			resources = append(resources, b.Resource+":"+b.State.String())
		}
	}
	if got := strings.Join(resources, " "); got != "destination_cluster=inventory:open destination_cluster=search:closed" {
		t.Errorf("snapshot resources = %q", got)
	}
}

// clusterProbes returns, for the breakers of r on destination_cluster:
// errorsFrom, which observes n 5xx answers of a cluster, and isOpen, which
// reports whether a request to it is refused.
func clusterProbes(t *testing.T, r *Registry, set *descriptors.Set) (errorsFrom func(cluster string, n int), isOpen func(cluster string) bool) {
	errorsFrom = func(cluster string, n int) {
		for range n {
			r.Observe(Observation{Cluster: cluster, Status: 500})
		}
	}
	isOpen = func(cluster string) bool {
		ok, _ := allow(t, r, set, "destination_cluster", cluster)
		return !ok
	}
	return errorsFrom, isOpen
}

// At the cap, a new value takes the slot of the least recently observed
// closed breaker, so junk values seen once cannot squat the slots and keep a
// real upstream from ever opening; only when every breaker is open or
// half-open is the new value dropped.
func TestMaxBreakersPerRule(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, clock, set := newTestRegistry(t, rulesYAML, Options{MaxBreakersPerRule: 2, Metrics: reg})
	const rule = "breaker.destination_cluster"
	errorsFrom, isOpen := clusterProbes(t, r, set)
	errorsFrom("junk-1", 1)
	clock.Advance(s)
	errorsFrom("junk-2", 1)
	clock.Advance(s)
	// The cap is full of junk; a real upstream still gets a breaker, in
	// the slot of junk-1 (the idlest), and opens.
	errorsFrom("inventory", 2)
	if !isOpen("inventory") {
		t.Fatal("inventory did not open: junk squats the breaker slots")
	}
	if got := testutil.ToFloat64(r.metrics.reclaimed.WithLabelValues(rule)); got != 1 {
		t.Errorf("reclaimed = %v, want 1", got)
	}
	clock.Advance(s)
	errorsFrom("junk-3", 1) // takes junk-2's slot: the open breaker stays
	if !isOpen("inventory") {
		t.Error("an open breaker was reclaimed")
	}
	errorsFrom("junk-3", 1) // junk-3 opens too: both breakers open
	errorsFrom("junk-4", 1) // no closed breaker to reclaim: dropped
	if got := testutil.ToFloat64(r.metrics.dropped.WithLabelValues(rule)); got != 1 {
		t.Errorf("dropped = %v, want 1", got)
	}
	if got := resourcesOf(r, rule); got != "destination_cluster=inventory destination_cluster=junk-3" {
		t.Errorf("breakers of %s: %q", rule, got)
	}
	// Per-value breakers have no state series without detailed_metric:
	// only the 2 single breakers of exact rules are exported.
	if got := testutil.CollectAndCount(r.metrics.state); got != 2 {
		t.Errorf("state series = %d, want 2", got)
	}
}

// At the cap with every breaker open, forged values that nobody sends any
// more do not hold their slots for good: once a breaker has had no
// observation for its longest open period and a probe timeout (which a
// live upstream's would have had: its probe's outcome), a new value takes
// its slot. A breaker observed within that time keeps its slot.
func TestAbandonedOpenBreakersAreReclaimed(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, clock, set := newTestRegistry(t, rulesYAML, Options{MaxBreakersPerRule: 2, Metrics: reg})
	const rule = "breaker.destination_cluster"
	errorsFrom, isOpen := clusterProbes(t, r, set)
	errorsFrom("junk-1", 2)
	errorsFrom("junk-2", 2)
	errorsFrom("inventory", 2)
	if isOpen("inventory") || testutil.ToFloat64(r.metrics.dropped.WithLabelValues(rule)) != 2 {
		t.Fatal("with every slot open and freshly observed, a new value was not dropped")
	}
	// open_duration 5s, probe_timeout 5s: 10s without an observation is
	// abandonment. junk-2 is observed again just before.
	clock.Advance(9 * s)
	errorsFrom("junk-2", 1)
	clock.Advance(1 * s) // junk-1 unobserved exactly 10s: not yet abandoned
	errorsFrom("inventory", 2)
	if isOpen("inventory") {
		t.Fatal("a breaker unobserved for exactly its open period and probe timeout was reclaimed")
	}
	clock.Advance(1)
	errorsFrom("inventory", 2)
	if !isOpen("inventory") {
		t.Fatal("inventory did not get a slot: abandoned open breakers squat them")
	}
	if got := resourcesOf(r, rule); got != "destination_cluster=inventory destination_cluster=junk-2" {
		t.Errorf("breakers of %s: %q, want junk-1's slot reclaimed and junk-2's (observed 1s ago) kept", rule, got)
	}
	if got := testutil.ToFloat64(r.metrics.reclaimed.WithLabelValues(rule)); got != 1 {
		t.Errorf("reclaimed = %v, want 1", got)
	}
}

// With detailed_metric, per-value breakers export state series, at most
// MaxStateSeriesPerRule, with values shown as in metric keys; a reclaimed
// breaker's series goes with it.
func TestDetailedBreakerSeries(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: destination_cluster
    detailed_metric: true
    circuit_breaker: {strategy: error_count, threshold: 1}
`
	reg := prometheus.NewRegistry()
	r, clock, _ := newTestRegistry(t, yaml, Options{MaxBreakersPerRule: 2, MaxStateSeriesPerRule: 2, Metrics: reg})
	long := strings.Repeat("x", descriptors.LongValue+1)
	for _, c := range []string{"a\xff", long, "b"} {
		r.Observe(Observation{Cluster: c, Status: 200})
		clock.Advance(s)
	}
	// The first value's series went with its breaker; the others show
	// their values as metric keys do.
	want := fmt.Sprintf(`
# HELP leapgate_breaker_state State of each circuit breaker: 0 closed, 1 open, 2 half-open (resource: empty for a rule with one breaker; the distinct values of a value-less or wildcard rule only with detailed_metric, capped per rule).
# TYPE leapgate_breaker_state gauge
leapgate_breaker_state{resource="destination_cluster=%s",rule="d.destination_cluster"} 0
leapgate_breaker_state{resource="destination_cluster=b",rule="d.destination_cluster"} 0
`, descriptors.MetricValue(long))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "leapgate_breaker_state"); err != nil {
		t.Error(err)
	}
	if descriptors.MetricValue("a\xff") != "a\uFFFD" {
		t.Error("invalid UTF-8 is not shown as U+FFFD")
	}
}

func TestSetRulesKeepsUnchangedState(t *testing.T) {
	r, clock, set := newTestRegistry(t, rulesYAML, Options{})
	r.Observe(Observation{Cluster: "orders", Status: 500})
	r.Observe(Observation{Cluster: "orders", Status: 500})
	r.Observe(Observation{Cluster: "inventory", Status: 500})
	r.Observe(Observation{Cluster: "inventory", Status: 500})
	if ok, _ := allow(t, r, set, "destination_cluster", "orders"); ok {
		t.Fatal("orders not open")
	}
	// Reload: orders unchanged, the value-less rule's threshold changed.
	changed := strings.Replace(rulesYAML, "threshold: 2", "threshold: 3", 1)
	set2 := parseSet(t, changed)
	if err := r.SetRules(set2); err != nil {
		t.Fatal(err)
	}
	if ok, _ := allow(t, r, set2, "destination_cluster", "orders"); ok {
		t.Error("unchanged rule lost its open state on reload")
	}
	if ok, _ := allow(t, r, set2, "destination_cluster", "inventory"); !ok {
		t.Error("changed rule kept its old state")
	}
	// The old set's rule pointers still resolve (requests in flight).
	if ok, _ := allow(t, r, set, "destination_cluster", "orders"); ok {
		t.Error("old rule pointer lost its breaker")
	}
	// A rule removed from the set no longer refuses.
	set3 := parseSet(t, "domain: breaker\ndescriptors:\n  - key: x\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	if err := r.SetRules(set3); err != nil {
		t.Fatal(err)
	}
	if ok, _ := allow(t, r, set, "destination_cluster", "orders"); !ok {
		t.Error("removed rule still refuses")
	}
	clock.Advance(time.Minute)
	if len(r.Snapshot()) != 0 {
		t.Errorf("snapshot after removal = %+v", r.Snapshot())
	}
}

func TestAllowWithoutBreaker(t *testing.T) {
	r, _, set := newTestRegistry(t, rulesYAML, Options{})
	es := entries("destination_cluster", "payments")
	if ok, wait := r.Allow(set.Match("breaker", es), es); !ok || wait != 0 {
		t.Errorf("rule without breaker: %v, %v", ok, wait)
	}
	if ok, _ := r.Allow(&descriptors.Rule{ID: "nope"}, nil); !ok {
		t.Error("unknown rule refused")
	}
}

func TestAllowTargetsTakesNoProbeWhenAnotherIsOpen(t *testing.T) {
	r, clock, _ := newTestRegistry(t, rulesYAML, Options{})
	obs := Observation{Route: "checkout", Cluster: "backend", ResponseTime: time.Second, Status: 500}
	ts := r.Targets(nil, &obs)
	if len(ts) != 2 {
		t.Fatalf("targets = %d", len(ts))
	}
	r.ObserveTargets(ts, obs)
	r.ObserveTargets(ts, obs) // both open (slow ratio and error count)
	clock.Advance(5 * s)
	// The cluster breaker's probe fails: open again for 5s...
	if ok, _ := ts[0].Breaker().AllowAt(clock.Now()); !ok {
		t.Fatal("no probe")
	}
	ts[0].Breaker().ObserveAt(clock.Now(), Outcome{Aborted: true})
	// ...while the route breaker is half-open: no probe is taken from it.
	if st := ts[1].Breaker().AdvanceAt(clock.Now()); st != HalfOpen {
		t.Fatalf("route breaker %v", st)
	}
	ok, wait, _ := r.AllowTargets(ts)
	if ok {
		t.Fatal("allowed while one breaker is open")
	}
	if want := ts[0].Breaker().StatsAt(clock.Now()).RetryAfter; wait != want || wait <= 0 {
		t.Errorf("retry after %v, want the open breaker's %v", wait, want)
	}
	if st := ts[1].Breaker().StatsAt(clock.Now()); st.ProbesAdmitted != 0 {
		t.Errorf("half-open breaker gave a probe for a refused request: %+v", st)
	}
	// Once the open one is half-open too, the request is a probe of both.
	clock.Advance(wait)
	ok, wait, probes := r.AllowTargets(ts)
	if !ok || wait != 0 || len(probes) != 2 {
		t.Fatalf("both half-open: allowed %v, retry after %v, probes %v; want allowed, 0, a probe of each", ok, wait, probes)
	}
}

func TestMetricsAndLog(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs strings.Builder
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	r, clock, set := newTestRegistry(t, rulesYAML, Options{Metrics: reg, Logger: logger})
	for range 2 {
		r.Observe(Observation{Cluster: "orders", Status: 500, ResponseTime: 30 * ms, Source: SourceALS})
	}
	r.Observe(Observation{Cluster: "orders", Aborted: true, Source: SourceExtProc})
	if got := testutil.ToFloat64(r.metrics.state.WithLabelValues("breaker.destination_cluster_orders", "")); got != 1 {
		t.Errorf("state gauge = %v, want 1 (open)", got)
	}
	clock.Advance(5 * s)
	// No request since: a scrape still shows the breaker half-open.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP leapgate_breaker_state State of each circuit breaker: 0 closed, 1 open, 2 half-open (resource: empty for a rule with one breaker; the distinct values of a value-less or wildcard rule only with detailed_metric, capped per rule).
# TYPE leapgate_breaker_state gauge
leapgate_breaker_state{resource="",rule="breaker.destination_cluster_orders"} 2
leapgate_breaker_state{resource="",rule="breaker.route_checkout.destination_cluster_backend"} 0
`), "leapgate_breaker_state"); err != nil {
		t.Error(err)
	}
	allow(t, r, set, "destination_cluster", "orders")
	if got := testutil.ToFloat64(r.metrics.state.WithLabelValues("breaker.destination_cluster_orders", "")); got != 2 {
		t.Errorf("state gauge = %v, want 2 (half-open)", got)
	}
	if got := testutil.ToFloat64(r.metrics.transitions.WithLabelValues("breaker.destination_cluster_orders", "closed", "open")); got != 1 {
		t.Errorf("closed->open transitions = %v", got)
	}
	if got := testutil.ToFloat64(r.metrics.observations.WithLabelValues(SourceALS)); got != 2 {
		t.Errorf("als observations = %v", got)
	}
	if got := testutil.CollectAndCount(r.metrics.responseTime); got != 4 { // one per breaker rule
		t.Errorf("histogram series = %d", got)
	}
	if n := strings.Count(logs.String(), "circuit breaker state change"); n != 2 {
		t.Errorf("logged %d transitions, want 2:\n%s", n, logs.String())
	}
	if _, err := NewRegistry(Options{Metrics: reg}); err == nil {
		t.Error("registering twice on one prometheus registry did not fail")
	}
}

func TestHandler(t *testing.T) {
	r, _, _ := newTestRegistry(t, rulesYAML, Options{})
	r.Observe(Observation{Cluster: "orders", Status: 500})
	r.Observe(Observation{Cluster: "orders", Status: 500})
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/breakers", nil))
	var body struct {
		Breakers []map[string]any `json:"breakers"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %s: %v", rec.Body, err)
	}
	var orders map[string]any
	for _, b := range body.Breakers {
		if b["rule"] == "breaker.destination_cluster_orders" {
			orders = b
		}
	}
	if orders["state"] != "open" || orders["failed"] != 2.0 || orders["total"] != 2.0 || orders["retry_in"] != "5s" || orders["strategy"] != "error_ratio" {
		t.Errorf("orders = %v", orders)
	}
	rec = httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/breakers", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", rec.Code)
	}
}

func TestParseHeaderKeys(t *testing.T) {
	got, err := ParseHeaderKeys(" X-User-ID=user, x-tenant ,")
	if err != nil || len(got) != 2 || got[0] != (HeaderKey{"x-user-id", "user"}) || got[1] != (HeaderKey{"x-tenant", "x-tenant"}) {
		t.Errorf("ParseHeaderKeys = %v, %v", got, err)
	}
	if _, err := ParseHeaderKeys("=user"); err == nil {
		t.Error("empty header accepted")
	}
}

func TestMatchValue(t *testing.T) {
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"", "x", true}, {"a", "a", true}, {"a", "b", false}, {"a*", "abc", true}, {"a*", "ba", false},
		{"*c", "abc", true}, {"a*c", "ac", true}, {"a*b*c", "axbyc", true}, {"a*b*c", "acb", false},
		{"ab*ba", "aba", false}, {"*", "", true},
		// a middle part found at once, and a star right after a star
		{"a*b*c", "abc", true}, {"a**c", "abc", true}, {"a*bc*d", "axbcybd", true}, {"a*bc*d", "axbdc", false},
	}
	for _, tt := range tests {
		if got := matchValue(tt.pattern, tt.value); got != tt.want {
			t.Errorf("matchValue(%q, %q) = %v", tt.pattern, tt.value, got)
		}
	}
}

// TestConcurrentUse exercises Allow, Observe, Snapshot and SetRules
// together under the race detector.
func TestConcurrentUse(t *testing.T) {
	r, clock, set := newTestRegistry(t, rulesYAML, Options{Metrics: prometheus.NewRegistry()})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			es := entries("destination_cluster", "orders")
			rule := set.Match("breaker", es)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r.Allow(rule, es)
				r.Observe(Observation{Cluster: []string{"orders", "inventory", "x"}[i%3], Status: 200 + 300*(i%2), Source: SourceALS})
				if g == 0 && i%50 == 0 {
					clock.Advance(time.Second)
					r.Snapshot()
				}
			}
		}()
	}
	for range 20 {
		if err := r.SetRules(parseSet(t, rulesYAML)); err != nil {
			t.Error(err)
		}
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
}

// TestShareThresholdAppliesToItsLevelOnly: share_threshold on the leaf
// (route r-*) makes the routes share a breaker, but the parent level
// (destination_cluster svc-*) still varies: a 503 on svc-a must not open
// svc-b's breaker, as the two clusters' rate-limit counters are distinct too.
func TestShareThresholdAppliesToItsLevelOnly(t *testing.T) {
	r, _, set := newTestRegistry(t, `
domain: breaker
descriptors:
  - key: destination_cluster
    value: svc-*
    descriptors:
      - key: route
        value: r-*
        share_threshold: true
        circuit_breaker: {strategy: error_count, threshold: 1}
`, Options{})
	r.Observe(Observation{Cluster: "svc-a", Route: "r-1", Status: 503})
	if ok, _ := allow(t, r, set, "destination_cluster", "svc-a", "route", "r-2"); ok {
		t.Error("svc-a's breaker did not open (routes share it)")
	}
	if ok, _ := allow(t, r, set, "destination_cluster", "svc-b", "route", "r-1"); !ok {
		t.Error("a 503 on svc-a opened svc-b's breaker")
	}
}

// Manual overrides: forced open refuses, forced closed admits and ignores
// observations, disabled admits while observations still count; a resource
// override beats its rule's; overrides survive a reload and show in
// Snapshot and metrics; auto removes them.
func TestOverrides(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, clock, set := newTestRegistry(t, rulesYAML, Options{Metrics: reg})
	const orders, perCluster = "breaker.destination_cluster_orders", "breaker.destination_cluster"
	failOrders := func() {
		for range 2 {
			r.Observe(Observation{Cluster: "orders", Status: 500})
		}
	}

	r.SetOverride(orders, "", ForceOpen)
	if ok, wait := allow(t, r, set, "destination_cluster", "orders"); ok || wait != 5*s {
		t.Errorf("forced open: %v, %v; want refused with open_duration", ok, wait)
	}
	r.SetOverride(orders, "", ForceClosed)
	failOrders()
	if ok, _ := allow(t, r, set, "destination_cluster", "orders"); !ok {
		t.Error("forced closed refused")
	}
	r.SetOverride(orders, "", Auto)
	if ok, _ := allow(t, r, set, "destination_cluster", "orders"); !ok {
		t.Error("observations while forced closed opened the breaker")
	}
	r.SetOverride(orders, "", Disabled)
	failOrders()
	if ok, _ := allow(t, r, set, "destination_cluster", "orders"); !ok {
		t.Error("disabled breaker refused")
	}
	if st := snapshotOf(t, r, orders, ""); st.State != Open || st.Override != "disabled" {
		t.Errorf("disabled breaker: %+v, want open underneath and the override shown", st)
	}

	// Per value: the resource's override beats its rule's.
	r.SetOverride(perCluster, "", ForceOpen)
	r.SetOverride(perCluster, "destination_cluster=search", Disabled)
	if ok, _ := allow(t, r, set, "destination_cluster", "inventory"); ok {
		t.Error("a value of a forced-open rule was admitted")
	}
	if ok, _ := allow(t, r, set, "destination_cluster", "search"); !ok {
		t.Error("the disabled value was refused")
	}

	// A reload keeps the overrides.
	r.SetRules(parseSet(t, rulesYAML))
	clock.Advance(s)
	if ok, _ := allow(t, r, set, "destination_cluster", "inventory"); ok {
		t.Error("the override did not survive a reload")
	}
	if got := testutil.ToFloat64(r.metrics.override.WithLabelValues(perCluster, "", "force_open")); got != 1 {
		t.Errorf("override gauge = %v, want 1", got)
	}
	if n := len(r.Overrides()); n != 3 {
		t.Errorf("%d overrides listed, want 3", n)
	}
	for _, o := range r.Overrides() {
		r.SetOverride(o.Rule, o.Resource, Auto)
	}
	if n := testutil.CollectAndCount(r.metrics.override); n != 0 || len(r.Overrides()) != 0 {
		t.Errorf("after auto: %d series, %v", n, r.Overrides())
	}
}

// snapshotOf finds one breaker's Snapshot.
func snapshotOf(t *testing.T, r *Registry, rule, resource string) Snapshot {
	t.Helper()
	for _, sn := range r.Snapshot() {
		if sn.Rule == rule && sn.Resource == resource {
			return sn
		}
	}
	t.Fatalf("no breaker %s %q", rule, resource)
	return Snapshot{}
}

// TestSnapshotOrderAndEmptyFields: Snapshot lists breakers by rule, then
// resource; a breaker without max_response_time leaves it out, and one
// with nothing in its window has a ratio of 0.
func TestSnapshotOrderAndEmptyFields(t *testing.T) {
	r, clock, _ := newTestRegistry(t, rulesYAML, Options{})
	for _, c := range []string{"zeta", "alpha", "orders"} {
		r.Observe(Observation{Cluster: c, Status: 500})
	}
	r.Observe(Observation{Cluster: "orders", Status: 200}) // 1 of 2 failed
	r.Observe(Observation{Route: "checkout", Cluster: "backend", ResponseTime: time.Second})
	want := []string{
		"breaker.destination_cluster/destination_cluster=alpha",
		"breaker.destination_cluster/destination_cluster=backend",
		"breaker.destination_cluster/destination_cluster=zeta",
		"breaker.destination_cluster_orders/",
		"breaker.route_checkout.destination_cluster_backend/",
	}
	for _, later := range []time.Duration{0, time.Hour} { // then with empty windows
		clock.Advance(later)
		var got []string
		for _, s := range r.Snapshot() {
			got = append(got, s.Rule+"/"+s.Resource)
			if math.IsNaN(s.Ratio) || s.Total == 0 && s.Ratio != 0 || s.Total > 0 && s.Ratio != float64(s.Failed)/float64(s.Total) {
				t.Errorf("%s/%s: ratio %v with %d of %d failed", s.Rule, s.Resource, s.Ratio, s.Failed, s.Total)
			}
			if wantMRT := s.Strategy == "slow_request_ratio"; (s.MaxResponseTime != "") != wantMRT {
				t.Errorf("%s/%s (%s): max_response_time %q", s.Rule, s.Resource, s.Strategy, s.MaxResponseTime)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("snapshot order %v, want %v", got, want)
		}
	}
}

// TestStateSeriesCap: a detailed_metric rule exports the state of its
// first MaxStateSeriesPerRule breakers and no more (100 when unset).
func TestStateSeriesCap(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: destination_cluster
    detailed_metric: true
    circuit_breaker: {strategy: error_count, threshold: 1}
`
	series := func(opts Options, clusters ...string) int {
		t.Helper()
		reg := prometheus.NewRegistry()
		opts.Metrics = reg
		r, _, _ := newTestRegistry(t, yaml, opts)
		for _, c := range clusters {
			r.Observe(Observation{Cluster: c, Status: 200})
		}
		n, err := testutil.GatherAndCount(reg, "leapgate_breaker_state")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := series(Options{MaxStateSeriesPerRule: 2}, "a", "b", "c"); n != 2 {
		t.Errorf("3 breakers under a cap of 2: %d state series, want 2", n)
	}
	if n := series(Options{}, "a", "b", "c"); n != 3 {
		t.Errorf("3 breakers under the default cap: %d state series, want 3", n)
	}
}

func TestOverrideString(t *testing.T) {
	for o, want := range map[Override]string{Auto: "auto", ForceOpen: "force_open", ForceClosed: "force_closed", Disabled: "disabled", Disabled + 1: fmt.Sprintf("Override(%d)", Disabled+1)} {
		if got := o.String(); got != want {
			t.Errorf("Override(%d).String() = %q, want %q", o, got, want)
		}
	}
}

// TestReloadForgetsSeries: a reload drops the state and response-time
// series of a removed rule, keeps both for an unchanged one, and keeps a
// changed rule's response times (its breaker starts afresh).
func TestReloadForgetsSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, _, _ := newTestRegistry(t, rulesYAML, Options{Metrics: reg})
	r.Observe(Observation{Cluster: "orders", Status: 200, ResponseTime: 30 * ms, Source: SourceALS})
	r.Observe(Observation{Route: "checkout", Cluster: "backend", Status: 200, ResponseTime: 20 * ms, Source: SourceALS})
	r.Observe(Observation{Cluster: "inventory", Status: 200, ResponseTime: 10 * ms, Source: SourceALS})
	// The checkout rule removed; the value-less rule's threshold changed.
	i := strings.Index(rulesYAML, "  - key: route")
	j := strings.Index(rulesYAML, "  - key: user")
	next := strings.Replace(rulesYAML[:i]+rulesYAML[j:], "threshold: 2", "threshold: 3", 1)
	if err := r.SetRules(parseSet(t, next)); err != nil {
		t.Fatal(err)
	}
	series := func(metric, rule string) int {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mf := range mfs {
			if mf.GetName() != metric {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "rule" && l.GetValue() == rule {
						n++
					}
				}
			}
		}
		return n
	}
	for _, c := range []struct {
		metric, rule string
		want         bool
	}{
		{"leapgate_breaker_state", "breaker.destination_cluster_orders", true},
		{"leapgate_breaker_response_time_seconds", "breaker.destination_cluster_orders", true},
		{"leapgate_breaker_state", "breaker.route_checkout.destination_cluster_backend", false},
		{"leapgate_breaker_response_time_seconds", "breaker.route_checkout.destination_cluster_backend", false},
		{"leapgate_breaker_response_time_seconds", "breaker.destination_cluster", true},
	} {
		if got := series(c.metric, c.rule) > 0; got != c.want {
			t.Errorf("%s{rule=%q} present %v after the reload, want %v", c.metric, c.rule, got, c.want)
		}
	}
}

// TestForceClosedPinsATargetOfAValuelessRule: observations fed through
// ObserveTargets change nothing on a breaker of one value that is forced
// closed, while the rule's other values still open.
func TestForceClosedPinsATargetOfAValuelessRule(t *testing.T) {
	r, _, _ := newTestRegistry(t, rulesYAML, Options{})
	r.SetOverride("breaker.destination_cluster", "destination_cluster=inventory", ForceClosed)
	for _, cluster := range []string{"inventory", "stock"} {
		obs := Observation{Cluster: cluster, Status: 500}
		ts := r.Targets(nil, &obs)
		if len(ts) != 1 {
			t.Fatalf("%s: %d targets, want 1", cluster, len(ts))
		}
		r.ObserveTargets(ts, obs)
		r.ObserveTargets(ts, obs) // error_count, threshold 2
		want := Open
		if cluster == "inventory" {
			want = Closed
		}
		if got := ts[0].Breaker().State(); got != want {
			t.Errorf("%s after two 500s: %v, want %v", cluster, got, want)
		}
	}
}

// TestObservingAReclaimedBreaker: targets resolved before their breaker's
// slot was reclaimed still take the observation (the breaker is detached
// and changes nothing), with overrides in place, without a panic.
func TestObservingAReclaimedBreaker(t *testing.T) {
	r, clock, _ := newTestRegistry(t, rulesYAML, Options{MaxBreakersPerRule: 1, Metrics: prometheus.NewRegistry()})
	const rule = "breaker.destination_cluster"
	r.SetOverride(rule, "destination_cluster=elsewhere", ForceClosed)
	obs := Observation{Cluster: "junk-1", Status: 500}
	targets := r.Targets(nil, &obs)
	if len(targets) == 0 {
		t.Fatal("no target for junk-1")
	}
	clock.Advance(s)
	r.Observe(Observation{Cluster: "junk-2", Status: 500}) // takes junk-1's slot
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("observing a reclaimed breaker panicked: %v", p)
			}
		}()
		r.ObserveTargets(targets, obs)
	}()
	if got := resourcesOf(r, rule); got != "destination_cluster=junk-2" {
		t.Errorf("breakers of %s: %q, want only junk-2's", rule, got)
	}
}

// resourcesOf lists the resources of rule's breakers in r's Snapshot,
// space-separated, in its order.
func resourcesOf(r *Registry, rule string) string {
	var resources []string
	for _, b := range r.Snapshot() {
		if b.Rule == rule {
			resources = append(resources, b.Resource)
		}
	}
	return strings.Join(resources, " ")
}
