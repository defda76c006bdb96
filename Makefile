# idempay — run `make` (or `make help`) for the list of targets.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO   ?= go
SQLC := $(GO) run github.com/sqlc-dev/sqlc/cmd/sqlc@v1.30.0
# sqlc finds sqlc.yaml in the repository root by itself; elsewhere we point at it.
SQLC_CONFIG ?= $(firstword $(wildcard sqlc.yaml sqlc.yml sqlc.json db/sqlc.yaml db/sqlc.yml db/sqlc.json))
SQLC_FLAGS  := $(if $(SQLC_CONFIG),-f $(SQLC_CONFIG))
# Extra arguments for go test, e.g. make test ARGS='-run TestReplay -v'
ARGS ?=

.PHONY: help up test generate verify build lint fmt-check bench clean distclean

help: ## list the targets
	@echo "usage: make <target>"
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

up: ## start PostgreSQL, stripe-mock (STRIPE=fake: the Stripe fake, which declines tok_chargeDeclined) and the API on 127.0.0.1:8080 (Ctrl-C stops)
	bash scripts/up.sh

test: ## vet and run all tests with -race against PostgreSQL and stripe-mock (ARGS=... for go test)
	bash scripts/test.sh $(ARGS)

generate: ## regenerate the sqlc code from the SQL
	$(SQLC) $(SQLC_FLAGS) generate

verify: fmt-check ## check that sqlc output is current, go.mod/go.sum are tidy, gofmt is clean and go vet passes
	$(SQLC) $(SQLC_FLAGS) diff
	$(GO) mod tidy -diff
	$(GO) vet ./...

build: ## build bin/idempay
	$(GO) build -o bin/idempay ./cmd/idempay

lint: fmt-check ## go vet and gofmt check
	$(GO) vet ./...

fmt-check: # gofmt -l must print nothing (bin/, .run/ and .git/ skipped)
	@out="$$(find . \( -path ./bin -o -path ./.run -o -path ./.git \) -prune -o -name '*.go' -print0 | xargs -0 -r gofmt -l)"; \
	if [[ -n "$$out" ]]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

bench: ## load benchmark (BENCHMARKS.md): bin/idempay-bench starts bin/idempay on BENCH_DATABASE_URL behind a Stripe stand-in; BENCH_ARGS='-rounds 15 -duration 2s ...'; side by side with the peer: BENCH_ARGS='-peer PATH/fiberredis'; one account vs 100: BENCH_ARGS='-compare-accounts 1,100'
	$(GO) build -o bin/idempay ./cmd/idempay
	$(GO) build -o bin/idempay-bench ./cmd/idempay-bench
	DATABASE_URL="$${BENCH_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/idempay_bench?sslmode=disable}" bin/idempay-bench $(BENCH_ARGS)

clean: ## remove build output (bin/)
	rm -rf bin

distclean: clean ## also stop the private PostgreSQL cluster and delete .run/ (its data)
	source scripts/lib.sh && stop_private_postgres
	rm -rf .run
