#!/usr/bin/env bash
# services.sh — start or stop the local data tier holdfast runs against:
# redis-server, MariaDB and an SQS-API server (goaws), all on loopback. A thin
# wrapper of cmd/services (internal/services), the one place they are started.
#
#   scripts/services.sh install          install what is missing (apt, go tool)
#   scripts/services.sh start DIR        start everything with data under DIR;
#                                        writes DIR/env (shell exports) and DIR/pids
#   scripts/services.sh stop DIR         stop what `start DIR` started, by PID
#
# Ports are free ports chosen at start unless HOLDFAST_REDIS_PORT, HOLDFAST_DB_PORT
# or HOLDFAST_SQS_PORT are set. Everything binds to 127.0.0.1 only.
set -euo pipefail
# DIR is the caller's: make it absolute before moving to the repository.
args=("$@")
if [ $# -ge 2 ]; then
  [ "$1" = start ] && mkdir -p "$2"
  [ -d "$2" ] && args[1]=$(cd "$2" && pwd)
fi
cd "$(dirname "$0")/.."
mkdir -p bin
[ -x bin/services ] && [ -z "$(find cmd/services internal/services -newer bin/services -name '*.go' 2>/dev/null)" ] ||
  go build -o bin/services ./cmd/services
exec bin/services "${args[@]}"
