#!/usr/bin/env bash
# Run the whole test suite from a fresh checkout (this is `make test`):
#
#   1. find or start PostgreSQL and point TEST_DATABASE_URL at `idempay_test`
#      (or use $TEST_DATABASE_URL as is); the tests use its name as a prefix:
#      each test package creates and uses idempay_test_<package>,
#   2. build bin/stripe-mock (tests start their own instances from it),
#   3. go vet ./... and go test -race -count=1 -timeout 15m ./... "$@".
#
# Exports to the tests: TEST_DATABASE_URL, STRIPE_MOCK_BIN, PGBOUNCER_BIN (when
# pgbouncer is installed, or could be).
# Extra arguments go to `go test`, e.g. scripts/test.sh -run TestReplay -v
# The exit status is go test's (or go vet's when vet fails first).
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$IDEMPAY_ROOT"

if [[ -n ${TEST_DATABASE_URL:-} ]]; then
	TEST_DATABASE_URL=$(ensure_database_url "$TEST_DATABASE_URL")
	idem_log "postgres: using TEST_DATABASE_URL as is"
else
	ensure_postgres
	TEST_DATABASE_URL=$(ensure_database idempay_test)
fi
export TEST_DATABASE_URL

build_stripe_mock
export STRIPE_MOCK_BIN="$IDEMPAY_ROOT/bin/stripe-mock"

ensure_cgo_compiler
ensure_pgbouncer

idem_log "TEST_DATABASE_URL=$(_idem_redact "$TEST_DATABASE_URL")"
idem_log "STRIPE_MOCK_BIN=$STRIPE_MOCK_BIN"

idem_log "go vet ./..."
go vet ./...

idem_log "go test -race -count=1 -timeout 15m ./... $*"
rc=0
go test -race -count=1 -timeout 15m ./... "$@" || rc=$?
exit "$rc"
