# idempay — run `make` (or `make help`) for the list of targets.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO   ?= go
SQLC := $(GO) run github.com/sqlc-dev/sqlc/cmd/sqlc@v1.30.0
# sqlc finds sqlc.yaml in the repository root by itself; elsewhere we point at it.
SQLC_CONFIG ?= $(firstword $(wildcard sqlc.yaml sqlc.yml sqlc.json db/sqlc.yaml db/sqlc.yml db/sqlc.json))
SQLC_FLAGS  := $(if $(SQLC_CONFIG),-f $(SQLC_CONFIG))
# golangci-lint, pinned like sqlc; .golangci.yml says what it checks and why.
GOLANGCI_LINT := $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
# Extra arguments for go test, e.g. make test ARGS='-run TestReplay -v'
ARGS ?=
# make clean CLEAN_ARGS=-n (and distclean, clean-services) lists, removes nothing.
CLEAN_ARGS ?=
DRY_RUN := $(filter -n,$(CLEAN_ARGS))

.PHONY: help up test generate verify build lint fmt-check bench clean clean-services distclean

help: ## list the targets
	@echo "usage: make <target>"
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

up: ## start PostgreSQL, stripe-mock (STRIPE=fake: the Stripe fake, which keeps PaymentIntents and declines pm_card_chargeDeclined) and the API on 127.0.0.1:8080 (Ctrl-C stops)
	bash scripts/up.sh

test: ## vet and run all tests with -race against PostgreSQL and stripe-mock (ARGS=... for go test)
	bash scripts/test.sh $(ARGS)

generate: ## regenerate the sqlc code from the SQL (what a removed query file generated goes too)
	rm -f internal/dbsqlc/*.sql.go
	$(SQLC) $(SQLC_FLAGS) generate

verify: fmt-check ## check that sqlc output is current, go.mod/go.sum are tidy (server and client/), gofmt, go vet and golangci-lint pass
	$(SQLC) $(SQLC_FLAGS) diff
	@stale="$$(for f in internal/dbsqlc/*.sql.go; do [[ -f db/queries/$$(basename "$$f" .go) ]] || echo "$$f"; done)"; \
	if [[ -n "$$stale" ]]; then echo "generated from no query file (make generate removes it):"; echo "$$stale"; exit 1; fi
	$(GO) mod tidy -diff
	cd client && $(GO) mod tidy -diff
	$(MAKE) --no-print-directory lint

build: ## build bin/idempay
	$(GO) build -o bin/idempay ./cmd/idempay

lint: fmt-check ## gofmt check, go vet and golangci-lint (.golangci.yml) on the server and client/ modules
	$(GO) vet ./...
	cd client && $(GO) vet ./...
	$(GOLANGCI_LINT) run ./...
	cd client && $(GOLANGCI_LINT) run ./...

fmt-check: # gofmt -l must print nothing (bin/, .run/ and .git/ skipped)
	@out="$$(find . \( -path ./bin -o -path ./.run -o -path ./.git \) -prune -o -name '*.go' -print0 | xargs -0 -r gofmt -l)"; \
	if [[ -n "$$out" ]]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

bench: ## load benchmark (BENCHMARKS.md): bin/idempay-bench starts bin/idempay on BENCH_DATABASE_URL behind a Stripe stand-in; BENCH_ARGS='-rounds 15 -duration 2s ...'; side by side with the peer: BENCH_ARGS='-peer PATH/fiberredis'; one account vs 100: BENCH_ARGS='-compare-accounts 1,100'
	$(GO) build -o bin/idempay ./cmd/idempay
	$(GO) build -o bin/idempay-bench ./cmd/idempay-bench
	DATABASE_URL="$${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/idempay_bench?sslmode=disable}" bin/idempay-bench $(BENCH_ARGS)

clean: clean-services ## remove bin/ and what the demo and tests left on the shared services (clean-services); CLEAN_ARGS=-n: only list
	@if [[ -d bin && -n "$(DRY_RUN)" ]]; then echo "would remove bin/"; \
	elif [[ -d bin ]]; then rm -rf bin && echo "removed bin/"; fi

clean-services: ## drop the idempay and idempay_* databases (demo, bench, tests) and the demo's NATS streams ORDERS and IDEMPAY_EVENTS; prints each (CLEAN_ARGS=-n: only print)
	$(GO) run ./scripts/cleanservices $(CLEAN_ARGS)

distclean: clean ## also stop the private PostgreSQL cluster and delete .run/ (its data); CLEAN_ARGS=-n: only list
ifeq ($(DRY_RUN),)
	source scripts/lib.sh && stop_private_postgres
	rm -rf .run
else
	@echo "would stop the private PostgreSQL cluster under .run/ and remove .run/"
endif
