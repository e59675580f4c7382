# Leapgate: `make run` serves on the embedded example rules, `make test` runs
# every test (what .ci/run calls), `make check` is the quick loop (seconds to
# a minute, nothing installed), `make lint` runs staticcheck, `make bench`
# runs the benchmarks.

GO ?= go
# Benchmarks: run `make bench > old.txt`, change code, `make bench > new.txt`,
# then `benchstat old.txt new.txt` (golang.org/x/perf/cmd/benchstat).
BENCH_COUNT ?= 6
BENCH_TIME ?= 200ms
BENCH ?= .
BENCH_PKGS ?= ./...
# Fuzzing time per fuzz target in `make test` (0 skips fuzzing).
FUZZTIME ?= 5s
# Length of `make soak` (`make test` runs the same soak for 3s per backend).
SOAK ?= 3m

# staticcheck's version for `make lint` (installed with go install when missing).
STATICCHECK_VERSION ?= v0.8.2

.PHONY: run test check lint bench figures soak check-config accuracy loadtest compare mutate mutate-changed rlqs-sim

run:
	EXAMPLE_RULES=true $(GO) run ./cmd/ratelimit

test:
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/test.sh

# The contributor's loop: formatting, vet and every package's tests, without
# the race detector, installs, fuzzing or the nested modules (make test runs
# those). Tests that need redis-server skip without it.
check:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: the files above need formatting"; exit 1; }
	$(GO) vet ./...
	$(GO) test ./...

# staticcheck over the module and the nested ones (make test runs it too).
lint:
	GO=$(GO) STATICCHECK_VERSION=$(STATICCHECK_VERSION) scripts/lint.sh

bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -count $(BENCH_COUNT) -benchtime $(BENCH_TIME) $(BENCH_PKGS)

# Re-measure every figure of docs/benchmarks.md, docs/accuracy.md and docs/rlqs.md: each
# block's command runs and its output replaces the block, stamped with the
# commit, date and CPU (FIGURES='regex' limits it to matching commands).
# Slow (the load tests and every benchmark): run it on an idle machine.
FIGURES ?=
figures:
	$(GO) run ./cmd/figures -only '$(FIGURES)'

# Load test of a real server (ShouldRateLimit, /json, ext_proc, reloads, a
# Redis restart) under -race, checking errors, heap and exact counts.
# Then ./soak: persistent Redis killed and restarted mid-run, exact counts per key.
soak:
	LEAPGATE_SOAK=$(SOAK) $(GO) test -race -count=1 -run '^TestSoak$$' -timeout 30m -v ./server
	SOAK_DURATION=$(SOAK) $(GO) test -race -count=1 -run '^TestSoak$$' -timeout 10m -v ./soak/

# Accuracy of every admission algorithm against an exact sliding log on a
# virtual clock (deterministic tables; see docs/accuracy.md).
accuracy:
	$(GO) run ./cmd/accuracy

# The RLQS fleet simulator: simulated Envoy rate_limit_quota filters against
# the RLQS server on a virtual clock, scored per window (docs/rlqs.md).
# RLQS_SIM_ARGS='-addr 127.0.0.1:8081' runs the fleet against a running binary.
rlqs-sim:
	$(GO) run ./cmd/rlqs-sim $(RLQS_SIM_ARGS)

# Load test of the real binary over loopback gRPC next to an empty-handler
# ceiling (see docs/benchmarks.md); LOADTEST_FLAGS=-backend both adds Redis.
LOADTEST_FLAGS ?= -duration 10s -concurrency 32 -backend both
loadtest:
	$(GO) run ./cmd/loadtest $(LOADTEST_FLAGS)

# Leapgate (memory, Redis) against envoyproxy/ratelimit, built from its Go
# module, on one redis-server, in interleaved rounds (see docs/redis.md).
COMPARE_FLAGS ?= -concurrency 50 -connections 1 -duration 5s -warmup 1s -rounds 3
compare:
	$(GO) run ./cmd/loadtest -compare $(COMPARE_FLAGS)

# Mutation testing with gremlins (installed when missing) over the packages
# whose behaviour the tests defend; see docs/development.md. Slow: not part
# of `make test`. MUTATE_PKGS="./window" limits it.
mutate:
	GO=$(GO) scripts/mutate.sh

# Mutation testing of only the packages changed since origin/main (or the
# commit before HEAD; MUTATE_BASE=<rev> to choose).
mutate-changed:
	MUTATE_CHANGED=1 GO=$(GO) scripts/mutate.sh

# Validate a rule directory: make check-config DIR=path/to/rules
check-config:
	$(GO) run ./cmd/ratelimit check-config $(DIR)
