// Package charttest renders the Helm chart deploy/helm/leapgate with the
// real helm binary (installed by scripts/test.sh), lints it, and decodes
// every rendered object strictly into its Kubernetes API type, once per
// values switch; it also decodes the Envoy Gateway budget example
// (examples/budget/envoy-gateway.yaml) into Envoy Gateway's API types. It
// is a module of its own so that the Kubernetes API types stay out of the
// service's module.
package charttest

import (
	"bytes"

	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/leapgate/leapgate/config"
	"github.com/leapgate/leapgate/descriptors"
	"github.com/leapgate/leapgate/internal/tooltest"
)

const chart = "../leapgate"

// helmPath finds helm as the service's tests find their tools (on PATH or
// where `go install` puts it; skipped when missing, or failing under
// LEAPGATE_REQUIRE_TOOLS, which scripts/test.sh sets).
func helmPath(t *testing.T) string { return tooltest.Path(t, "helm") }

// objects is a rendered chart, decoded.
type objects struct {
	deployment     *appsv1.Deployment
	service        *corev1.Service
	configMap      *corev1.ConfigMap
	secrets        []*corev1.Secret
	serviceAccount *corev1.ServiceAccount
	pdb            *policyv1.PodDisruptionBudget
	hpa            *autoscalingv2.HorizontalPodAutoscaler
	serviceMonitor *monitoringv1.ServiceMonitor
}

// secret returns the rendered Secret that holds key, nil if none does.
func (o objects) secret(key string) *corev1.Secret {
	for _, s := range o.secrets {
		if _, ok := s.StringData[key]; ok {
			return s
		}
	}
	return nil
}

// render runs helm template with the --set values and decodes every object
// strictly (an unknown field is an error) into its API type.
func render(t *testing.T, sets ...string) objects {
	t.Helper()
	args := []string{"template", "rl", chart, "--namespace", "edge"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := exec.Command(helmPath(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var o objects
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%v in\n%s", err, doc)
		}
		if meta.Kind == "" {
			continue // a comment-only document
		}
		var into any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			o.deployment = new(appsv1.Deployment)
			into = o.deployment
		case "v1 Service":
			o.service = new(corev1.Service)
			into = o.service
		case "v1 ConfigMap":
			o.configMap = new(corev1.ConfigMap)
			into = o.configMap
		case "v1 Secret":
			sec := new(corev1.Secret)
			o.secrets = append(o.secrets, sec)
			into = sec
		case "v1 ServiceAccount":
			o.serviceAccount = new(corev1.ServiceAccount)
			into = o.serviceAccount
		case "policy/v1 PodDisruptionBudget":
			o.pdb = new(policyv1.PodDisruptionBudget)
			into = o.pdb
		case "autoscaling/v2 HorizontalPodAutoscaler":
			o.hpa = new(autoscalingv2.HorizontalPodAutoscaler)
			into = o.hpa
		case "monitoring.coreos.com/v1 ServiceMonitor":
			o.serviceMonitor = new(monitoringv1.ServiceMonitor)
			into = o.serviceMonitor
		default:
			t.Fatalf("unexpected object %s %s", meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			t.Fatalf("%s %s does not decode strictly: %v\n%s", meta.APIVersion, meta.Kind, err, doc)
		}
	}
	if o.deployment == nil || o.service == nil {
		t.Fatal("no Deployment or Service rendered")
	}
	return o
}

func env(d *appsv1.Deployment) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		out[e.Name] = e
	}
	return out
}

func TestLint(t *testing.T) {
	if out, err := exec.Command(helmPath(t), "lint", "--strict", chart).CombinedOutput(); err != nil {
		t.Fatalf("helm lint --strict: %v\n%s", err, out)
	}
}

// settingNames are the variables the service reads.
func settingNames() map[string]bool {
	names := map[string]bool{}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.Type.Kind() == reflect.Struct && f.Tag.Get("envconfig") == "" {
				walk(f.Type)
			} else if n := f.Tag.Get("envconfig"); n != "" {
				names[n] = true
			}
		}
	}
	walk(reflect.TypeOf(config.Settings{}))
	return names
}

