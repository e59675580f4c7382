package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leapgate/leapgate/config"
)

// TestRLQSServed: with RLQS_ENABLED (the default) the gRPC port answers a
// filter's first usage report with an action for its bucket and the debug
// listener lists the allocations (JSON); with RLQS_ENABLED=false neither
// is there (Unimplemented, 404).
func TestRLQSServed(t *testing.T) {
	bucket := map[string]string{"user": "alice"}
	for _, enabled := range []bool{true, false} {
		t.Run(fmt.Sprint("RLQS_ENABLED=", enabled), func(t *testing.T) {
			ts := start(t, map[string]string{"rules.yaml": limitRules}, func(s *config.Settings) { s.RLQSEnabled = enabled })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream, err := rlqspb.NewRateLimitQuotaServiceClient(ts.conn(t)).StreamRateLimitQuotas(ctx)
			if err != nil {
				t.Fatal(err)
			}
			err = stream.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "test", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
				BucketId: &rlqspb.BucketId{Bucket: bucket}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 1,
			}}})
			if err != nil && enabled {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			switch {
			case !enabled:
				if status.Code(err) != codes.Unimplemented {
					t.Errorf("RLQS disabled: %v %v, want Unimplemented", resp, err)
				}
			case err != nil:
				t.Fatalf("first report: %v", err)
			case len(resp.GetBucketAction()) != 1 || !maps.Equal(resp.GetBucketAction()[0].GetBucketId().GetBucket(), bucket):
				t.Errorf("first report answered with %v, want one action for %v", resp, bucket)
			}
			code, body := get(t, ts.debugURL("/rlqs"))
			want := http.StatusNotFound
			if enabled {
				want = http.StatusOK
			}
			if code != want || enabled && !json.Valid([]byte(body)) {
				t.Errorf("GET /rlqs on the debug listener: %d %q, want %d (with JSON when served)", code, body, want)
			}
		})
	}
}
