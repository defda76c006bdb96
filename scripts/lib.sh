# shellcheck shell=bash
# Shared helpers for the idempay scripts. Source it, do not run it:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Safe under `set -euo pipefail`. Every helper logs to stderr; only
# ensure_database / ensure_database_url print to stdout (the URL).
#
# Public functions:
#   ensure_postgres            find or start a PostgreSQL server; exports PG_BASE_URL
#   ensure_database NAME       create database NAME there if missing; prints its URL
#   ensure_database_url URL    create the database named in URL if missing; prints URL
#   build_stripe_mock          build bin/stripe-mock if missing or older than go.mod
#   start_stripe_mock          start bin/stripe-mock on loopback; exports STRIPE_MOCK_URL
#   build_stripe_fake          build bin/stripefake (cmd/stripefake; go build, cached)
#   start_stripe_fake          start bin/stripefake on loopback; exports STRIPE_FAKE_URL
#   ensure_nats                find or start a NATS server with JetStream; exports NATS_URL
#   ensure_pgbouncer           find or install pgbouncer; exports PGBOUNCER_BIN
#   ensure_chromium            find or install Debian's chromium for the console's browser tests
#   stop_private_postgres      stop the private cluster started by ensure_postgres
#   idem_on_exit CMD...        run CMD when the script exits (LIFO, also on INT/TERM)
#
# Knobs (environment):
#   IDEM_SIGNAL_EXIT    signal (default): after INT/TERM/HUP and the exit hooks, exit
#                       128 + the signal (130 for Ctrl-C) | clean: exit 0 once the
#                       hooks stopped everything (1 if one had to SIGKILL a
#                       process), for a script whose normal end is Ctrl-C (make up)
#   DATABASE_URL        if set, ensure_postgres uses that server and touches nothing else
#   IDEMPAY_PG_MODE     auto (default) | private: skip the probes, always use the private cluster
#   PG_PORT_PROBE       port probed on 127.0.0.1 for an existing server (default 5432)
#   PG_PRIVATE_PORT     port of the private cluster (default 55432)
#   NATS_URL            if set, ensure_nats uses it as is and starts nothing
#   IDEMPAY_NATS_PROBE_PORT  port probed on 127.0.0.1 for an existing NATS server
#                       (default 4222; point it at a closed port to force bin/natsdev)

if [[ -n ${_IDEMPAY_LIB_SOURCED:-} ]]; then
	return 0
fi
_IDEMPAY_LIB_SOURCED=1

IDEMPAY_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export IDEMPAY_ROOT

# A fresh login shell may not have the Go toolchain on PATH yet.
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

: "${PGCONNECT_TIMEOUT:=5}"
export PGCONNECT_TIMEOUT

idem_log() { printf '[idempay] %s\n' "$*" >&2; }

# _idem_redact URL: hide the password of a URL for logging.
_idem_redact() { printf '%s\n' "$1" | sed -E 's#^([a-z]+://[^:/@]*):[^@/]*@#\1:***@#'; }
idem_die() {
	printf '[idempay] error: %s\n' "$*" >&2
	exit 1
}

# ---------------------------------------------------------------------------
# Exit hooks: one EXIT trap running registered commands in reverse order.
# INT and TERM are turned into an exit so the hooks also run on Ctrl-C/kill.
# The exit status after a signal is 128 + the signal, or with
# IDEM_SIGNAL_EXIT=clean, 0 when every hook stopped its process cleanly.

_IDEM_EXIT_HOOKS=()
_IDEM_SIGNALLED=""   # the signal's exit status, once INT/TERM/HUP arrived
_IDEM_STOP_FORCED="" # set when _idem_stop_pid had to SIGKILL a process

