#!/usr/bin/env bash
# test.sh — what `make test` runs: scripts/verify.sh (gofmt, go mod tidy, the
# linter, generated files current), every test against real services started
# on free loopback ports (integration tests fail rather than skip if one is
# missing; chromium is installed too, for the buyer page's browser test), the
# packages with goroutines and locks again under the race detector against
# the same services, then the network guard: the unit tests again, without
# the services' settings, in a network namespace that has only loopback, so a
# test that reaches beyond 127.0.0.0/8 (the EC2 metadata address, an AWS
# endpoint) fails here rather than leaking. With arguments, a focused
# `go test` run instead (make chaos).
set -euo pipefail
cd "$(dirname "$0")/.."
export HOLDFAST_REQUIRE_SERVICES=1
# The buyer page's browser test needs chromium: services.sh installs it
# when missing (about 2 minutes, once).
export HOLDFAST_BROWSER=1
if [ $# -gt 0 ]; then
  exec scripts/with-services.sh go test -count=1 "$@"
fi
scripts/verify.sh

# The race detector on what runs concurrently: the service's caches and
# sweeps (shared/reservation), the adapters and handlers under their
# contract suites, the dev stack, its event source and gateway, the JWT
# issuer and the load tool. About 3 minutes on 2 cores.
race=(./shared/... ./internal/devstack ./internal/eventsource ./internal/devauth
  ./internal/loadgen ./cmd/load)
scripts/with-services.sh bash -c 'echo "== go vet" && go vet ./... && echo "== go test" && go test -count=1 -timeout 20m ./... &&
  echo "== go test -race" && go test -race -count=1 -timeout 20m "$@"' race "${race[@]}"

# The network guard. unshare -n needs root (or -r, user namespaces, without).
netns=(unshare -n)
[ "$(id -u)" = 0 ] || netns=(unshare -rn)
if ! command -v ip >/dev/null || ! "${netns[@]}" true 2>/dev/null; then
  echo "== network guard SKIPPED: ${netns[*]} is not permitted here (or iproute2's ip is missing);"
  echo "   the unit tests did not run cut off from the network"
  exit 0
fi
echo "== go test, unit tests only, in a network namespace with only loopback"
go mod download # the modules into the cache while the network is there
env -u HOLDFAST_REQUIRE_SERVICES GOFLAGS=-mod=mod GOPROXY=off HOLDFAST_NETWORK_GUARD=1 \
  "${netns[@]}" sh -c 'ip link set lo up && exec go test -count=1 -timeout 20m ./...'
