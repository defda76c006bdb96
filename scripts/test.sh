#!/usr/bin/env bash
# Run the whole test suite from a fresh checkout (this is `make test`):
#
#   1. find or start PostgreSQL and point TEST_DATABASE_URL at `idempay_test`
#      (or use $TEST_DATABASE_URL as is); the tests use its name as a prefix:
#      each test package creates and uses idempay_test_<package>,
#   2. build bin/stripe-mock (tests start their own instances from it),
#   3. go vet ./... and go test -race -count=1 -timeout 15m ./... "$@",
#   4. the same in client/, the Go client's own module (skipped when the
#      arguments name packages, e.g. scripts/test.sh -run X ./internal/db/...).
#
# What it installs, only when missing and only as root with apt-get (each
# announced on an [idempay] line before apt-get runs; docs/development.md,
# "What make test installs"): postgresql when there is no server to use,
# gcc and libc6-dev for -race, pgbouncer for the tests behind a real
# PgBouncer (without it, and as another user, those tests skip).
#
# Exports to the tests: TEST_DATABASE_URL, STRIPE_MOCK_BIN, PGBOUNCER_BIN (when
# pgbouncer is installed, or could be). Installs Debian's chromium (as root)
# for the console's browser tests.
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
ensure_chromium

idem_log "TEST_DATABASE_URL=$(_idem_redact "$TEST_DATABASE_URL")"
idem_log "STRIPE_MOCK_BIN=$STRIPE_MOCK_BIN"

idem_log "go vet ./..."
go vet ./...

# Arguments that name packages replace ./... here and skip the client module,
# whose packages the server module's go test cannot name.
pkgs=()
for a in "$@"; do
	[[ $a == ./* || $a == github.com/* ]] && pkgs+=("$a")
done

idem_log "go test -race -count=1 -timeout 15m $([[ ${#pkgs[@]} -eq 0 ]] && echo './... ')$*"
rc=0
if [[ ${#pkgs[@]} -eq 0 ]]; then
	go test -race -count=1 -timeout 15m ./... "$@" || rc=$?
	idem_log "client module: go vet ./... && go test -race -count=1 ./... $*"
	crc=0
	(cd client && go vet ./... && go test -race -count=1 -timeout 5m ./... "$@") || crc=$?
	[[ $rc -ne 0 ]] || rc=$crc
else
	go test -race -count=1 -timeout 15m "$@" || rc=$?
fi
exit "$rc"
