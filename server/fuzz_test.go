package server_test

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// FuzzJSON posts arbitrary bodies to /json of a running server: the answer
// is always a deliberate status (never 500: no panic, no unexpected error),
// and a 200 or 429 body is a RateLimitResponse. Seeds: testdata/fuzz/FuzzJSON.
func FuzzJSON(f *testing.F) {
	f.Add([]byte(`{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`))
	f.Add([]byte(`{"domain":"test","hitsAddend":3,"descriptors":[{"entries":[{"key":"path","value":"/free"}],"limit":{"requestsPerUnit":1,"unit":"SECOND"}}]}`))
	f.Add([]byte(`{"domain":"test","descriptors":[{"entries":[{"key":"user","value":"a"}],"hitsAddend":"0"}]}`))
	f.Add([]byte(`{"domain":"","descriptors":[]}`))
	f.Add([]byte(`[]`))
	dir := filepath.Join(f.TempDir(), "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(limitRules), 0o644); err != nil {
		f.Fatal(err)
	}
	ts := startWith(f, settingsFor(dir))
	url := "http://" + ts.HTTPAddr().String() + "/json"
	f.Fuzz(func(t *testing.T, body []byte) {
		code, out := post(t, url, string(body))
		switch code {
		case http.StatusOK, http.StatusTooManyRequests:
			var resp rlsv3.RateLimitResponse
			if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
				t.Fatalf("%d body %q is not a RateLimitResponse: %v", code, out, err)
			}
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("body %q: status %d %q", body, code, out)
		}
	})
}
