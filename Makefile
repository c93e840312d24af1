# holdfast — make dev runs it locally; make test proves it. See README.md.

GO        ?= go
DEV_DIR   ?= .holdfast/dev

.PHONY: dev test unit services-up services-down migrate build clean

## dev: start Redis, MariaDB and the SQS server, then holdfast on 127.0.0.1:3000
dev:
	scripts/dev.sh

## test: start the services on free ports and run every test against them
test:
	scripts/test.sh

## unit: the fast tests only (no servers; integration tests skip)
unit:
	$(GO) test -count=1 ./...

## migrate: apply the MySQL migrations to HOLDFAST_DB_DSN
migrate:
	$(GO) run ./cmd/migrate

## build: the four Lambda bootstraps for linux/arm64 under bin/
build:
	for fn in reserve persist compensate sweeper; do \
		GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -tags lambda.norpc -trimpath -ldflags='-s -w' \
			-o bin/$$fn/bootstrap ./functions/$$fn || exit 1; \
	done

clean:
	rm -rf bin .holdfast
