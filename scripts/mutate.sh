#!/usr/bin/env bash
# Mutation testing (make mutate): runs gremlins over the packages whose
# behaviour the tests must defend, one package at a time, and prints each
# package's efficacy (killed / (killed + lived)). A mutant that lives is a
# behaviour no test defends: add the test. Not part of `make test` (each
# mutant reruns the package's tests); run it when a package's behaviour
# changes. Installs gremlins with `go install` when it is missing.
#
#   make mutate                       # every package below
#   MUTATE_PKGS="./window" make mutate
#   make mutate-changed               # only the packages a change touched
#
# Each package's scores replace its row in docs/development.md's table.
#
# The tests run with -short: the few long tests that skip themselves in
# short mode (soaks, failovers, size sweeps) do not run for every mutant,
# so a mutant only they would kill counts as lived and each efficacy is a
# lower bound. MUTATE_TIMEOUT_COEFFICIENT (default 20) scales gremlins'
# per-mutant timeout (the suite's time under coverage times it);
# MUTATE_WORKERS (default 1) runs that many mutants at once.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v "${GO:-go}" >/dev/null && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
GO=${GO:-go}
GREMLINS_VERSION=${GREMLINS_VERSION:-v0.6.0}
BIN="$("$GO" env GOPATH)/bin"
export PATH="$BIN:$PATH"
if ! command -v gremlins >/dev/null; then
	echo "mutate.sh: installing github.com/go-gremlins/gremlins@$GREMLINS_VERSION into $BIN" >&2
	"$GO" install "github.com/go-gremlins/gremlins/cmd/gremlins@$GREMLINS_VERSION"
fi

# Every package whose behaviour the tests must defend (docs/development.md).
ALL_PKGS="./window ./descriptors ./breaker ./service ./redisstore ./observe ./config ./xds"
PKGS=${MUTATE_PKGS:-$ALL_PKGS}
# MUTATE_CHANGED=1 (make mutate-changed): only those of them that the
# change since MUTATE_BASE touched (default origin/main if it exists, else
# the commit before HEAD), working tree included.
if [ "${MUTATE_CHANGED:-}" = 1 ]; then
	base=${MUTATE_BASE:-}
	if [ -z "$base" ]; then
		base=$(git rev-parse -q --verify origin/main || git rev-parse HEAD~1)
	fi
	changed=$(git diff --name-only "$base" -- '*.go' | xargs -r -n1 dirname | sort -u)
	PKGS=""
	for pkg in $ALL_PKGS; do
		if grep -qx "${pkg#./}" <<<"$changed"; then
			PKGS="$PKGS $pkg"
		fi
	done
	if [ -z "$PKGS" ]; then
		echo "mutate.sh: no package of '$ALL_PKGS' changed since $base" >&2
		exit 0
	fi
	echo "mutate.sh: packages changed since $base:$PKGS" >&2
fi

# record writes pkg's scores into the table of docs/development.md
# (between its mutate-table markers), replacing the package's row or
# adding it, with the date, the commit and the gremlins version.
DOC=docs/development.md
record() {
	local pkg=$1 out=$2
	num() { grep -oE "$1: [0-9.]+" <<<"$out" | head -1 | grep -oE '[0-9.]+$' || echo "?"; }
	local row
	row=$(printf '| `%s` | %s | %s | %s | %s | %s%% | %s%% | %s, %s, gremlins %s |' "${pkg#./}" \
		"$(num Killed)" "$(num Lived)" "$(num 'Timed out')" "$(num 'Not covered')" \
		"$(num 'Test efficacy')" "$(num 'Mutator coverage')" \
		"$(date -u +%Y-%m-%d)" "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- "*.go" || echo "+changes")" "$GREMLINS_VERSION")
	awk -v pkg="| \`${pkg#./}\` |" -v row="$row" '
		/<!-- mutate-table -->/ { inside = 1 }
		inside && index($0, pkg) == 1 { print row; done = 1; next }
		inside && /<!-- \/mutate-table -->/ { if (!done) print row; inside = 0 }
		{ print }
	' "$DOC" >"$DOC.tmp" && mv "$DOC.tmp" "$DOC"
}

# The Redis tests start redis-server; scripts/test.sh installs it.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-short"
summary=()
for pkg in $PKGS; do
	echo "== gremlins unleash $pkg" >&2
	start=$(date +%s)
	out=$(gremlins unleash --workers "${MUTATE_WORKERS:-1}" --timeout-coefficient "${MUTATE_TIMEOUT_COEFFICIENT:-20}" --exclude-files '_test\.go$' "$pkg" 2>&1 | tee -a /dev/stderr)
	summary+=("$pkg ($(($(date +%s) - start)) s): $(grep -E 'Test efficacy|Mutator coverage|Killed:|Timed out:' <<<"$out" | tr -s ' ' | tr '\n' ' ')")
	if grep -q 'Test efficacy' <<<"$out"; then
		record "$pkg" "$out"
	fi
done
echo "== mutation scores (written to $DOC)" >&2
printf '%s\n' "${summary[@]}"
