# holdfast — make dev runs it locally; make test proves it. See README.md.

GO        ?= go
DEV_DIR   ?= .holdfast/dev

.PHONY: dev test verify unit bench chaos invoke load token migrate build deploy clean

## dev: start Redis, MariaDB and the SQS server, then holdfast on 127.0.0.1:3000;
## buyer routes want a JWT from the dev issuer (make token), admin routes none
dev:
	scripts/dev.sh

## test: make verify, then start the services on free ports and run every
## test against them (the concurrent packages again under -race)
test:
	scripts/test.sh

## verify: gofmt, go mod tidy, golangci-lint (.golangci.yml, the version pinned
## in tools/go.mod) and every generated file current; make test runs it first
verify:
	scripts/verify.sh

## unit: the fast tests only (no servers; integration tests skip)
unit:
	$(GO) test -count=1 ./...

## invoke: run one function like `sam local invoke`, under the Lambda Runtime
## Interface Emulator, against the services of `make dev` (events/env.json):
##   make invoke FN=persist EVENT=events/persist-batch.json
invoke:
	@test -n "$(FN)" -a -n "$(EVENT)" || { echo "usage: make invoke FN=reserve|persist|compensate|sweeper|migrate EVENT=events/<file>.json"; exit 2; }
	$(GO) run ./cmd/invoke -fn $(FN) -event $(EVENT)

## bench: holdfast against its baselines on the real servers; rewrites docs/benchmarks.md
bench:
	scripts/bench.sh $(ARGS)

## chaos: seeded chaos schedules for as long as asked, then the model-based
## test for MODEL_CHECKS random sequences, on the real services — each twice:
## with one bucket per SKU, and with three buckets on a three-shard cluster
##   make chaos DURATION=10m MODEL_CHECKS=5000
##   (a failing chaos seed replays with HOLDFAST_CHAOS_SEED=<seed>; a failing
##   model sequence prints its shrunk steps and -rapid.seed / fail file)
DURATION ?= 5m
MODEL_CHECKS ?= 2000
chaos: SHELL := /bin/bash
chaos:
	@mkdir -p .holdfast; set -o pipefail; HOLDFAST_CHAOS_DURATION=$(DURATION) HOLDFAST_MODEL_CHECKS=$(MODEL_CHECKS) \
		HOLDFAST_MODEL_BUCKET_CHECKS=$(MODEL_CHECKS) \
		scripts/test.sh -run 'TestChaos$$|TestModel$$|TestChaosBuckets$$|TestModelBuckets$$' -v -timeout 0 ./test/system | tee .holdfast/chaos.log; \
		for t in TestChaos TestModel TestChaosBuckets TestModelBuckets; do \
			grep -q -- "--- PASS: $$t " .holdfast/chaos.log || { echo "chaos: $$t did not run and pass"; exit 1; }; done

## load: fire a flash sale at `make dev` and print the invariant report; each
## buyer sends its own token, minted with the key `make dev` verifies with;
## the run's events are read from make dev's events queue (named in
## $(DEV_DIR)/env) and held against its decisions
##   make load ARGS="-n 5000 -c 128 -stock 300 -groups 3"
##   make load ARGS="-room -n 3000 -stock 300"   (the same sale without and with a waiting room)
##   (a deployed stage: ARGS="-url https://... -sigv4 -token-cmd 'CMD {user}'")
load:
	$(GO) run ./cmd/load -jwt-dir $(DEV_DIR)/jwt -dev-env $(DEV_DIR)/env $(ARGS)

## token: a buyer JWT from the dev issuer (key in $(DEV_DIR)/jwt, made on first
## use), valid for TTL, alone on stdout:
##   curl -H "Authorization: Bearer $(make -s token SUB=ann)" localhost:3000/skus/demo-phone
TTL ?= 1h
token:
	@test -n "$(SUB)" || { echo "usage: make token SUB=<user> [TTL=1h]" >&2; exit 2; }
	@$(GO) run ./cmd/token -sub '$(SUB)' -ttl $(TTL) -dir $(DEV_DIR)/jwt

## migrate: apply the MySQL migrations to HOLDFAST_DB_DSN
migrate:
	$(GO) run ./cmd/migrate

## build: the five Lambda bootstraps for linux/arm64 under bin/
build:
	for fn in reserve persist compensate sweeper migrate; do \
		GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w' \
			-o bin/$$fn/bootstrap ./functions/$$fn || exit 1; \
	done

## build-<LogicalId>Function: what `sam build` runs (BuildMethod: makefile, CodeUri: .):
## a linux/arm64 bootstrap in $(ARTIFACTS_DIR) for the provided.al2023 runtime
build-%Function:
	@test -n "$(ARTIFACTS_DIR)" || { echo "ARTIFACTS_DIR is not set (sam build sets it)"; exit 2; }
	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w' \
		-o "$(ARTIFACTS_DIR)/bootstrap" ./functions/$(shell echo '$*' | tr A-Z a-z)

## deploy: build with SAM and deploy with samconfig.toml's defaults; the first
## time GUIDED=1 asks for the parameters without defaults and saves them there;
## SAM_ENV=prod deploys the [prod.*] stage; CONFIRM=0 skips the change-set
## prompt (CI, no terminal)
##   make deploy GUIDED=1   then   make deploy   (or make deploy SAM_ENV=prod)
SAM_ENV ?= default
CONFIRM ?= 1
deploy:
	sam build --config-env $(SAM_ENV) && \
		sam deploy --config-env $(SAM_ENV) $(if $(GUIDED),--guided) $(if $(filter 0,$(CONFIRM)),--no-confirm-changeset)

clean:
	rm -rf bin .holdfast
