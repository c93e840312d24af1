#!/usr/bin/env bash
# test.sh — what `make test` runs: every test against real services started on
# free loopback ports (integration tests fail rather than skip if one is
# missing). With arguments, a focused `go test` run instead (make chaos).
set -euo pipefail
cd "$(dirname "$0")/.."
export HOLDFAST_REQUIRE_SERVICES=1
if [ $# -gt 0 ]; then
  exec scripts/with-services.sh go test -count=1 "$@"
fi
exec scripts/with-services.sh bash -c 'echo "== go vet" && go vet ./... && echo "== go test" && go test -count=1 -timeout 20m ./...'
