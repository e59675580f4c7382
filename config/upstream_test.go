package config

import (
	"bufio"
	"os"
	"reflect"
	"strings"
	"testing"
)

// envconfigNames returns every variable Settings reads.
func envconfigNames(t reflect.Type, out map[string]bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Type.Kind() == reflect.Struct && f.Tag.Get("envconfig") == "" {
			envconfigNames(f.Type, out)
			continue
		}
		if name := f.Tag.Get("envconfig"); name != "" {
			out[name] = true
		}
	}
}

// TestUpstreamSettingsAreAccountedFor: every variable envoyproxy/ratelimit
// reads is either read by Leapgate or listed, with what Leapgate does
// instead, in unhonoured (and so warned about at start-up when set).
func TestUpstreamSettingsAreAccountedFor(t *testing.T) {
	f, err := os.Open("testdata/upstream_settings.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ours := map[string]bool{}
	envconfigNames(reflect.TypeOf(Settings{}), ours)
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		name := strings.TrimSpace(sc.Text())
		if name == "" || strings.HasPrefix(name, "#") {
			continue
		}
		n++
		read := ours[name]
		warned := len(Unhonoured([]string{name + "=x"})) == 1
		switch {
		case read && warned:
			t.Errorf("%s is read and also listed as not honoured", name)
		case !read && !warned:
			t.Errorf("upstream's %s is neither read nor listed in unhonoured", name)
		}
	}
	if n < 100 {
		t.Errorf("only %d upstream variables in the fixture", n)
	}
}

func TestUnhonoured(t *testing.T) {
	got := Unhonoured([]string{"USE_STATSD=true", "PORT=8080", "DOG_STATSD_MOGRIFIER_X_PATTERN=a", "MEMCACHE_HOST_PORT=a:1", "PATH=/bin",
		"RUNTIME_IGNOREDOTFILES=true", "REDIS_PERSECOND=true", "REDIS_PERSECOND_PIPELINE_WINDOW=1ms"})
	var names []string
	for _, u := range got {
		if u.Why == "" {
			t.Errorf("%s: no reason", u.Name)
		}
		names = append(names, u.Name)
	}
	if want := []string{"DOG_STATSD_MOGRIFIER_X_PATTERN", "MEMCACHE_HOST_PORT", "REDIS_PERSECOND_PIPELINE_WINDOW", "USE_STATSD"}; !reflect.DeepEqual(names, want) {
		t.Errorf("Unhonoured = %v, want %v", names, want)
	}
}
