package server

import (
	"testing"

	"github.com/leapgate/leapgate/config"
)

func TestTracingWanted(t *testing.T) {
	for _, tt := range []struct {
		name    string
		enabled bool
		env     map[string]string
		want    bool
	}{
		{"nothing set: off", false, nil, false},
		{"TRACING_ENABLED", true, nil, true},
		{"OTEL endpoint", false, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{"OTEL traces endpoint", false, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{"OTEL_SDK_DISABLED wins over TRACING_ENABLED", true, map[string]string{"OTEL_SDK_DISABLED": "true"}, false},
		{"OTEL_SDK_DISABLED wins over an endpoint", false, map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := tracingWanted(config.Tracing{Enabled: tt.enabled}, func(k string) string { return tt.env[k] })
			if got != tt.want {
				t.Errorf("tracingWanted = %t, want %t", got, tt.want)
			}
		})
	}
}
