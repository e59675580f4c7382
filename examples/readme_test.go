package examples

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestReadmeWalkthrough checks that the walkthrough's commands talk to
// what the demo really runs: every localhost port is published by a
// compose service, and every path sent through Envoy hits the route the
// text is about.
func TestReadmeWalkthrough(t *testing.T) {
	text := string(readFile(t, "../docs/demo.md"))
	p := loadCompose(t)
	var publishedPorts []string
	for _, s := range p.Services {
		for _, port := range s.Ports {
			publishedPorts = append(publishedPorts, port.Published)
		}
	}
	ports := regexp.MustCompile(`localhost:(\d+)`).FindAllStringSubmatch(text, -1)
	if len(ports) == 0 {
		t.Fatal("the walkthrough names no localhost port")
	}
	for _, m := range ports {
		if !slices.Contains(publishedPorts, m[1]) {
			t.Errorf("the walkthrough uses localhost:%s, which no compose service publishes", m[1])
		}
	}

	f, err := checkBootstrap(readFile(t, envoyConfigPath), loadRules(t, envoyRulesDir))
	if err != nil {
		t.Fatal(err)
	}
	listener := ""
	envoy := p.Services["envoy"]
	for _, port := range envoy.Ports {
		if port.Target == 10000 {
			listener = port.Published
		}
	}
	if listener == "" {
		t.Fatal("envoy publishes no listener port 10000")
	}
	// routeFor returns the name of the first route whose prefix matches.
	routeFor := func(path string) string {
		for _, r := range f.Routes {
			if strings.HasPrefix(path, r.GetMatch().GetPrefix()) {
				return r.GetName()
			}
		}
		return ""
	}
	want := map[string]string{"/api/": "api", "/checkout": "checkout"}
	for _, m := range regexp.MustCompile(`localhost:`+regexp.QuoteMeta(listener)+`(/[^\s'"]*)`).FindAllStringSubmatch(text, -1) {
		path := m[1]
		got := routeFor(path)
		ok := false
		for prefix, route := range want {
			if strings.HasPrefix(path, prefix) {
				ok = got == route
			}
		}
		if !ok {
			t.Errorf("the walkthrough sends %s through Envoy, which goes to route %q", path, got)
		}
	}
}
