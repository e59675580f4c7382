package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// probes runs 15 kubelet-style health probes on addr, 200 ms apart: a
// fresh connection each, GET /healthcheck, a 1 s timeout. It returns how
// many answered 200, and the errors of the others.
func probes(addr string) (int, []string) {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	ok, errs := 0, []string(nil)
	for range 15 {
		resp, err := client.Get("http://" + addr + "/healthcheck")
		switch {
		case err != nil:
			errs = append(errs, err.Error())
		case resp.StatusCode != http.StatusOK:
			errs = append(errs, resp.Status)
		default:
			ok++
		}
		if resp != nil {
			resp.Body.Close()
		}
		time.Sleep(200 * time.Millisecond)
	}
	return ok, errs
}

// holder keeps the attack's connections and closes them at the end.
type holder struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (h *holder) add(c net.Conn) {
	h.mu.Lock()
	h.conns = append(h.conns, c)
	h.mu.Unlock()
}

func (h *holder) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.Close()
	}
}

// TestBinaryHealthUnderConnectionFloods: the attacks of the hardening
// issue against the real binary with default settings. 512 keep-alive
// connections that asked for /healthcheck once and went silent (every
// slot of HTTP_MAX_CONNECTIONS), or clients that trickle their headers
// and reconnect 65 times a second, must not fail a kubelet's health
// probe (15 of 15 pass): idle and trickling connections are evicted at
// the cap.
func TestBinaryHealthUnderConnectionFloods(t *testing.T) {
	if testing.Short() {
		t.Skip("floods the real binary")
	}
	t.Run("idle keep-alive connections", func(t *testing.T) {
		rb := startBinary(t, nil, "RUNTIME_ROOT="+ruleRoot(t, rules))
		h := &holder{}
		defer h.close()
		for range 512 {
			c, err := net.Dial("tcp", rb.httpAddr)
			if err != nil {
				t.Fatal(err)
			}
			h.add(c)
			fmt.Fprintf(c, "GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 512)
			if _, err := c.Read(buf); err != nil && len(h.conns) < 500 {
				t.Fatalf("connection %d: no answer: %v", len(h.conns), err)
			}
		}
		if ok, errs := probes(rb.httpAddr); ok != 15 {
			t.Errorf("%d of 15 health probes passed with 512 idle keep-alive connections: %v", ok, errs)
		}
	})
	t.Run("trickling headers", func(t *testing.T) {
		rb := startBinary(t, nil, "RUNTIME_ROOT="+ruleRoot(t, rules))
		h := &holder{}
		defer h.close()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		// A new trickling client every 15 ms (65 a second), each sending
		// a header byte every 500 ms until the server closes it.
		wg.Go(func() {
			tick := time.NewTicker(15 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				wg.Go(func() {
					c, err := net.Dial("tcp", rb.httpAddr)
					if err != nil {
						return
					}
					h.add(c)
					for _, b := range []byte("GET /healthcheck HTTP/1.1\r\nX-Slow: " + strings.Repeat("a", 100)) {
						if _, err := c.Write([]byte{b}); err != nil {
							return
						}
						select {
						case <-ctx.Done():
							return
						case <-time.After(500 * time.Millisecond):
						}
					}
				})
			}
		})
		time.Sleep(10 * time.Second) // past HTTP_READ_TIMEOUT: the slots are full of tricklers
		if ok, errs := probes(rb.httpAddr); ok != 15 {
			t.Errorf("%d of 15 health probes passed with clients trickling headers at 65 a second: %v", ok, errs)
		}
	})
}

// TestBinaryGRPCUnderSilentConnections: under a 1,024 file-descriptor
// limit, 1,100 TCP connections to the gRPC port that send nothing, or only
// the HTTP/2 preface, neither break an Envoy's open connection nor keep a
// new one from being served, nor fail the health probes: the gRPC
// listener's cap (half the descriptors) keeps the process clear of
// EMFILE, and at the cap a connection that has not started a call within
// a second is evicted for the new one.
func TestBinaryGRPCUnderSilentConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("floods the real binary")
	}
	for _, tt := range []struct {
		name string
		send []byte
	}{
		{"silent", nil},
		{"preface only", []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rb := startBinaryWithFileLimit(t, 1024, "RUNTIME_ROOT="+ruleRoot(t, rules))
			envoy := rb.dial(t) // an Envoy already connected
			req := &rlsv3.RateLimitRequest{Domain: "bin"}
			call := func(c rlsv3.RateLimitServiceClient) error {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_, err := c.ShouldRateLimit(ctx, req)
				return err
			}
			if err := call(envoy); err != nil {
				t.Fatal(err)
			}
			h := &holder{}
			defer h.close()
			for i := range 1100 {
				c, err := net.DialTimeout("tcp", rb.grpcAddr, time.Second)
				if err != nil {
					t.Fatalf("attack connection %d: %v", i, err)
				}
				h.add(c)
				if tt.send != nil {
					c.Write(tt.send)
				}
			}
			time.Sleep(1500 * time.Millisecond) // older than the eviction grace
			if err := call(envoy); err != nil {
				t.Errorf("the connected Envoy's call during the attack: %v", err)
			}
			cc, err := grpc.NewClient(rb.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			if err := call(rlsv3.NewRateLimitServiceClient(cc)); err != nil {
				t.Errorf("a new Envoy connection's call during the attack: %v", err)
			}
			hc, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
			if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("gRPC health during the attack: %v %v", hc, err)
			}
			if ok, errs := probes(rb.httpAddr); ok != 15 {
				t.Errorf("%d of 15 HTTP health probes passed: %v", ok, errs)
			}
			resp, err := http.Get("http://" + rb.httpAddr + "/metrics")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				for _, l := range strings.Split(string(b), "\n") {
					if strings.HasPrefix(l, "leapgate_connections_evicted_total{listener=\"grpc\"}") || strings.HasPrefix(l, "leapgate_grpc_connections_limited_total") {
						t.Log(l)
					}
				}
			}
		})
	}
}
