package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/pprof"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/leapgate/leapgate/observe"
)

// httpHandler serves the HTTP listener: /healthcheck, /json and /metrics.
func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", s.handleHealthcheck)
	mux.Handle("/json", s.recoverHTTP("/json", requireJSON(http.HandlerFunc(s.handleJSON))))
	mux.Handle("/metrics", s.metricsHandler())
	return mux
}

// metricsHandler serves the registry in the Prometheus formats.
func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{
		Registry:          s.registry,
		ErrorLog:          slogPrinter{s},
		EnableOpenMetrics: true,
	})
}

// reportHandler serves the report listener: POST /report, observations for
// the circuit breakers, behind the REPORT_TOKEN bearer check when one is set.
func (s *Server) reportHandler() http.Handler {
	mux := http.NewServeMux()
	report := observe.NewReport(observe.Options{Registry: s.breakers})
	mux.Handle("/report", s.recoverHTTP("/report", requireBearer(s.settings.ReportToken, requireJSON(report))))
	return mux
}

// requireBearer passes to h only requests whose Authorization header is
// "Bearer <token>" (bearerMatches: the scheme in any case, the token
// compared in constant time), answering 401 otherwise; an empty token lets
// every request through.
func requireBearer(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !bearerMatches(r.Header.Get("Authorization"), token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="leapgate report"`)
			http.Error(w, "report: missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// requireJSON passes to h only requests that say their body is JSON
// (Content-Type application/json, with any parameters), answering 415
// otherwise. A web page cannot post application/json cross-origin without
// a CORS preflight, which text/plain and form bodies skip, so a browser
// cannot be made to send reports or rate-limit calls.
func requireJSON(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
				http.Error(w, "Content-Type must be application/json", http.StatusUnsupportedMediaType)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// debugHandler serves the debug listener: /rlconfig, /breakers and pprof, on
// a private mux (never http.DefaultServeMux).
func (s *Server) debugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "/rlconfig           loaded rules\n/breakers           circuit breakers (JSON)\n/breakers/override  manual overrides: GET lists, POST rule=&mode=force_open|force_closed|disabled|auto[&resource=]\n/rlqs               RLQS allocations per limit and client (JSON)\n/debug/pprof/       Go profiles\n")
	})
	if s.quota != nil {
		mux.Handle("/rlqs", s.quota.Handler())
	}
	mux.HandleFunc("/rlconfig", s.handleRLConfig)
	mux.Handle("/breakers", s.breakers.Handler())
	mux.Handle("/breakers/override", s.breakers.OverrideHandler())
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// handleHealthcheck answers 200 OK while serving and 500 otherwise (no rules
// loaded yet, or shutting down), as envoyproxy/ratelimit does.
func (s *Server) handleHealthcheck(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !s.health.isServing() {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "NOT_SERVING\n")
		return
	}
	io.WriteString(w, "OK\n")
}

// handleRLConfig dumps the rules in service, one per line.
func (s *Server) handleRLConfig(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, s.service.Rules().Dump())
}

// handleJSON answers a proto3-JSON RateLimitRequest with the proto3-JSON
// RateLimitResponse: 200 when OK, 429 when OVER_LIMIT. Errors are plain
// text: 400 for a malformed request, 415 for a Content-Type other than
// application/json, 413 for a body over
// MAX_REQUEST_BYTES, 503 when no rules are loaded, 500 otherwise.
func (s *Server) handleJSON(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "use POST with a JSON RateLimitRequest", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.settings.MaxRequestBytes)))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			http.Error(w, fmt.Sprintf("request body is larger than %d bytes", mbe.Limit), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	// Invalid UTF-8 is a value like any other (as over gRPC), but proto3
	// JSON refuses it: it becomes U+FFFD, which leaves the JSON syntax,
	// all ASCII, as it was.
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(bytes.ToValidUTF8(body, []byte("\uFFFD")), &req); err != nil {
		http.Error(w, "invalid RateLimitRequest JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := s.service.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		st := status.Convert(err)
		http.Error(w, st.Message(), httpStatus(st.Code()))
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	code := http.StatusOK
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OK:
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		code = http.StatusTooManyRequests
	default:
		code = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(out)
}

// httpStatus maps a gRPC error code of ShouldRateLimit to an HTTP status.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded, codes.Canceled:
		return http.StatusGatewayTimeout
	default:
		return http.StatusInternalServerError
	}
}

// recoverHTTP answers 500 for a panicking handler, logging the stack and
// counting it, instead of dropping the connection.
func (s *Server) recoverHTTP(name string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var err error
		defer func() {
			if err != nil {
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		defer recoverTo(&err, name, s.logger, s.metrics)
		h.ServeHTTP(w, r)
	})
}

// slogPrinter adapts the server's logger to promhttp's ErrorLog.
type slogPrinter struct{ s *Server }

func (p slogPrinter) Println(v ...any) {
	p.s.logger.Error("serving /metrics", "error", fmt.Sprint(v...))
}
