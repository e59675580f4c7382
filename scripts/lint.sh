#!/usr/bin/env bash
# make lint: staticcheck over the module and its nested modules, installed
# with `go install` from the module proxy when missing. Fails on any finding;
# a finding that is right to keep is silenced where it stands with
# //lint:ignore and the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
VERSION=${STATICCHECK_VERSION:-v0.8.2}
BIN="$("$GO" env GOPATH)/bin"
export PATH="$BIN:$PATH"
if ! command -v staticcheck >/dev/null || ! staticcheck -version 2>/dev/null | grep -q "${VERSION#v}"; then
	echo "lint.sh: installing honnef.co/go/tools/cmd/staticcheck@$VERSION into $BIN" >&2
	"$GO" install "honnef.co/go/tools/cmd/staticcheck@$VERSION"
fi
for dir in . deploy/helm/charttest redisstore/clientbench; do
	echo "== staticcheck $dir" >&2
	(cd "$dir" && staticcheck ./...)
done
