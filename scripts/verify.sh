#!/usr/bin/env bash
# verify.sh — what `make verify` runs, and `make test` first: the checks a
# machine makes so that a review does not have to. Every tracked Go file is
# gofmt'd; go.mod and go.sum are what `go mod tidy` makes them; golangci-lint
# (the version pinned in tools/go.mod, built into .holdfast/bin) passes with
# .golangci.yml; every generated file is what its generator makes of its
# source today (the *IsCurrent tests). The race detector runs in test.sh,
# against the services.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== gofmt"
# Tracked and new Go files (not those deleted but not yet committed).
mapfile -d '' gofiles < <(git ls-files -z --cached --others --exclude-standard -- '*.go')
existing=()
for f in "${gofiles[@]}"; do [ -e "$f" ] && existing+=("$f"); done
unformatted=$(gofmt -l "${existing[@]}")
if [ -n "$unformatted" ]; then
  echo "not gofmt'd (run gofmt -w on them):"; echo "$unformatted"; exit 1
fi

echo "== go mod tidy -diff"
go mod tidy -diff

echo "== golangci-lint"
lint=.holdfast/bin/golangci-lint-$(awk '$1 == "github.com/golangci/golangci-lint/v2" { print $2 }' tools/go.mod)
[ -x "$lint" ] || (cd tools && go build -o "../$lint" github.com/golangci/golangci-lint/v2/cmd/golangci-lint)
"$lint" run ./...

echo "== generated files are current"
go test -count=1 -run 'IsCurrent$' ./api/client ./cmd/bench
