package examples

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

// loadCompose is an offline `docker compose config`: the loader the compose
// CLI uses, with schema validation, interpolation, consistency checks and
// paths resolved against the repository root.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return p
}

func env(s types.ServiceConfig, name string) string {
	if v := s.Environment[name]; v != nil {
		return *v
	}
	return ""
}

// mountSource returns the host path bound at target in s.
func mountSource(t *testing.T, s types.ServiceConfig, target string) string {
	t.Helper()
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeBind && v.Target == target {
			return v.Source
		}
	}
	t.Fatalf("service %s mounts nothing at %s", s.Name, target)
	return ""
}

func published(s types.ServiceConfig, port uint32) bool {
	for _, p := range s.Ports {
		if p.Target == port && p.Published != "" {
			return true
		}
	}
	return false
}

func portOf(t *testing.T, addr string) uint32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return uint32(n)
}

func mustAtoi(t *testing.T, s string) uint32 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		t.Fatalf("port %q: %v", s, err)
	}
	return uint32(n)
}

// TestDockerCompose checks the demo's docker-compose.yml offline: it loads,
// every mounted file exists, the Envoy config's clusters point at the
// compose services on the ports they listen on, and Prometheus and Grafana
// are wired to them.
func TestDockerCompose(t *testing.T) {
	p := loadCompose(t)
	for _, name := range []string{"envoy", "ratelimit", "redis", "upstream", "prometheus", "grafana"} {
		if _, ok := p.Services[name]; !ok {
			t.Fatalf("no service %q", name)
		}
	}
	for name, s := range p.Services {
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			if _, err := os.Stat(v.Source); err != nil {
				t.Errorf("service %s mounts %s, which does not exist: %v", name, v.Source, err)
			}
			if !v.ReadOnly {
				t.Errorf("service %s mounts %s read-write; the demo only reads its files", name, v.Source)
			}
		}
		if s.Build == nil {
			if img := s.Image; !strings.Contains(img, ":") || strings.HasSuffix(img, ":latest") {
				t.Errorf("service %s: image %q is not pinned to a version", name, img)
			}
		}
	}

	// Which ports each of our services listens on, from its own settings.
	rl, up := p.Services["ratelimit"], p.Services["upstream"]
	grpcPort, httpPort := mustAtoi(t, env(rl, "GRPC_PORT")), mustAtoi(t, env(rl, "PORT"))
	listening := map[string][]uint32{
		"ratelimit": {grpcPort, httpPort},
		"upstream":  {portOf(t, env(up, "LISTEN")), portOf(t, env(up, "ADMIN_LISTEN"))},
		"redis":     {6379},
	}

	// The Dockerfile stages compose builds, and the ports they expose.
	stages := loadDockerfile(t)
	for _, name := range []string{"ratelimit", "upstream"} {
		s := p.Services[name]
		if s.Build == nil {
			t.Fatalf("service %s is not built from the Dockerfile", name)
		}
		st := stages[s.Build.Target]
		if st == nil {
			t.Fatalf("service %s builds target %q, which the Dockerfile lacks", name, s.Build.Target)
		}
		for _, port := range listening[name] {
			if !slices.Contains(st.exposed(), strconv.Itoa(int(port))) {
				t.Errorf("service %s listens on %d, which Dockerfile stage %s does not EXPOSE (%v)", name, port, st.Name, st.exposed())
			}
		}
	}

	// Envoy: the mounted config is the validated example, and its
	// clusters reach the services above.
	envoy := p.Services["envoy"]
	cmd := strings.Join(envoy.Command, " ")
	_, cfgPath, ok := strings.Cut(cmd, "-c ")
	if !ok {
		t.Fatalf("envoy command %q has no -c", cmd)
	}
	cfgPath, _, _ = strings.Cut(cfgPath, " ")
	src := mountSource(t, envoy, cfgPath)
	if want, _ := filepath.Abs(envoyConfigPath); src != want {
		t.Errorf("envoy mounts %s at %s, want the example %s", src, cfgPath, want)
	}
	f, err := checkBootstrap(readFile(t, envoyConfigPath), loadRules(t, envoyRulesDir))
	if err != nil {
		t.Fatalf("%s: %v", envoyConfigPath, err)
	}
	for _, c := range f.Clusters {
		for _, ep := range c.GetLoadAssignment().GetEndpoints() {
			for _, lb := range ep.GetLbEndpoints() {
				sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
				ports, ok := listening[sa.GetAddress()]
				if !ok {
					t.Errorf("cluster %s points at %s, which is not a compose service", c.GetName(), sa.GetAddress())
					continue
				}
				if !slices.Contains(ports, sa.GetPortValue()) {
					t.Errorf("cluster %s points at %s:%d; the service listens on %v", c.GetName(), sa.GetAddress(), sa.GetPortValue(), ports)
				}
				if slices.Contains(f.GRPCClusters, c.GetName()) && sa.GetAddress() == "ratelimit" && sa.GetPortValue() != grpcPort {
					t.Errorf("gRPC cluster %s points at port %d, not Leapgate's GRPC_PORT %d", c.GetName(), sa.GetPortValue(), grpcPort)
				}
			}
		}
	}
	var bsListener, bsAdmin uint32
	{
		var raw struct {
			Admin struct {
				Address struct {
					SocketAddress struct {
						Address   string `json:"address"`
						PortValue uint32 `json:"port_value"`
					} `json:"socket_address"`
				} `json:"address"`
			} `json:"admin"`
			StaticResources struct {
				Listeners []struct {
					Address struct {
						SocketAddress struct {
							PortValue uint32 `json:"port_value"`
						} `json:"socket_address"`
					} `json:"address"`
				} `json:"listeners"`
			} `json:"static_resources"`
		}
		if err := yaml.Unmarshal(readFile(t, envoyConfigPath), &raw); err != nil {
			t.Fatal(err)
		}
		bsAdmin = raw.Admin.Address.SocketAddress.PortValue
		bsListener = raw.StaticResources.Listeners[0].Address.SocketAddress.PortValue
		if raw.Admin.Address.SocketAddress.Address != "0.0.0.0" {
			t.Errorf("envoy admin listens on %s: Prometheus, in another container, cannot scrape it", raw.Admin.Address.SocketAddress.Address)
		}
	}
	if !published(envoy, bsListener) || !published(envoy, bsAdmin) {
		t.Errorf("envoy must publish its listener %d and admin %d: ports %v", bsListener, bsAdmin, envoy.Ports)
	}

	// Leapgate: the rules it mounts are the example rules, where its
	// RUNTIME_* settings look for them; Redis is reachable.
	rulesDir := path.Join(env(rl, "RUNTIME_ROOT"), env(rl, "RUNTIME_SUBDIRECTORY"), env(rl, "RUNTIME_APPDIRECTORY"))
	if want, _ := filepath.Abs(envoyRulesDir); mountSource(t, rl, rulesDir) != want {
		t.Errorf("ratelimit mounts %s at %s, want %s", mountSource(t, rl, rulesDir), rulesDir, want)
	}
	if env(rl, "BACKEND_TYPE") == "redis" {
		host, port, err := net.SplitHostPort(env(rl, "REDIS_URL"))
		if err != nil || !slices.Contains(listening[host], mustAtoi(t, port)) {
			t.Errorf("REDIS_URL %q does not point at the redis service", env(rl, "REDIS_URL"))
		}
	}
	if !published(up, portOf(t, env(up, "ADMIN_LISTEN"))) {
		t.Error("the upstream's admin port is not published: the walkthrough's curl to /faults would fail")
	}

	// Prometheus scrapes Leapgate's HTTP port and Envoy's admin.
	prom := p.Services["prometheus"]
	var promCfg struct {
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			MetricsPath   string `json:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	promFile := mountSource(t, prom, "/etc/prometheus/prometheus.yml")
	data, err := os.ReadFile(promFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &promCfg); err != nil {
		t.Fatalf("%s: %v", promFile, err)
	}
	want := map[string]string{
		"ratelimit:" + strconv.Itoa(int(httpPort)): "/metrics",
		"envoy:" + strconv.Itoa(int(bsAdmin)):      "/stats/prometheus",
	}
	for _, sc := range promCfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				if wantPath, ok := want[target]; ok && sc.MetricsPath == wantPath {
					delete(want, target)
				}
			}
		}
	}
	if len(want) > 0 {
		t.Errorf("prometheus does not scrape %v", want)
	}

	// Grafana: the provisioned data source is the prometheus service, the
	// dashboards provider reads the mounted dashboards, whose panels use it.
	g := p.Services["grafana"]
	prov := mountSource(t, g, "/etc/grafana/provisioning")
	var dsCfg struct {
		Datasources []struct {
			UID       string `json:"uid"`
			URL       string `json:"url"`
			IsDefault bool   `json:"isDefault"`
		} `json:"datasources"`
	}
	if err := yaml.Unmarshal(readAbs(t, filepath.Join(prov, "datasources", "prometheus.yml")), &dsCfg); err != nil {
		t.Fatal(err)
	}
	if len(dsCfg.Datasources) != 1 {
		t.Fatalf("want one data source, got %d", len(dsCfg.Datasources))
	}
	u, err := url.Parse(dsCfg.Datasources[0].URL)
	if err != nil || u.Hostname() != "prometheus" || u.Port() != "9090" {
		t.Errorf("data source URL %q is not the prometheus service", dsCfg.Datasources[0].URL)
	}
	var provCfg struct {
		Providers []struct {
			Options struct {
				Path string `json:"path"`
			} `json:"options"`
		} `json:"providers"`
	}
	if err := yaml.Unmarshal(readAbs(t, filepath.Join(prov, "dashboards", "leapgate.yml")), &provCfg); err != nil {
		t.Fatal(err)
	}
	dashDir := mountSource(t, g, provCfg.Providers[0].Options.Path)
	home := env(g, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
	if rel, ok := strings.CutPrefix(home, provCfg.Providers[0].Options.Path+"/"); !ok {
		t.Errorf("home dashboard %s is not under the provisioned path", home)
	} else if _, err := os.Stat(filepath.Join(dashDir, rel)); err != nil {
		t.Errorf("home dashboard: %v", err)
	}
	// The dashboards are importable anywhere: every panel queries the
	// data source chosen by their "datasource" variable, of type
	// prometheus, which picks the default one: the provisioned Prometheus.
	if !dsCfg.Datasources[0].IsDefault {
		t.Errorf("the provisioned data source is not the default, which the dashboards' datasource variable picks")
	}
	for _, d := range dashboards(t, dashDir) {
		var ds *dashboardVar
		for i, v := range d.Templating.List {
			if v.Name == "datasource" {
				ds = &d.Templating.List[i]
			}
		}
		if ds == nil || ds.Type != "datasource" || ds.Query != "prometheus" {
			t.Errorf("dashboard %q has no datasource variable of type prometheus: %+v", d.Title, ds)
		}
		for _, p := range d.Panels {
			if p.Type == "row" {
				continue
			}
			if p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q uses data source %q, not the datasource variable", p.Title, p.Datasource.UID)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
		}
	}
}

func readAbs(t *testing.T, p string) []byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// dashboard is the part of a Grafana dashboard JSON the tests read.
type dashboard struct {
	Title      string `json:"title"`
	Templating struct {
		List []dashboardVar `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// dashboardVar is a template variable of a dashboard.
type dashboardVar struct {
	Type  string `json:"type"`
	Name  string `json:"name"`
	Query any    `json:"query"`
}

func dashboards(t *testing.T, dir string) []dashboard {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(files) == 0 {
		t.Fatalf("no dashboards in %s", dir)
	}
	var out []dashboard
	for _, f := range files {
		var d dashboard
		if err := json.Unmarshal(readAbs(t, f), &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, d)
	}
	return out
}
