package charttest

import (
	"bytes"
	"os"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// gatewayExample is the Envoy Gateway budget example: Envoy Gateway's
// configuration with Leapgate as its rate-limit deployment, and a
// BackendTrafficPolicy that charges token usage after the response.
const gatewayExample = "../../../examples/budget/envoy-gateway.yaml"

// TestEnvoyGatewayBudgetExample decodes the example strictly into Envoy
// Gateway's own API types (an unknown or misspelled field fails), and
// checks what makes it a budget: Leapgate's image with DEFAULT_CHARGE=always
// (a setting Leapgate reads, with a value it accepts), a request cost of 0
// and a response cost taken from metadata.
func TestEnvoyGatewayBudgetExample(t *testing.T) {
	data, err := os.ReadFile(gatewayExample)
	if err != nil {
		t.Fatal(err)
	}
	docs := bytes.Split(data, []byte("\n---\n"))
	if len(docs) != 2 {
		t.Fatalf("want 2 documents (the ConfigMap and the policy), got %d", len(docs))
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(docs[0], &cm); err != nil {
		t.Fatalf("ConfigMap: %v", err)
	}
	var eg egv1a1.EnvoyGateway
	if err := yaml.UnmarshalStrict([]byte(cm.Data["envoy-gateway.yaml"]), &eg); err != nil {
		t.Fatalf("EnvoyGateway configuration: %v", err)
	}
	if eg.Kind != "EnvoyGateway" || eg.RateLimit == nil || eg.RateLimit.Backend.Type != egv1a1.RedisBackendType {
		t.Fatalf("EnvoyGateway configuration without a Redis rate-limit backend: %+v", eg)
	}
	c := eg.Provider.Kubernetes.RateLimitDeployment.Container
	if c.Image == nil || *c.Image == "" {
		t.Fatal("the rate-limit deployment's image is not replaced")
	}
	names := settingNames()
	charge := false
	for _, e := range c.Env {
		if !names[e.Name] {
			t.Errorf("env %s is not a setting Leapgate reads", e.Name)
		}
		charge = charge || e.Name == "DEFAULT_CHARGE" && e.Value == "always"
	}
	if !charge {
		t.Error("the rate-limit deployment does not set DEFAULT_CHARGE=always: xDS rules cannot say charge themselves")
	}

	var p egv1a1.BackendTrafficPolicy
	if err := yaml.UnmarshalStrict(docs[1], &p); err != nil {
		t.Fatalf("BackendTrafficPolicy: %v", err)
	}
	if p.Spec.RateLimit == nil || p.Spec.RateLimit.Global == nil || len(p.Spec.RateLimit.Global.Rules) != 1 {
		t.Fatalf("want one global rate-limit rule, got %+v", p.Spec.RateLimit)
	}
	cost := p.Spec.RateLimit.Global.Rules[0].Cost
	switch {
	case cost == nil || cost.Request == nil || cost.Response == nil:
		t.Fatalf("want a request and a response cost, got %+v", cost)
	case cost.Request.From != egv1a1.RateLimitCostFromNumber || cost.Request.Number == nil || *cost.Request.Number != 0:
		t.Errorf("the request cost must be the number 0 (a check), got %+v", cost.Request)
	case cost.Response.From != egv1a1.RateLimitCostFromMetadata || cost.Response.Metadata == nil:
		t.Errorf("the response cost must come from metadata, got %+v", cost.Response)
	}
}