func TestDefaults(t *testing.T) {
	o := render(t)
	d := o.deployment
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]

	if c.Image != "leapgate:0.1.0" {
		t.Errorf("image %q, want the chart's appVersion 0.1.0", c.Image)
	}
	// Hardened: non-root, read-only root file system, no privilege
	// escalation, no capabilities, the runtime's seccomp profile.
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container securityContext not hardened: %+v", sc)
	}
	if psc := pod.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil {
		t.Errorf("pod securityContext not hardened: %+v", psc)
	}
	// Liveness must not restart pods for a Redis outage or bad rules (the
	// health check reports those): it only opens a TCP connection.
	if c.LivenessProbe == nil || c.LivenessProbe.TCPSocket == nil || c.LivenessProbe.HTTPGet != nil || c.LivenessProbe.GRPC != nil {
		t.Errorf("liveness probe %+v, want a TCP check only", c.LivenessProbe)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/healthcheck" || c.ReadinessProbe.HTTPGet.Port.String() != "http" {
		t.Errorf("readiness probe %+v, want GET /healthcheck on the http port", c.ReadinessProbe)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v, want CPU requests and a memory limit", c.Resources)
	}
	// Every variable set is one the service reads, and the ones that matter
	// are set.
	known := settingNames()
	e := env(d)
	for name := range e {
		if !known[name] {
			t.Errorf("the Deployment sets %s, which the service does not read", name)
		}
	}
	for name, want := range map[string]string{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true", "BACKEND_TYPE": "memory", "RUNTIME_ROOT": "/data"} {
		if e[name].Value != want {
			t.Errorf("%s = %q, want %q", name, e[name].Value, want)
		}
	}
	// The rules are mounted where RUNTIME_* point, from the ConfigMap, and
	// they load.
	mount := c.VolumeMounts[0]
	dir := filepath.Join(e["RUNTIME_ROOT"].Value, e["RUNTIME_SUBDIRECTORY"].Value, e["RUNTIME_APPDIRECTORY"].Value)
	if mount.MountPath != dir || !mount.ReadOnly || pod.Volumes[0].ConfigMap == nil || pod.Volumes[0].ConfigMap.Name != o.configMap.Name {
		t.Errorf("rules mounted at %s from %+v, want %s from ConfigMap %s", mount.MountPath, pod.Volumes[0], dir, o.configMap.Name)
	}
	var files []descriptors.File
	for name, data := range o.configMap.Data {
		files = append(files, descriptors.File{Name: name, Data: []byte(data)})
	}
	if set, err := descriptors.Parse(files, descriptors.Options{}); err != nil || len(set.Domains()) == 0 {
		t.Errorf("the default rules do not load: %v", err)
	}
	// The Service exposes gRPC (Envoy's rate-limit cluster) and HTTP.
	ports := map[string]int32{}
	for _, p := range o.service.Spec.Ports {
		ports[p.Name] = p.Port
	}
	if ports["grpc"] != 8081 || ports["http"] != 8080 {
		t.Errorf("service ports %v", ports)
	}
	if o.pdb == nil || o.pdb.Spec.MinAvailable == nil || o.pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget %+v, want minAvailable 1", o.pdb)
	}
	if len(o.secrets) != 0 || o.hpa != nil || o.serviceMonitor != nil {
		t.Error("optional objects rendered by default")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", d.Spec.Replicas)
	}
}

