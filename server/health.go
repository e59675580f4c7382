package server

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthServices are the names under which grpc.health.v1.Health reports the
// rate-limit service: the overall status (""), envoyproxy/ratelimit's name,
// and the gRPC service's full name.
var healthServices = []string{"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"}

// healthState is the one serving flag behind both the gRPC health service
// and HTTP /healthcheck. Once shut down it stays NOT_SERVING whatever else
// is reported. Otherwise it is SERVING while the backend can answer
// (setBackend) and what the rules must satisfy holds (see healthPolicy);
// with the zero policy that is from the start, as envoyproxy/ratelimit.
type healthState struct {
	grpc   *health.Server
	policy healthPolicy

	mu          sync.Mutex
	serving     bool // what is published
	loaded      bool // some rule set has been put into service
	domains     bool // the rule set in service defines at least one domain
	backendDown bool // setBackend(false): the backend cannot answer
	shutdown    bool
}

// healthPolicy is what the rules must satisfy for the service to be
// healthy.
type healthPolicy struct {
	// needDomains (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED): a rule set
	// with at least one domain is in service.
	needDomains bool
	// needFirstLoad (xDS without FORCE_START_WITHOUT_INITIAL_CONFIG): some
	// rule set has been put into service since start-up.
	needFirstLoad bool
}

// newHealthState returns a health state under policy, published (gRPC
// statuses set) at once.
func newHealthState(policy healthPolicy) *healthState {
	h := &healthState{grpc: health.NewServer(), policy: policy}
	for _, name := range healthServices {
		h.grpc.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	h.mu.Lock()
	h.publish()
	h.mu.Unlock()
	return h
}

// setRules reports a rule set put into service, and whether it defines any
// domain.
func (h *healthState) setRules(domains bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.loaded, h.domains = true, domains
	h.publish()
}

// setBackend reports whether the backend can answer (Redis reachable).
func (h *healthState) setBackend(ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.backendDown = !ok
	h.publish()
}

// watchBackend calls setBackend(healthy()) every interval until ctx is done.
func (h *healthState) watchBackend(ctx context.Context, healthy func() bool, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		h.setBackend(healthy())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// publish makes the gRPC statuses follow the policy, the rules and the
// backend (h.mu held).
func (h *healthState) publish() {
	serving := !h.backendDown &&
		(h.loaded || !h.policy.needFirstLoad) &&
		(h.domains || !h.policy.needDomains)
	if h.shutdown || h.serving == serving {
		return
	}
	h.serving = serving
	status := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		status = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range healthServices {
		h.grpc.SetServingStatus(name, status)
	}
}

// isServing reports the current status.
func (h *healthState) isServing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.serving
}

// shutDown turns every status NOT_SERVING for good (gRPC watchers are told
// at once).
func (h *healthState) shutDown() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.shutdown, h.serving = true, false
	h.grpc.Shutdown()
}
