# syntax=docker/dockerfile:1
#
# Leapgate container images (multi-stage):
#
#   docker build -t leapgate .                                  # the service (default, last stage)
#   docker build --target demo-upstream -t leapgate-demo-upstream .
#
# Static binaries (CGO_ENABLED=0) on distroless/static: CA certificates and
# tzdata, no shell, a non-root user (65532). Without a shell or curl, the
# HEALTHCHECK runs the tiny cmd/healthprobe binary shipped in the image.

FROM golang:1.26-bookworm AS build
# The release the binary reports (ratelimit --version, leapgate_build_info):
#   docker build --build-arg VERSION=v1.2.3 .
ARG VERSION=dev
WORKDIR /src
ENV CGO_ENABLED=0 GOOS=linux GOFLAGS=-trimpath
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags="-s -w -X github.com/leapgate/leapgate/server.linkedVersion=${VERSION}" -o /out/ratelimit ./cmd/ratelimit && \
    go build -ldflags="-s -w" -o /out/healthprobe ./cmd/healthprobe && \
    go build -ldflags="-s -w" -o /out/demo-upstream ./cmd/demo-upstream

# The demo's upstream: latency and error rate changeable at run time.
FROM gcr.io/distroless/static-debian12:nonroot AS demo-upstream
COPY --from=build /out/demo-upstream /out/healthprobe /usr/local/bin/
USER nonroot:nonroot
# 8080 traffic, 8000 admin (/faults, /healthz).
EXPOSE 8080 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/healthprobe", "http://127.0.0.1:8000/healthz"]
ENTRYPOINT ["/usr/local/bin/demo-upstream"]

# The Leapgate service.
FROM gcr.io/distroless/static-debian12:nonroot AS ratelimit
ARG VERSION=dev
LABEL org.opencontainers.image.title="leapgate" \
      org.opencontainers.image.description="Envoy rate-limit service with sliding windows and circuit breakers" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/leapgate/leapgate" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ratelimit /out/healthprobe /usr/local/bin/
# envoyproxy/ratelimit's image has its binary at /bin/ratelimit, and so
# do the manifests (and Envoy Gateway) written for it.
COPY --from=build /out/ratelimit /bin/ratelimit
# Rules are read from $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY:
# mount them at /data/ratelimit/config.
ENV RUNTIME_ROOT=/data RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_APPDIRECTORY=config
USER nonroot:nonroot
# 8081 gRPC (rate limit, ext_proc, access log), 8080 HTTP (/healthcheck,
# /json, /metrics). The debug port 6070 and the report port 8082 (POST
# /report) listen on loopback only; REPORT_HOST with REPORT_TOKEN opens the
# latter.
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/healthprobe", "http://127.0.0.1:8080/healthcheck"]
ENTRYPOINT ["/usr/local/bin/ratelimit"]
