package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/leapgate/leapgate/config"
)

// The tests of this file are the attacks of issue 13 §3: strangers who
// reach a port open breakers with forged reports, from a browser page
// (text/plain posts need no CORS preflight), or squat the per-rule breaker
// slots with junk values.

const perClusterBreakers = `domain: breaker
descriptors:
  - key: destination_cluster
    circuit_breaker:
      strategy: error_count
      threshold: 3
      window: 1h
      buckets: 10
      open_duration: 1h
`

// postAs sends body to url with the given content type and headers.
func postAs(t *testing.T, url, contentType, body string, header ...string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestReportIsNotOnThePublicPort(t *testing.T) {
	ts := start(t, map[string]string{"breaker.yaml": breakerRules}, nil)
	if code := postAs(t, ts.httpURL("/report"), "application/json", `{"cluster":"backend","status":503}`); code != http.StatusNotFound {
		t.Errorf("/report on the public HTTP port = %d, want 404", code)
	}
	if host := ts.ReportAddr().String(); !strings.HasPrefix(host, "127.0.0.1:") {
		t.Errorf("report listener on %s, want loopback by default", host)
	}
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""} {
		if code := postAs(t, ts.reportURL(), ct, `{"cluster":"backend","status":503}`); code != http.StatusUnsupportedMediaType {
			t.Errorf("/report as %q = %d, want 415", ct, code)
		}
		if code := postAs(t, ts.httpURL("/json"), ct, `{"domain":"breaker"}`); code != http.StatusUnsupportedMediaType {
			t.Errorf("/json as %q = %d, want 415", ct, code)
		}
	}
	if code := postAs(t, ts.reportURL(), "application/json; charset=utf-8", `{"cluster":"backend","status":503}`); code != http.StatusNoContent {
		t.Errorf("/report as JSON = %d, want 204", code)
	}
}

func TestReportToken(t *testing.T) {
	ts := start(t, map[string]string{"breaker.yaml": breakerRules}, func(s *config.Settings) { s.ReportToken = "s3cret" })
	client := ts.rls(t)
	const body = `{"cluster":"backend","status":503}`
	for _, auth := range []string{"", "Bearer wrong", "Bearer s3cret2", "Basic czNjcmV0", "Bearers3cret"} {
		for range 3 {
			if code := postAs(t, ts.reportURL(), "application/json", body, "Authorization", auth); code != http.StatusUnauthorized {
				t.Fatalf("report with Authorization %q = %d, want 401", auth, code)
			}
		}
	}
	resp, err := client.ShouldRateLimit(context.Background(), request("breaker", []string{"destination_cluster", "backend"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after refused reports: %v %v, want the breaker closed", resp, err)
	}
	for _, auth := range []string{"Bearer s3cret", "bearer s3cret", "BEARER s3cret"} { // the scheme in any case
		if code := postAs(t, ts.reportURL(), "application/json", body, "Authorization", auth); code != http.StatusNoContent {
			t.Fatalf("report with Authorization %q = %d, want 204", auth, code)
		}
	}
	resp, err = client.ShouldRateLimit(context.Background(), request("breaker", []string{"destination_cluster", "backend"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("after 3 authorised errors: %v %v, want the breaker open", resp, err)
	}
}

// 1,100 junk resources, more than the 1,000 breakers a rule may hold, do
// not keep a real upstream's breaker from opening.
func TestJunkReportsDoNotSquatBreakers(t *testing.T) {
	ts := start(t, map[string]string{"breaker.yaml": perClusterBreakers}, nil)
	for i := range 1100 {
		if code := postAs(t, ts.reportURL(), "application/json", fmt.Sprintf(`{"cluster":"junk-%d","status":200}`, i)); code != http.StatusNoContent {
			t.Fatalf("junk report %d = %d", i, code)
		}
	}
	for range 3 {
		postAs(t, ts.reportURL(), "application/json", `{"cluster":"orders","status":503}`)
	}
	resp, err := ts.rls(t).ShouldRateLimit(context.Background(), request("breaker", []string{"destination_cluster", "orders"}))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("orders after 3 errors behind 1,100 junk resources: %v %v, want its breaker open", resp, err)
	}
	if got := metricValue(t, ts, `leapgate_breaker_reclaimed_total{rule="breaker.destination_cluster"}`); got != "101" {
		t.Errorf("reclaimed = %s, want 101", got)
	}
}
