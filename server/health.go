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
// and HTTP /healthcheck. It starts NOT_SERVING; once shut down it stays
// NOT_SERVING whatever set is called with. It reports SERVING while the
// rules are loaded (set) and the backend can answer (setBackend).
type healthState struct {
	grpc *health.Server

	mu          sync.Mutex
	serving     bool // what is published
	rules       bool // set(true) was called: rules are loaded
	backendDown bool // setBackend(false): the backend cannot answer
	shutdown    bool
}

func newHealthState() *healthState {
	h := &healthState{grpc: health.NewServer()}
	for _, name := range healthServices {
		h.grpc.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return h
}

// set reports whether the rules can serve: SERVING or NOT_SERVING (if the
// backend is up), unless the server is shutting down.
func (h *healthState) set(serving bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rules = serving
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

// publish makes the gRPC statuses follow rules and backend (h.mu held).
func (h *healthState) publish() {
	serving := h.rules && !h.backendDown
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
