package server

import (
	"sync"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthServices are the names under which grpc.health.v1.Health reports the
// rate-limit service: the overall status (""), envoyproxy/ratelimit's name,
// and the gRPC service's full name.
var healthServices = []string{"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"}

// healthState is the one serving flag behind both the gRPC health service
// and HTTP /healthcheck. It starts NOT_SERVING; once shut down it stays
// NOT_SERVING whatever set is called with.
type healthState struct {
	grpc *health.Server

	mu       sync.Mutex
	serving  bool
	shutdown bool
}

func newHealthState() *healthState {
	h := &healthState{grpc: health.NewServer()}
	for _, name := range healthServices {
		h.grpc.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return h
}

// set reports SERVING or NOT_SERVING, unless the server is shutting down.
func (h *healthState) set(serving bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
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
