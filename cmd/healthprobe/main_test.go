package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestProbe(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		delay   time.Duration
		wantErr bool
	}{
		{name: "ok", status: 200},
		{name: "no content", status: 204},
		{name: "unhealthy", status: 500, wantErr: true},
		{name: "not found", status: 404, wantErr: true},
		{name: "too slow", status: 200, delay: time.Second, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.delay > 0 {
					select {
					case <-time.After(tt.delay):
					case <-r.Context().Done():
					}
				}
				w.WriteHeader(tt.status)
			}))
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			err := probe(ctx, srv.Client(), srv.URL+"/healthcheck")
			if (err != nil) != tt.wantErr {
				t.Fatalf("probe = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}

func TestProbeRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	if err := probe(context.Background(), http.DefaultClient, url); err == nil {
		t.Fatal("probe of a closed port succeeded")
	}
}