idem_on_exit() {
	_IDEM_EXIT_HOOKS+=("$*")
	if [[ ${#_IDEM_EXIT_HOOKS[@]} -eq 1 ]]; then
		trap '_idem_run_exit_hooks' EXIT
		trap '_idem_on_signal 130' INT
		trap '_idem_on_signal 143' TERM
		trap '_idem_on_signal 129' HUP
	fi
}

_idem_on_signal() {
	trap - INT TERM HUP
	_IDEM_SIGNALLED=$1
	exit "$1"
}

_idem_run_exit_hooks() {
	local rc=$? i
	trap - EXIT INT TERM HUP
	set +e
	_IDEM_STOP_FORCED=""
	for ((i = ${#_IDEM_EXIT_HOOKS[@]} - 1; i >= 0; i--)); do
		eval "${_IDEM_EXIT_HOOKS[i]}"
	done
	_IDEM_EXIT_HOOKS=()
	# Stopped by a signal, as a script meant to run until stopped is: that
	# is its normal end, so a clean stop is a success.
	if [[ -n $_IDEM_SIGNALLED && ${IDEM_SIGNAL_EXIT:-signal} == clean ]]; then
		if [[ -n $_IDEM_STOP_FORCED ]]; then
			exit 1
		fi
		exit 0
	fi
	return "$rc"
}

# _idem_stop_pid PID [NAME] [GRACE_SECONDS]: SIGTERM, wait, then SIGKILL.
_idem_stop_pid() {
	local pid=$1 name=${2:-process} grace=${3:-10} i
	if kill -TERM "$pid" 2>/dev/null; then
		for ((i = 0; i < grace * 10; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			idem_log "$name (pid $pid) ignored SIGTERM for ${grace}s, killing it"
			kill -KILL "$pid" 2>/dev/null || true
			_IDEM_STOP_FORCED=1
		fi
	fi
	# Reap it if it is our child; harmless otherwise.
	wait "$pid" 2>/dev/null || true
	return 0
}

# ---------------------------------------------------------------------------
# PostgreSQL

# _idem_pg_tool NAME: path of a PostgreSQL client/server program.
_idem_pg_tool() {
	local name=$1 d
	if command -v "$name" >/dev/null 2>&1; then
		command -v "$name"
		return 0
	fi
	d=$(_idem_pg_bindir) || return 1
	[[ -x $d/$name ]] || return 1
	printf '%s\n' "$d/$name"
}

# _idem_pg_bindir: directory of the newest installed server binaries.
_idem_pg_bindir() {
	local d
	d=$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/initdb' 2>/dev/null |
		sort -V | tail -n 1)
	if [[ -n $d ]]; then
		dirname "$d"
		return 0
	fi
	if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(command -v initdb)"
		return 0
	fi
	if command -v pg_config >/dev/null 2>&1; then
		d=$(pg_config --bindir 2>/dev/null) || true
		if [[ -n $d && -x $d/initdb ]]; then
			printf '%s\n' "$d"
			return 0
		fi
	fi
	return 1
}

_idem_psql() {
	local psql
	psql=$(_idem_pg_tool psql) || idem_die "psql not found (install postgresql-client)"
	"$psql" -X -q -A -t -v ON_ERROR_STOP=1 "$@"
}

# _idem_pg_can_login URL: true if a trivial query succeeds.
_idem_pg_can_login() {
	[[ $(_idem_psql -d "$1" -c 'select 1' 2>/dev/null) == 1 ]]
}

_idem_pg_isready() { # HOST PORT
	local isready
	isready=$(_idem_pg_tool pg_isready) || {
		# No pg_isready: fall back to a bare TCP connect.
		(: <"/dev/tcp/$1/$2") 2>/dev/null
		return
	}
	"$isready" -q -h "$1" -p "$2" -U postgres -d postgres -t 3 >/dev/null 2>&1
}

_idem_wait_pg_ready() { # HOST PORT SECONDS
	local i
	for ((i = 0; i < $3 * 4; i++)); do
		_idem_pg_isready "$1" "$2" && return 0
		sleep 0.25
	done
	return 1
}

# _idem_pg_parse URL: sets _IDEM_PG_BASE (scheme://authority), _IDEM_PG_DB and
# _IDEM_PG_QUERY (without the leading '?').
_idem_pg_parse() {
	local url=$1 scheme rest authority
	[[ $url =~ ^postgres(ql)?:// ]] ||
		idem_die "expected a postgres:// URL, got something else (key=value DSNs are not supported here)"
	scheme=${url%%://*}
	rest=${url#*://}
	_IDEM_PG_QUERY=
	if [[ $rest == *\?* ]]; then
		_IDEM_PG_QUERY=${rest#*\?}
		rest=${rest%%\?*}
	fi
	authority=${rest%%/*}
	_IDEM_PG_DB=${rest#"$authority"}
	_IDEM_PG_DB=$(_idem_url_unescape "${_IDEM_PG_DB#/}")
	_IDEM_PG_BASE="$scheme://$authority"
}

# _idem_url_unescape S: S with each %XX replaced by its byte, as libpq and Go
# read a database name in a URL (a name with a space or a slash is written
# %20, %2F there).
_idem_url_unescape() {
	local s=$1 out="" byte
	while [[ $s =~ ^([^%]*)%([0-9A-Fa-f]{2})(.*)$ ]]; do
		printf -v byte '%b' "\\x${BASH_REMATCH[2]}"
		out+=${BASH_REMATCH[1]}$byte
		s=${BASH_REMATCH[3]}
	done
	printf '%s\n' "$out$s"
}

# _idem_pg_url BASE DB QUERY: join, adding sslmode=disable unless sslmode is set.
_idem_pg_url() {
	local base=$1 db=$2 query=$3
	if [[ "&$query" != *'&sslmode='* ]]; then
		query=${query:+$query&}sslmode=disable
	fi
	printf '%s/%s?%s\n' "$base" "$db" "$query"
}

# _idem_pg_admin_url BASE QUERY [DB]: first URL on that server we can log in to,
# trying the maintenance databases before DB.
_idem_pg_admin_url() {
	local base=$1 query=$2 db url
	for db in postgres template1 ${3:+"$3"}; do
		url=$(_idem_pg_url "$base" "$db" "$query")
		if _idem_pg_can_login "$url"; then
			printf '%s\n' "$url"
			return 0
		fi
	done
	return 1
}

# _idem_pg_use BASE QUERY ADMIN_URL HOW: record and export the chosen server.
_idem_pg_use() {
	PG_BASE_URL=$1
	PG_URL_QUERY=$2
	PG_ADMIN_URL=$3
	export PG_BASE_URL PG_URL_QUERY PG_ADMIN_URL
	idem_log "postgres: $4 ($(_idem_redact "$PG_BASE_URL"))"
}

# ensure_postgres: make sure a PostgreSQL server is reachable and export
#   PG_BASE_URL   postgres://user@host:port (no database, no query)
#   PG_URL_QUERY  query string to append to database URLs ('' or from DATABASE_URL)
#   PG_ADMIN_URL  URL of a maintenance database on that server (used to CREATE DATABASE)
# Order: $DATABASE_URL's server as is; a server answering on 127.0.0.1:5432;
# a pg_lsclusters cluster (started if down); a private cluster under .run/ on
# 127.0.0.1:55432 (initdb'd on first use, reused afterwards). Installs the
# postgresql package with apt-get when no server binaries exist and we are root.
ensure_postgres() {
	local probe=${PG_PORT_PROBE:-5432} mode=${IDEMPAY_PG_MODE:-auto} admin

	if [[ -n ${DATABASE_URL:-} ]]; then
		_idem_pg_parse "$DATABASE_URL"
		admin=$(_idem_pg_admin_url "$_IDEM_PG_BASE" "$_IDEM_PG_QUERY" "$_IDEM_PG_DB") ||
			idem_die "cannot log in to the server in DATABASE_URL ($(_idem_redact "$_IDEM_PG_BASE")); fix or unset DATABASE_URL"
		_idem_pg_use "$_IDEM_PG_BASE" "$_IDEM_PG_QUERY" "$admin" "using the server from DATABASE_URL as is"
		return 0
	fi

	case $mode in
	auto | private) ;;
	*) idem_die "IDEMPAY_PG_MODE must be auto or private, not '$mode'" ;;
	esac

	if [[ $mode == auto ]]; then
		local base="postgres://postgres@127.0.0.1:$probe"
		if _idem_pg_isready 127.0.0.1 "$probe"; then
			if admin=$(_idem_pg_admin_url "$base" ""); then
				_idem_pg_use "$base" "" "$admin" "using the server already running on 127.0.0.1:$probe"
				return 0
			fi
			idem_log "postgres: a server answers on 127.0.0.1:$probe but user postgres cannot log in without a password; trying the next option"
		fi
		if _idem_pg_try_cluster; then
			return 0
		fi
	fi

	_idem_pg_private
}

# _idem_pg_try_cluster: use (and start if needed) a cluster listed by pg_lsclusters.
_idem_pg_try_cluster() {
	command -v pg_lsclusters >/dev/null 2>&1 || return 1
	local ver name port status chosen="" base admin
	# Prefer an online cluster, else the newest one listed.
	while read -r ver name port status _; do
		[[ -n $ver && $port =~ ^[0-9]+$ ]] || continue
		if [[ $status == online* ]]; then
			chosen="$ver $name $port $status"
			break
		fi
		[[ -n $chosen ]] || chosen="$ver $name $port $status"
	done < <(pg_lsclusters -h 2>/dev/null | sort -k1,1Vr)
	[[ -n $chosen ]] || return 1
	read -r ver name port status <<<"$chosen"
	base="postgres://postgres@127.0.0.1:$port"

	local how="using cluster $ver/$name on 127.0.0.1:$port"
	if [[ $status != online* ]]; then
		if ! pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start >&2; then
			idem_log "postgres: could not start cluster $ver/$name; trying the next option"
			return 1
		fi
		how="started cluster $ver/$name on 127.0.0.1:$port"
	fi
	if ! _idem_wait_pg_ready 127.0.0.1 "$port" 30; then
		idem_log "postgres: cluster $ver/$name does not answer on 127.0.0.1:$port; trying the next option"
		return 1
	fi
	if ! admin=$(_idem_pg_admin_url "$base" ""); then
		idem_log "postgres: cluster $ver/$name needs a password for user postgres over TCP; trying the next option"
		return 1
	fi
	_idem_pg_use "$base" "" "$admin" "$how"
}

# _idem_pg_private_paths: sets _IDEM_PG_{DIR,DATA,SOCK,LOG}.
_idem_pg_private_paths() {
	local dir="$IDEMPAY_ROOT/.run" tag
	tag=$(printf '%s' "$IDEMPAY_ROOT" | cksum | cut -d' ' -f1)
	mkdir -p "$dir"
	# As root the server runs as postgres, which must be able to reach .run/.
	if [[ $EUID -eq 0 ]] && ! runuser -u postgres -- test -x "$dir" 2>/dev/null; then
		dir="${TMPDIR:-/tmp}/idempay-pg-$tag"
		idem_log "postgres: user postgres cannot reach $IDEMPAY_ROOT/.run, keeping the private cluster in $dir"
		mkdir -p "$dir"
		chmod 755 "$dir"
	fi
	_IDEM_PG_DIR=$dir
	_IDEM_PG_DATA="$dir/pgdata"
	_IDEM_PG_SOCK="$dir/pgsock"
	_IDEM_PG_LOG="$dir/postgres.log"
	# Unix socket paths are limited to ~107 bytes.
	if ((${#_IDEM_PG_SOCK} > 80)); then
		_IDEM_PG_SOCK="${TMPDIR:-/tmp}/idempay-pgsock-$tag"
	fi
}

# _idem_as_pg CMD...: run a server program as the cluster owner.
_idem_as_pg() {
	if [[ $EUID -eq 0 ]]; then
		(cd / && runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

_idem_pg_private() {
	local port=${PG_PRIVATE_PORT:-55432} bindir base admin how locked=""
	if ! bindir=$(_idem_pg_bindir); then
		if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1 && [[ -z ${_IDEM_PG_INSTALLED:-} ]]; then
			idem_log "postgres: no server binaries found, installing the postgresql package with apt-get"
			_IDEM_PG_INSTALLED=1
			{ DEBIAN_FRONTEND=noninteractive apt-get update >&2 &&
				DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql >&2; } ||
				idem_die "apt-get install postgresql failed"
			ensure_postgres
			return
		fi
		idem_die "no PostgreSQL server binaries (initdb, pg_ctl) found: install PostgreSQL or set DATABASE_URL"
	fi
	if [[ $EUID -eq 0 ]] && ! id -u postgres >/dev/null 2>&1; then
		idem_die "running as root but there is no 'postgres' user to own the private cluster"
	fi

	_idem_pg_private_paths
	base="postgres://postgres@127.0.0.1:$port"

	# Serialise concurrent callers (make up and make test at the same time).
	# The lock is on fd 9, which must not leak into the postmaster.
	if command -v flock >/dev/null 2>&1; then
		exec 9>"$_IDEM_PG_DIR/pg.lock"
		flock -w 120 9 || idem_die "timed out waiting for $_IDEM_PG_DIR/pg.lock"
		locked=1
	fi

	mkdir -p "$_IDEM_PG_SOCK"
	touch "$_IDEM_PG_LOG"
	if [[ $EUID -eq 0 ]]; then
		chown postgres:postgres "$_IDEM_PG_SOCK" "$_IDEM_PG_LOG"
	fi

	if [[ -f $_IDEM_PG_DATA/PG_VERSION ]] &&
		_idem_as_pg "$bindir/pg_ctl" -D "$_IDEM_PG_DATA" status >/dev/null 2>&1; then
		how="reusing the private cluster already running in $_IDEM_PG_DATA"
	else
		how="started the private cluster in $_IDEM_PG_DATA"
		if [[ ! -f $_IDEM_PG_DATA/PG_VERSION ]]; then
			if [[ -d $_IDEM_PG_DATA ]] && [[ -n $(ls -A "$_IDEM_PG_DATA" 2>/dev/null) ]]; then
				idem_die "$_IDEM_PG_DATA exists but is not a PostgreSQL data directory; remove it"
			fi
			mkdir -p "$_IDEM_PG_DATA"
			chmod 700 "$_IDEM_PG_DATA"
			if [[ $EUID -eq 0 ]]; then
				chown postgres:postgres "$_IDEM_PG_DATA"
			fi
			_idem_as_pg "$bindir/initdb" -D "$_IDEM_PG_DATA" -U postgres --auth=trust \
				-E UTF8 --no-locale >>"$_IDEM_PG_LOG" 2>&1 ||
				idem_die "initdb failed, see $_IDEM_PG_LOG"
			how="initialised and started a private cluster in $_IDEM_PG_DATA"
		elif [[ $EUID -eq 0 ]]; then
			chown -R postgres:postgres "$_IDEM_PG_DATA"
		fi
		if (: <"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			idem_die "port 127.0.0.1:$port is taken by something else; set PG_PRIVATE_PORT to a free port"
		fi
		_idem_as_pg "$bindir/pg_ctl" -D "$_IDEM_PG_DATA" -l "$_IDEM_PG_LOG" -w -t 60 \
			-o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories='$_IDEM_PG_SOCK'" \
			start >/dev/null 9>&- ||
			idem_die "the private cluster did not start, see $_IDEM_PG_LOG"
	fi

	if [[ -n $locked ]]; then
		exec 9>&-
	fi

	_idem_wait_pg_ready 127.0.0.1 "$port" 30 ||
		idem_die "the private cluster does not answer on 127.0.0.1:$port, see $_IDEM_PG_LOG"
	admin=$(_idem_pg_admin_url "$base" "") ||
		idem_die "cannot log in to the private cluster on 127.0.0.1:$port (is another server using that port?)"
	_idem_pg_use "$base" "" "$admin" "$how, 127.0.0.1:$port"
}

# stop_private_postgres: stop the private cluster if it is running (data is kept).
stop_private_postgres() {
	local bindir
	bindir=$(_idem_pg_bindir) || return 0
	_idem_pg_private_paths
	[[ -f $_IDEM_PG_DATA/PG_VERSION ]] || return 0
	if _idem_as_pg "$bindir/pg_ctl" -D "$_IDEM_PG_DATA" status >/dev/null 2>&1; then
		_idem_as_pg "$bindir/pg_ctl" -D "$_IDEM_PG_DATA" -m fast -w stop >/dev/null
		idem_log "postgres: stopped the private cluster in $_IDEM_PG_DATA"
	fi
}

# _idem_pg_create_db ADMIN_URL NAME: CREATE DATABASE unless it exists; tolerates
# a concurrent creator. NAME may be any name PostgreSQL accepts (a hyphen, a
# quote, a space): it reaches the server as a psql variable, which psql
# quotes as a literal (:'name') or an identifier (:"name"); psql interpolates
# variables in what it reads, not in -c, hence the here-strings.
_idem_pg_create_db() {
	local admin=$1 name=$2 exists err
	[[ -n $name ]] || idem_die "the database URL names no database"
	# PostgreSQL would cut a longer name to 63 bytes and create another database.
	(($(printf '%s' "$name" | wc -c) <= 63)) ||
		idem_die "database name '$name' is longer than PostgreSQL's 63 bytes"
	exists=$(_idem_psql -d "$admin" -v name="$name" <<<"select 1 from pg_database where datname = :'name'") ||
		idem_die "cannot query the server at $(_idem_redact "$admin")"
	[[ $exists == 1 ]] && return 0
	if err=$(_idem_psql -d "$admin" -v name="$name" <<<'create database :"name"' 2>&1); then
		idem_log "postgres: created database $name"
		return 0
	fi
	# Lost a race with a concurrent creator?
	exists=$(_idem_psql -d "$admin" -v name="$name" <<<"select 1 from pg_database where datname = :'name'") || true
	[[ $exists == 1 ]] || idem_die "create database $name failed: $err"
}

# ensure_database NAME: create database NAME on the ensure_postgres server if it
# is missing; print its URL (postgres://...:port/NAME?sslmode=disable).
ensure_database() {
	local name=${1:?usage: ensure_database NAME}
	[[ -n ${PG_BASE_URL:-} && -n ${PG_ADMIN_URL:-} ]] || ensure_postgres
	_idem_pg_create_db "$PG_ADMIN_URL" "$name"
	_idem_pg_url "$PG_BASE_URL" "$name" "${PG_URL_QUERY:-}"
}

# ensure_database_url URL: create the database named in URL on URL's server if
# it is missing (connecting as URL's user); print URL unchanged.
ensure_database_url() {
	local url=${1:?usage: ensure_database_url URL} admin
	_idem_pg_parse "$url"
	if [[ -n $_IDEM_PG_DB ]]; then
		admin=$(_idem_pg_admin_url "$_IDEM_PG_BASE" "$_IDEM_PG_QUERY") ||
			admin=$url
		if ! _idem_pg_can_login "$url"; then
			_idem_pg_create_db "$admin" "$_IDEM_PG_DB"
		fi
	fi
	printf '%s\n' "$url"
}

# ---------------------------------------------------------------------------
# stripe-mock

# build_stripe_mock: build bin/stripe-mock (the version pinned in go.mod) if it
# is missing or older than go.mod/go.sum.
build_stripe_mock() {
	local out="$IDEMPAY_ROOT/bin/stripe-mock"
	if [[ -x $out && $out -nt $IDEMPAY_ROOT/go.mod && ! $IDEMPAY_ROOT/go.sum -nt $out ]]; then
		return 0
	fi
	_idem_go_build stripe-mock github.com/stripe/stripe-mock
}

# _idem_go_build NAME PKG: build PKG as bin/NAME, through a temporary file so
# that a failed build leaves the old binary in place. go's build cache knows
# every file a package depends on, and makes an unchanged one cost a fraction
# of a second, so there is no staleness check of our own.
_idem_go_build() {
	local out="$IDEMPAY_ROOT/bin/$1" tmp="$IDEMPAY_ROOT/bin/$1.tmp.$$"
	idem_log "building bin/$1"
	mkdir -p "$IDEMPAY_ROOT/bin"
	(cd "$IDEMPAY_ROOT" && go build -o "$tmp" "$2") || {
		rm -f "$tmp"
		idem_die "go build $2 failed"
	}
	mv -f "$tmp" "$out"
}

# _idem_free_ports N: print N distinct free TCP ports on 127.0.0.1, space separated.
_idem_free_ports() {
	local n=$1
	if command -v python3 >/dev/null 2>&1; then
		python3 - "$n" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
		return
	fi
	# Fallback: random high ports nobody answers on.
	local ports=() p
	while ((${#ports[@]} < n)); do
		p=$((20000 + RANDOM % 30000))
		[[ " ${ports[*]} " == *" $p "* ]] && continue
		(: <"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
		ports+=("$p")
	done
	echo "${ports[*]}"
}

# start_stripe_mock: start bin/stripe-mock bound to 127.0.0.1 only (HTTP and
# HTTPS on two free ports), wait until it answers, export
#   STRIPE_MOCK_URL  http://127.0.0.1:PORT
#   STRIPE_MOCK_PID  its pid
# and stop it when the calling shell exits. Call it in the main shell, not in $(...).
start_stripe_mock() {
	local bin="$IDEMPAY_ROOT/bin/stripe-mock" http https pid log attempt i out
	[[ -x $bin ]] || build_stripe_mock
	mkdir -p "$IDEMPAY_ROOT/.run"
	for attempt in 1 2 3; do
		read -r http https < <(_idem_free_ports 2) || true
		[[ -n ${http:-} && -n ${https:-} ]] || idem_die "could not find free loopback ports"
		log="$IDEMPAY_ROOT/.run/stripe-mock.$http.log"
		"$bin" -http-addr "127.0.0.1:$http" -https-addr "127.0.0.1:$https" >"$log" 2>&1 &
		pid=$!
		for ((i = 0; i < 120; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			out=$(curl -s --max-time 2 "http://127.0.0.1:$http/v1/charges" -u sk_test_123: 2>/dev/null) || true
			if [[ $out == '{'* ]]; then
				STRIPE_MOCK_URL="http://127.0.0.1:$http"
				STRIPE_MOCK_PID=$pid
				export STRIPE_MOCK_URL STRIPE_MOCK_PID
				idem_on_exit "_idem_stop_pid $pid stripe-mock 5; rm -f '$log'"
				idem_log "stripe-mock: listening on $STRIPE_MOCK_URL (https 127.0.0.1:$https, pid $pid)"
				return 0
			fi
			sleep 0.25
		done
		_idem_stop_pid "$pid" stripe-mock 2
		idem_log "stripe-mock: attempt $attempt failed: $(tail -n 3 "$log" 2>/dev/null | tr '\n' ' ')"
		rm -f "$log"
	done
	idem_die "stripe-mock did not start"
}

# build_stripe_fake: build bin/stripefake (cmd/stripefake, the test suite's
# Stripe fake as a process).
build_stripe_fake() { _idem_go_build stripefake ./cmd/stripefake; }

# start_stripe_fake: start bin/stripefake on a free loopback port, wait for
# its ready line, export
#   STRIPE_FAKE_URL  http://127.0.0.1:PORT
#   STRIPE_FAKE_PID  its pid
# and stop it when the calling shell exits. Unlike stripe-mock it keeps the
# PaymentIntents it made, replays a repeated Idempotency-Key and declines
# Stripe's declining test payment methods (pm_card_chargeDeclined). Call it
# in the main shell, not in $(...).
start_stripe_fake() {
	local bin="$IDEMPAY_ROOT/bin/stripefake" port pid log attempt i
	[[ -x $bin ]] || build_stripe_fake
	mkdir -p "$IDEMPAY_ROOT/.run"
	for attempt in 1 2 3; do
		read -r port < <(_idem_free_ports 1) || true
		[[ -n ${port:-} ]] || idem_die "could not find a free loopback port"
		log="$IDEMPAY_ROOT/.run/stripefake.$port.log"
		"$bin" -addr "127.0.0.1:$port" </dev/null >"$log" 2>&1 &
		pid=$!
		for ((i = 0; i < 40; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			if grep -qxF "stripefake: ready http://127.0.0.1:$port" "$log" 2>/dev/null; then
				STRIPE_FAKE_URL="http://127.0.0.1:$port"
				STRIPE_FAKE_PID=$pid
				export STRIPE_FAKE_URL STRIPE_FAKE_PID
				idem_on_exit "_idem_stop_pid $pid stripefake 5; rm -f '$log'"
				idem_log "stripefake: listening on $STRIPE_FAKE_URL (pid $pid)"
				return 0
			fi
			sleep 0.25
		done
		_idem_stop_pid "$pid" stripefake 2
		idem_log "stripefake: attempt $attempt failed: $(tail -n 3 "$log" 2>/dev/null | tr '\n' ' ')"
		rm -f "$log"
	done
	idem_die "stripefake did not start"
}

# ---------------------------------------------------------------------------
# NATS

# build_natsdev: build bin/natsdev (cmd/natsdev, an embedded nats-server for
# development and tests).
build_natsdev() { _idem_go_build natsdev ./cmd/natsdev; }

# _idem_nats_probe PORT: true if a NATS server with JetStream that needs no
# credentials or TLS answers on 127.0.0.1:PORT (it sends an INFO line first).
# Otherwise false, with the reason in _IDEM_NATS_PROBE_WHY ('' = nothing there).
_idem_nats_probe() {
	local port=$1 line
	_IDEM_NATS_PROBE_WHY=""
	line=$(
		exec 2>/dev/null 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
		read -r -t 2 l <&3 || true
		printf '%s' "${l-}"
	) || return 1
	case $line in
	INFO\ *) ;;
	*) _IDEM_NATS_PROBE_WHY="something answers on 127.0.0.1:$port but it is not a NATS server" ;;
	esac
	if [[ -z $_IDEM_NATS_PROBE_WHY ]]; then
		if [[ $line != *'"jetstream":true'* ]]; then
			_IDEM_NATS_PROBE_WHY="the NATS server on 127.0.0.1:$port has no JetStream"
		elif [[ $line == *'"auth_required":true'* || $line == *'"tls_required":true'* ]]; then
			_IDEM_NATS_PROBE_WHY="the NATS server on 127.0.0.1:$port needs credentials or TLS (set NATS_URL to use it)"
		fi
	fi
	[[ -z $_IDEM_NATS_PROBE_WHY ]]
}

# ensure_nats: make sure a NATS server with JetStream is reachable and export
#   NATS_URL     nats://127.0.0.1:PORT (or $NATS_URL unchanged)
#   NATSDEV_PID  pid of bin/natsdev, only when it was started here
# Order: $NATS_URL as is; a server answering on 127.0.0.1:$IDEMPAY_NATS_PROBE_PORT
# (4222); else bin/natsdev (built if needed) on a free loopback port with its
# JetStream store in .run/nats and its log in .run/natsdev.log, stopped when
# the calling shell exits. nats-server has no lock on its store, so a second
# natsdev started while one holds .run/nats (make up and make test at once)
# gets a throwaway store .run/nats.PORT instead. Call it in the main shell,
# not in $(...).
ensure_nats() {
	local probe=${IDEMPAY_NATS_PROBE_PORT:-4222} bin="$IDEMPAY_ROOT/bin/natsdev"
	local run="$IDEMPAY_ROOT/.run" lockfd="" store log cleanup port pid attempt i

	if [[ -n ${NATS_URL:-} ]]; then
		export NATS_URL
		idem_log "nats: using NATS_URL as is ($(_idem_redact "$NATS_URL"))"
		return 0
	fi
	if _idem_nats_probe "$probe"; then
		NATS_URL="nats://127.0.0.1:$probe"
		export NATS_URL
		idem_log "nats: using the server already running on 127.0.0.1:$probe"
		return 0
	fi
	[[ -z $_IDEM_NATS_PROBE_WHY ]] || idem_log "nats: $_IDEM_NATS_PROBE_WHY; starting bin/natsdev instead"

	build_natsdev
	mkdir -p "$run"
	# The lock on .run/nats.lock is inherited by natsdev and held while it runs.
	if command -v flock >/dev/null 2>&1; then
		exec {lockfd}>"$run/nats.lock"
		if ! flock -n "$lockfd"; then
			exec {lockfd}>&-
			lockfd=""
		fi
	fi
	for attempt in 1 2 3; do
		read -r port < <(_idem_free_ports 1) || true
		[[ -n ${port:-} ]] || idem_die "could not find a free loopback port"
		if [[ -n $lockfd ]]; then
			store="$run/nats" log="$run/natsdev.log" cleanup=""
		else
			store="$run/nats.$port" log="$run/natsdev.$port.log"
			cleanup="; rm -rf '$store' '$log'"
		fi
		"$bin" -addr "127.0.0.1:$port" -store "$store" </dev/null >"$log" 2>&1 &
		pid=$!
		for ((i = 0; i < 80; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			if grep -qxF "natsdev: ready nats://127.0.0.1:$port" "$log" 2>/dev/null; then
				[[ -z $lockfd ]] || exec {lockfd}>&-
				NATS_URL="nats://127.0.0.1:$port"
				NATSDEV_PID=$pid
				export NATS_URL NATSDEV_PID
				idem_on_exit "_idem_stop_pid $pid natsdev 10$cleanup"
				idem_log "nats: started bin/natsdev on $NATS_URL (store $store, log $log, pid $pid)"
				return 0
			fi
			sleep 0.25
		done
		_idem_stop_pid "$pid" natsdev 2
		idem_log "nats: natsdev attempt $attempt failed: $(tail -n 3 "$log" 2>/dev/null | tr '\n' ' ')"
		[[ -z $cleanup ]] || rm -rf "$store" "$log"
	done
	[[ -z $lockfd ]] || exec {lockfd}>&-
	idem_die "natsdev did not start, see $log"
}

# ---------------------------------------------------------------------------
# PgBouncer

# ensure_pgbouncer: the tests that put PgBouncer in front of PostgreSQL
# start their own from the pgbouncer program; export its path as
# PGBOUNCER_BIN. Installs
# the pgbouncer package with apt-get when missing and we are root (Debian
# keeps the program in /usr/sbin, which a user's PATH may lack); otherwise
# those tests skip, saying why.
ensure_pgbouncer() {
	local bin
	bin=$(command -v pgbouncer 2>/dev/null || true)
	[[ -n $bin || ! -x /usr/sbin/pgbouncer ]] || bin=/usr/sbin/pgbouncer
	if [[ -z $bin && $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		idem_log "pgbouncer: not installed; installing the pgbouncer package with apt-get, for the tests behind a real PgBouncer (docs/development.md)"
		# The package lists are refreshed only when the install needs it.
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends pgbouncer >&2 ||
			{ DEBIAN_FRONTEND=noninteractive apt-get update >&2 &&
				DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends pgbouncer >&2; } ||
			idem_log "pgbouncer: apt-get install pgbouncer failed; the PgBouncer tests will skip"
		bin=$(command -v pgbouncer 2>/dev/null || true)
		[[ -n $bin || ! -x /usr/sbin/pgbouncer ]] || bin=/usr/sbin/pgbouncer
	fi
	if [[ -z $bin ]]; then
		idem_log "pgbouncer: not installed (apt-get install pgbouncer); the PgBouncer tests will skip"
		return 0
	fi
	PGBOUNCER_BIN=$bin
	export PGBOUNCER_BIN
	idem_log "pgbouncer: $PGBOUNCER_BIN"
}

# ensure_chromium: the console's browser tests (e2e/console_test.go) drive
# a headless Chromium. Installs Debian's chromium package with apt-get when
# it is missing and we are root (as CI is); otherwise those tests skip and
# say why.
ensure_chromium() {
	if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
		idem_log "chromium: $(command -v chromium || command -v chromium-browser)"
		return 0
	fi
	if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		idem_log "chromium: not installed, installing Debian's chromium package with apt-get (for the console's browser tests)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >&2 ||
			{ DEBIAN_FRONTEND=noninteractive apt-get update >&2 &&
				DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >&2; } ||
			idem_log "chromium: apt-get install chromium failed; the browser tests will skip"
	fi
	if command -v chromium >/dev/null 2>&1; then
		idem_log "chromium: $(command -v chromium)"
	else
		idem_log "chromium: not installed (apt-get install chromium); the console's browser tests will skip"
	fi
}

# ---------------------------------------------------------------------------
# Go toolchain

# ensure_cgo_compiler: `go test -race` needs cgo and a C compiler. Installs gcc
# with apt-get when missing and we are root; otherwise fails with a hint.
ensure_cgo_compiler() {
	command -v go >/dev/null 2>&1 || idem_die "go is not on PATH (install Go $(sed -n 's/^go //p' "$IDEMPAY_ROOT/go.mod") or newer)"
	local cc
	cc=$(go env CC 2>/dev/null) || cc=gcc
	cc=${cc%% *}
	if ! command -v "${cc:-gcc}" >/dev/null 2>&1; then
		if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
			idem_log "no C compiler for go test -race, installing gcc with apt-get"
			{ DEBIAN_FRONTEND=noninteractive apt-get update >&2 &&
				DEBIAN_FRONTEND=noninteractive apt-get install -y gcc libc6-dev >&2; } ||
				idem_die "apt-get install gcc failed"
		else
			idem_die "go test -race needs a C compiler ($cc); install gcc"
		fi
	fi
	if [[ ${CGO_ENABLED:-} == 0 ]]; then
		idem_die "CGO_ENABLED=0 is set but go test -race needs cgo; unset it"
	fi
}
