#!/usr/bin/env bash
# Runs every test of the repository on a fresh machine: installs what the
# tests need (redis-server for the Redis integration tests, the tools), then
# gofmt, go vet, the race-enabled test suite, the nested modules,
# staticcheck, and a short run of each fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."

# A fresh machine may have Go installed without it on PATH.
if ! command -v "${GO:-go}" >/dev/null && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-5s}

need_redis() {
	command -v redis-server >/dev/null && return 0
	if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
		echo "test.sh: redis-server missing; installing redis-server and redis-tools with apt-get" >&2
		DEBIAN_FRONTEND=noninteractive apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
		# Debian starts a system redis on :6379 after install; the tests
		# start their own on free ports and need none.
		command -v redis-server >/dev/null && return 0
	fi
	cat >&2 <<'MSG'
test.sh: the Redis integration tests need redis-server on PATH.
Install it, for example:
  Debian/Ubuntu: sudo apt-get install -y redis-server redis-tools
  macOS:         brew install redis
then run `make test` again.
MSG
	exit 1
}

need_redis

# Tools the deploy/ tests and the lint run, installed from the Go module
# proxy when missing: promtool (metric conventions, alert rules), helm (the
# chart), staticcheck (make lint) and grpcurl (the docs' shell blocks).
# They build in the background while the suite runs; the deploy tests are
# run again, with the tools required, once they are there. promtool is
# built without Prometheus's service-discovery plugins (remove_all_sd),
# which checking rules and metrics does not use: about 1.5 minutes on a
# 2-core machine instead of more than 3.
TOOLS=(
	"promtool github.com/prometheus/prometheus/cmd/promtool@v0.316.0 -tags=remove_all_sd"
	"helm helm.sh/helm/v3/cmd/helm@v3.22.0"
	"staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2"
	"grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4"
)
GOBIN_DIR=$("$GO" env GOBIN)
[ -n "$GOBIN_DIR" ] || GOBIN_DIR="$("$GO" env GOPATH | cut -d: -f1)/bin"
export PATH="$PATH:$GOBIN_DIR"
tools_log=$(mktemp)
(
	for tool in "${TOOLS[@]}"; do
		read -r name module flags <<<"$tool"
		command -v "$name" >/dev/null && continue
		echo "test.sh: $name missing; go install $flags $module" >&2
		# shellcheck disable=SC2086 # flags is a word list
		"$GO" install $flags "$module" || exit 1
	done
	# Build the chart tests (the Kubernetes API types) meanwhile too.
	(cd deploy/helm/charttest && "$GO" test -count=1 -run '^$' ./...) || exit 1
) >"$tools_log" 2>&1 &
tools_pid=$!

echo "== gofmt" >&2
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.git/*'))
if [ -n "$unformatted" ]; then
	echo "gofmt needed on:" >&2
	echo "$unformatted" >&2
	exit 1
fi

echo "== go vet ./..." >&2
"$GO" vet ./...

# Tests that measure real time (full capacity of the real binary, the soak)
# run once the tools have built, so that no compiler competes with them
# for the CPU.
REALTIME_PKGS=(./cmd/ratelimit ./soak)
mapfile -t pkgs < <("$GO" list ./... | grep -v -e '/cmd/ratelimit$' -e '/soak$')
echo "== go test -race (all but ${REALTIME_PKGS[*]})" >&2
"$GO" test -race -count=1 -timeout 15m "${pkgs[@]}"

echo "== waiting for promtool, helm, staticcheck and grpcurl" >&2
if ! wait "$tools_pid"; then
	cat "$tools_log" >&2
	echo "test.sh: installing the tools above failed; they need the Go module proxy" >&2
	exit 1
fi
rm -f "$tools_log"

echo "== go test -race ${REALTIME_PKGS[*]}" >&2
"$GO" test -race -count=1 -timeout 15m "${REALTIME_PKGS[@]}"

echo "== deploy/ tests with promtool and helm, the docs' shell blocks with grpcurl" >&2
LEAPGATE_REQUIRE_TOOLS=1 "$GO" test -count=1 ./deploy/...
LEAPGATE_REQUIRE_TOOLS=1 "$GO" test -count=1 -run '^TestDocShellBlocks$' ./examples
# The Helm chart's tests are a module of their own (the Kubernetes API
# types stay out of the service's module).
(
	cd deploy/helm/charttest
	"$GO" vet ./...
	LEAPGATE_REQUIRE_TOOLS=1 "$GO" test -count=1 ./...
)

# The Redis client comparison is a module of its own too (rueidis stays
# out of the service's module): a short run keeps it working.
echo "== redisstore/clientbench (a short run of the client comparison)" >&2
(
	cd redisstore/clientbench
	"$GO" vet ./...
	"$GO" test -count=1 -run '^$' -bench . -benchtime 200x ./...
) || exit 1

# The race detector's shadow memory makes a heap bound meaningless, so the
# race run streams 100k keys; the full 1,000,000-key memory test runs here.
echo "== go test (no race) window bounded memory, 1M keys" >&2
"$GO" test -count=1 -run '^TestStoreBoundedMemory$' ./window

echo "== make lint (staticcheck)" >&2
GO="$GO" scripts/lint.sh

# Fuzz targets, each run for FUZZTIME: every Fuzz function of the module
# ("package FuzzName" per line, from go test -list, so a new target runs
# without being listed here). Findings are written to the package's
# testdata/fuzz and must become regression tests.
FUZZ_TARGETS=()
if [ "$FUZZTIME" != "0" ] && [ "$FUZZTIME" != "0s" ]; then
	listing=$("$GO" test -list '^Fuzz' ./...) || exit 1
	mapfile -t FUZZ_TARGETS < <(awk '/^Fuzz/ {names[n++] = $1; next} /^ok/ {for (i = 0; i < n; i++) print $2 " " names[i]; n = 0}' <<<"$listing")
	[ "${#FUZZ_TARGETS[@]}" -gt 0 ] || { echo "no fuzz targets found" >&2; exit 1; }
fi

if [ "$FUZZTIME" != "0" ] && [ "$FUZZTIME" != "0s" ]; then
	for target in "${FUZZ_TARGETS[@]}"; do
		read -r pkg name <<<"$target"
		echo "== fuzz $pkg $name ($FUZZTIME)" >&2
		out=$(mktemp)
		if ! "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg" 2>&1 | tee "$out"; then
			# The fuzzing engine sometimes fails its own run at the end of
			# -fuzztime with "context deadline exceeded" and no failing
			# input (nothing written to testdata/fuzz): run it once more.
			# A real finding names the input it wrote and fails again.
			if grep -q 'context deadline exceeded' "$out" && ! grep -q 'Failing input written to' "$out"; then
				echo "== fuzz $pkg $name: the fuzzer timed itself out without a finding; once more" >&2
				"$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg"
			else
				rm -f "$out"
				exit 1
			fi
		fi
		rm -f "$out"
	done
fi
echo "== all tests passed" >&2
