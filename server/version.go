package server

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// linkedVersion, when set at link time (-ldflags "-X
// github.com/leapgate/leapgate/server.linkedVersion=v1.2.3", as the
// Dockerfile does), is the version Build reports.
var linkedVersion string

// BuildInfo describes the running binary.
type BuildInfo struct {
	// Version is the release (set at link time), else the main module's
	// version from the build ("(devel)" for a source build).
	Version string
	// Commit is the VCS revision the binary was built from, with "-dirty"
	// for a modified tree; "unknown" when the build did not record it.
	Commit string
	// GoVersion is the Go toolchain that built it.
	GoVersion string
}

// Build returns the running binary's BuildInfo.
func Build() BuildInfo {
	b := BuildInfo{Version: "(devel)", Commit: "unknown", GoVersion: runtime.Version()}
	if info, ok := debug.ReadBuildInfo(); ok {
		if v := info.Main.Version; v != "" {
			b.Version = v
		}
		dirty := false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && b.Commit != "unknown" {
			b.Commit += "-dirty"
		}
	}
	if linkedVersion != "" {
		b.Version = linkedVersion
	}
	return b
}

// String is the version line of ratelimit --version.
func (b BuildInfo) String() string {
	return "leapgate " + b.Version + " (commit " + b.Commit + ", " + b.GoVersion + ")"
}

// registerBuildInfo exports leapgate_build_info{version,commit,goversion} 1.
func registerBuildInfo(reg prometheus.Registerer, b BuildInfo) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "leapgate_build_info",
		Help: "Always 1; the labels name the running binary's version, commit and Go version.",
	}, []string{"version", "commit", "goversion"})
	g.WithLabelValues(b.Version, b.Commit, b.GoVersion).Set(1)
	reg.MustRegister(g)
}
