#!/usr/bin/env bash
# test.sh — what `make test` runs: install what is missing, start redis-server,
# MariaDB and the SQS-API server on free loopback ports, run every test against
# them (integration tests fail rather than skip if a service is missing), and
# stop what it started.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

dir=$(mktemp -d "${TMPDIR:-/tmp}/holdfast-test.XXXXXX")
cleanup() { scripts/services.sh stop "$dir" || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM

scripts/services.sh start "$dir"
set -a
# shellcheck disable=SC1091
. "$dir/env"
set +a
export HOLDFAST_REQUIRE_SERVICES=1

if [ $# -gt 0 ]; then # a focused run (make chaos): go test with these arguments
  go test -count=1 "$@"
  exit
fi
echo "== go vet"
go vet ./...
echo "== go test"
go test -count=1 -timeout 20m ./...
