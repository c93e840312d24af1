#!/usr/bin/env bash
# dev.sh — what `make dev` runs: start Redis, MariaDB and the SQS server on
# loopback with data under .holdfast/dev, then holdfast on 127.0.0.1:3000.
# Ctrl-C stops everything it started. MySQL data is reused between runs
# (Redis is warmed from it); RESET=1 starts from empty. Buyer routes check
# JWTs from the dev issuer whose key is in $dir/jwt (make token mints them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=${DEV_DIR:-.holdfast/dev}
if [ "${RESET:-0}" = 1 ]; then
  scripts/services.sh stop "$dir" 2>/dev/null || true
  rm -rf "$dir"
  echo "dev: reset: starting from empty data"
fi
stop() {
  # A closed terminal leaves nothing to write to: say it in the log instead.
  [ -t 1 ] || exec >>"$dir/dev.log" 2>&1
  scripts/services.sh stop "$dir"
  echo "dev: stopped everything it started"
}
trap stop EXIT
# Ctrl-C, kill and a closed terminal (SIGHUP) end the script through its
# EXIT trap (bash runs it only for a signal it traps); holdfast-dev stops on
# the same signals first.
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
# Fixed ports, the ones events/env.json points at (sam local invoke --env-vars).
export HOLDFAST_REDIS_PORT=${HOLDFAST_REDIS_PORT:-16379}
export HOLDFAST_DB_PORT=${HOLDFAST_DB_PORT:-13306}
export HOLDFAST_SQS_PORT=${HOLDFAST_SQS_PORT:-14100}
scripts/services.sh start "$dir"
set -a
# shellcheck disable=SC1091
. "$dir/env"
set +a
go build -o bin/holdfast-dev ./cmd/dev
bin/holdfast-dev -jwt-dir "$dir/jwt" "$@"
