#!/usr/bin/env bash
# bench.sh — what `make bench` runs: cmd/bench against real services, MariaDB
# durable as production runs MySQL (a flush and a binlog sync at every commit).
# cmd/bench rewrites docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
# HOLDFAST_BENCH=1: the services script installs wrk too (the stack part's load generator).
export HOLDFAST_DB_DURABLE=1 HOLDFAST_LOG_LEVEL=error HOLDFAST_DB_MAX_OPEN=64 HOLDFAST_BENCH=1
go build -o bin/aws-lambda-rie github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie
exec scripts/with-services.sh go run ./cmd/bench "$@"