func TestValuesSwitches(t *testing.T) {
	for _, tt := range []struct {
		name  string
		sets  []string
		check func(t *testing.T, o objects)
	}{
		{"redis with a password: a Secret, BACKEND_TYPE redis", []string{"redis.enabled=true", "redis.url=redis.edge:6379", "redis.auth=s3cret", "redis.failureMode=local", "redis.reservation=0s"},
			func(t *testing.T, o objects) {
				e := env(o.deployment)
				if e["BACKEND_TYPE"].Value != "redis" || e["REDIS_URL"].Value != "redis.edge:6379" || e["REDIS_FAILURE_MODE"].Value != "local" || e["REDIS_RESERVATION"].Value != "0s" {
					t.Errorf("redis env %v", e)
				}
				ref, sec := e["REDIS_AUTH"].ValueFrom, o.secret("REDIS_AUTH")
				if sec == nil || sec.StringData["REDIS_AUTH"] != "s3cret" || ref == nil || ref.SecretKeyRef.Name != sec.Name || e["REDIS_AUTH"].Value != "" {
					t.Errorf("REDIS_AUTH %+v from Secret %+v: want a secretKeyRef to the chart's Secret, never the value in the Deployment", e["REDIS_AUTH"], sec)
				}
			}},
		{"redis with an existing Secret", []string{"redis.enabled=true", "redis.existingSecret=my-redis"},
			func(t *testing.T, o objects) {
				if ref := env(o.deployment)["REDIS_AUTH"].ValueFrom; len(o.secrets) != 0 || ref == nil || ref.SecretKeyRef.Name != "my-redis" {
					t.Errorf("REDIS_AUTH from %+v, Secrets rendered %d", ref, len(o.secrets))
				}
			}},
		{"redis without a password", []string{"redis.enabled=true"},
			func(t *testing.T, o objects) {
				if _, ok := env(o.deployment)["REDIS_AUTH"]; ok || len(o.secrets) != 0 {
					t.Error("REDIS_AUTH set without a password")
				}
			}},
		{"feed token: a Secret, FEED_TOKEN from it", []string{"feeds.token=f33d"},
			func(t *testing.T, o objects) {
				e := env(o.deployment)
				ref, sec := e["FEED_TOKEN"].ValueFrom, o.secret("FEED_TOKEN")
				if sec == nil || sec.StringData["FEED_TOKEN"] != "f33d" || ref == nil || ref.SecretKeyRef.Name != sec.Name || ref.SecretKeyRef.Key != "FEED_TOKEN" || e["FEED_TOKEN"].Value != "" {
					t.Errorf("FEED_TOKEN %+v from Secret %+v: want a secretKeyRef to the chart's Secret, never the value in the Deployment", e["FEED_TOKEN"], sec)
				}
			}},
		{"feed token from an existing Secret", []string{"feeds.existingSecret=envoy-feeds"},
			func(t *testing.T, o objects) {
				if ref := env(o.deployment)["FEED_TOKEN"].ValueFrom; len(o.secrets) != 0 || ref == nil || ref.SecretKeyRef.Name != "envoy-feeds" {
					t.Errorf("FEED_TOKEN from %+v, Secrets rendered %d", ref, len(o.secrets))
				}
			}},
		{"feeds from any peer", []string{"feeds.allowAnyPeer=true"},
			func(t *testing.T, o objects) {
				if e := env(o.deployment); e["FEED_ALLOW_ANY_PEER"].Value != "true" {
					t.Errorf("FEED_ALLOW_ANY_PEER %+v", e["FEED_ALLOW_ANY_PEER"])
				}
			}},
		{"ServiceMonitor", []string{"serviceMonitor.enabled=true", "serviceMonitor.labels.release=prom"},
			func(t *testing.T, o objects) {
				sm := o.serviceMonitor
				if sm == nil || len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" || sm.Labels["release"] != "prom" {
					t.Fatalf("ServiceMonitor %+v", sm)
				}
				for k, v := range sm.Spec.Selector.MatchLabels {
					if o.service.Labels[k] != v {
						t.Errorf("ServiceMonitor selects %s=%s, which the Service lacks", k, v)
					}
				}
			}},
		{"HPA: no fixed replicas", []string{"autoscaling.enabled=true", "autoscaling.maxReplicas=6"},
			func(t *testing.T, o objects) {
				if o.hpa == nil || o.hpa.Spec.MaxReplicas != 6 || o.hpa.Spec.ScaleTargetRef.Name != o.deployment.Name || o.deployment.Spec.Replicas != nil {
					t.Errorf("HPA %+v with Deployment replicas %v", o.hpa, o.deployment.Spec.Replicas)
				}
			}},
		{"an existing rules ConfigMap", []string{"existingRulesConfigMap=team-rules"},
			func(t *testing.T, o objects) {
				if o.configMap != nil || o.deployment.Spec.Template.Spec.Volumes[0].ConfigMap.Name != "team-rules" {
					t.Errorf("rules from %+v, chart ConfigMap rendered %v", o.deployment.Spec.Template.Spec.Volumes[0], o.configMap != nil)
				}
			}},
		{"no PodDisruptionBudget", []string{"podDisruptionBudget.enabled=false"},
			func(t *testing.T, o objects) {
				if o.pdb != nil {
					t.Error("PodDisruptionBudget rendered")
				}
			}},
		{"image tag and extra settings", []string{"image.tag=1.2.3", "env.MAX_MEMORY_BYTES=67108864", "env.SHADOW_MODE=true"},
			func(t *testing.T, o objects) {
				e := env(o.deployment)
				if c := o.deployment.Spec.Template.Spec.Containers[0]; c.Image != "leapgate:1.2.3" || e["MAX_MEMORY_BYTES"].Value != "67108864" || e["SHADOW_MODE"].Value != "true" {
					t.Errorf("image %s, env %v", c.Image, e)
				}
			}},
	} {
		t.Run(tt.name, func(t *testing.T) { tt.check(t, render(t, tt.sets...)) })
	}
}
