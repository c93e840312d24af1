#!/usr/bin/env bash
# bench.sh — what `make bench` runs: start the services on free loopback ports,
# run cmd/bench (which rewrites docs/benchmarks.md), stop what it started.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=$(mktemp -d "${TMPDIR:-/tmp}/holdfast-bench.XXXXXX")
cleanup() { scripts/services.sh stop "$dir" || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
export HOLDFAST_DB_DURABLE=1 # MySQL as production runs it: a flush at every commit
scripts/services.sh start "$dir"
set -a
# shellcheck disable=SC1091
. "$dir/env"
set +a
export HOLDFAST_LOG_LEVEL=error HOLDFAST_DB_MAX_OPEN=64
go build -o bin/aws-lambda-rie github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie
go run ./cmd/bench "$@"
