package config

import (
	"errors"
	"fmt"
	"strings"
)

// Tracing holds envoyproxy/ratelimit's tracing settings. Leapgate's tracing
// is OpenTelemetry's: the standard OTEL_* variables configure it too (and
// win where both say the same thing), and setting OTEL_EXPORTER_OTLP_ENDPOINT
// turns it on like TracingEnabled.
type Tracing struct {
	// Enabled turns tracing on (spans exported over OTLP).
	Enabled bool `envconfig:"TRACING_ENABLED" default:"false"`
	// ExporterProtocol is http (OTLP/HTTP, upstream's default) or grpc;
	// OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL wins.
	ExporterProtocol string `envconfig:"TRACING_EXPORTER_PROTOCOL" default:"http"`
	// ServiceName, ServiceNamespace and ServiceInstanceID are the resource's
	// service.name, service.namespace and
	// service.instance.id; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win.
	ServiceName       string `envconfig:"TRACING_SERVICE_NAME" default:"leapgate"`
	ServiceNamespace  string `envconfig:"TRACING_SERVICE_NAMESPACE"`
	ServiceInstanceID string `envconfig:"TRACING_SERVICE_INSTANCE_ID"`
	// SamplingRate is the share of new traces sampled, in [0, 1]; a request
	// whose caller sampled (or not) its trace follows the caller.
	// OTEL_TRACES_SAMPLER wins.
	SamplingRate float64 `envconfig:"TRACING_SAMPLING_RATE" default:"1"`
}

// Validate reports every invalid tracing setting at once.
func (t Tracing) Validate() error {
	var errs []error
	switch strings.ToLower(t.ExporterProtocol) {
	case "http", "grpc":
	default:
		errs = append(errs, fmt.Errorf("TRACING_EXPORTER_PROTOCOL: %q is neither http nor grpc", t.ExporterProtocol))
	}
	if !(t.SamplingRate >= 0 && t.SamplingRate <= 1) {
		errs = append(errs, fmt.Errorf("TRACING_SAMPLING_RATE: %v is outside [0, 1]", t.SamplingRate))
	}
	return errors.Join(errs...)
}
