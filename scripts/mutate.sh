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

PKGS=${MUTATE_PKGS:-"./window ./descriptors ./service ./breaker ./redisstore"}
# The Redis tests start redis-server; scripts/test.sh installs it.
summary=()
for pkg in $PKGS; do
	echo "== gremlins unleash $pkg" >&2
	out=$(gremlins unleash --workers 1 --timeout-coefficient 20 --exclude-files '_test\.go$' "$pkg" 2>&1 | tee -a /dev/stderr)
	summary+=("$pkg: $(grep -E 'Test efficacy|Mutator coverage|Killed:|Timed out:' <<<"$out" | tr -s ' ' | tr '\n' ' ')")
done
echo "== mutation scores" >&2
printf '%s\n' "${summary[@]}"
