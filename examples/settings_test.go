package examples

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/leapgate/leapgate/config"
)

// settingNames returns every environment variable config.Settings reads.
func settingNames() []string {
	var names []string
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			if name := f.Tag.Get("envconfig"); name != "" {
				names = append(names, name)
			} else if f.Type.Kind() == reflect.Struct && f.IsExported() {
				walk(f.Type)
			}
		}
	}
	walk(reflect.TypeOf(config.Settings{}))
	return names
}

// checkSettings reports variables Leapgate does not read (a typo would be
// silently ignored) and loads the settings as the binary would, so that a
// bad value is reported too.
func checkSettings(t *testing.T, where string, env map[string]string) config.Settings {
	t.Helper()
	known := settingNames()
	if len(known) < 10 {
		t.Fatalf("found only %d settings in config.Settings", len(known))
	}
	for name := range env {
		if !slices.Contains(known, name) {
			t.Errorf("%s sets %s, which Leapgate does not read", where, name)
		}
	}
	// Start from a clean slate: no setting from the test's environment.
	for _, name := range known {
		if v, ok := os.LookupEnv(name); ok {
			t.Setenv(name, v)
			os.Unsetenv(name)
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	s, err := config.Load()
	if err != nil {
		t.Fatalf("%s: the settings do not load: %v", where, err)
	}
	return s
}

// TestExampleSettings checks the environment the examples give Leapgate
// (docker-compose.yml, the Dockerfile, the Istio Deployment) against the
// settings the binary really reads.
func TestExampleSettings(t *testing.T) {
	t.Run("docker-compose", func(t *testing.T) {
		p := loadCompose(t)
		env := map[string]string{}
		for k, v := range p.Services["ratelimit"].Environment {
			if v != nil {
				env[k] = *v
			}
		}
		s := checkSettings(t, "docker-compose.yml service ratelimit", env)
		if s.GRPCPort != 8081 || s.Port != 8080 {
			t.Errorf("ports %d/%d, want the conventional 8081/8080", s.GRPCPort, s.Port)
		}
	})
	t.Run("Dockerfile", func(t *testing.T) {
		env := map[string]string{}
		for _, in := range loadDockerfile(t)["ratelimit"].all("ENV") {
			for _, kv := range strings.Fields(in.Args) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("ENV %q: use the key=value form", in.Args)
				}
				env[k] = v
			}
		}
		checkSettings(t, "Dockerfile stage ratelimit", env)
	})
	t.Run("istio", func(t *testing.T) {
		objs, err := loadManifests(readDir(t, istioDir))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.Kind != "Deployment" || o.Name != "leapgate" {
				continue
			}
			env := map[string]string{}
			for _, e := range get(o.Spec, "template", "spec", "containers", 0, "env").([]any) {
				env[str(get(e, "name"))] = str(get(e, "value"))
			}
			checkSettings(t, "Istio Deployment leapgate", env)
			return
		}
		t.Fatal("no leapgate Deployment")
	})
}

func TestCheckSettingsCatchesTypos(t *testing.T) {
	known := settingNames()
	for _, name := range []string{"REDIS_ULR", "GRPC_PROT", "RUNTIME_APP_DIRECTORY"} {
		if slices.Contains(known, name) {
			t.Errorf("%s is unexpectedly a setting", name)
		}
	}
	for _, name := range []string{"GRPC_PORT", "PORT", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "BACKEND_TYPE", "REDIS_URL", "REDIS_SOCKET_TYPE"} {
		if !slices.Contains(known, name) {
			t.Errorf("%s is not found among the settings", name)
		}
	}
}
