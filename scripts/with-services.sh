#!/usr/bin/env bash
# with-services.sh CMD [ARGS...] — start redis-server, MariaDB and the SQS-API
# server on free loopback ports (installing what is missing), run CMD with
# their settings exported (HOLDFAST_*, AWS_*), then stop what was started,
# whatever CMD's outcome. make test and make bench run through it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dir=$(mktemp -d "${TMPDIR:-/tmp}/holdfast-services.XXXXXX")
cleanup() { scripts/services.sh stop "$dir" || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
scripts/services.sh start "$dir"
set -a
# shellcheck disable=SC1091
. "$dir/env"
set +a
"$@"
