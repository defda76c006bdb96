#!/usr/bin/env bash
# Run idempay locally from a fresh checkout (this is `make up`):
#
#   1. find or start PostgreSQL and create the `idempay` database
#      (or use $DATABASE_URL as is, creating its database if missing),
#   2. build bin/idempay, start a Stripe on loopback (bin/stripe-mock, or with
#      STRIPE=fake bin/stripefake, the test suite's Stripe fake, which
#      keeps PaymentIntents: declines pm_card_chargeDeclined, asks 3-D Secure for
#      pm_card_threeDSecure2Required), and find or
#      start NATS JetStream (ensure_nats),
#   3. apply migrations,
#   4. run `idempay serve` (with the outbox relay) and `idempay consume`,
#   5. reuse the demo account saved in .run/demo-account (mode 600) while its
#      key works, else create a `demo` account and save it there,
#   6. print the API key (to a terminal only) and example commands, and run
#      until Ctrl-C / SIGTERM, which stop the server, the consumer, the
#      Stripe and a NATS of our own; the exit status is then 0 (1 if one of
#      them had to be killed).
#
# Environment: LISTEN_ADDR (default 127.0.0.1:8080), CONSOLE_ADDR (default
# the API's host and port + 2), STRIPE (mock, the
# default, or fake), DATABASE_URL and NATS_URL (optional),
# IDEMPOTENCY_LOCK_TIMEOUT and IDEMPOTENCY_RETENTION (passed through).
set -euo pipefail

# Ctrl-C in a terminal interrupts the terminal's foreground process group:
# make as well as this script. An interrupted make dies of the signal itself
# once its recipe ends (or exits 2), whatever the recipe exits with, so
# `make up` would end in failure however cleanly it stopped. So, when it runs
# in the foreground of a terminal, this script first moves into a process
# group of its own and takes the terminal, as a shell does for a foreground
# job (the same process, re-executed; python3 makes the two system calls).
# Ctrl-C then reaches this script alone, which stops everything and exits 0,
# and make with it. The terminal is handed back on exit.
if [[ -z ${_IDEM_UP_TERMINAL:-} && -t 0 ]] && command -v python3 >/dev/null 2>&1; then
	export _IDEM_UP_TERMINAL=1
	exec python3 -c '
import os, signal, sys
ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
try:
    old = os.getpgrp()
    if os.tcgetpgrp(0) == old and os.getsid(0) != os.getpid():
        os.setpgid(0, 0)
        try:
            os.tcsetpgrp(0, os.getpgrp())
            os.environ["_IDEM_UP_TERMINAL_PGRP"] = str(old)
        except OSError:
            os.setpgid(0, old)
except OSError:
    pass
signal.signal(signal.SIGTTOU, ttou)
for s in (signal.SIGPIPE, signal.SIGXFSZ):  # python ignores them; a shell does not
    signal.signal(s, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])
' bash "${BASH_SOURCE[0]}" "$@"
fi

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$IDEMPAY_ROOT"

# Stopping `make up` is its normal end: after Ctrl-C or SIGTERM, exit 0 once
# everything stopped cleanly (lib.sh).
IDEM_SIGNAL_EXIT=clean

# _up_give_back_terminal: the terminal back to the process group that had it
# before this script took it (make's), once everything else has stopped.
_up_give_back_terminal() {
	python3 -c '
import os, signal, sys
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
try:
    os.tcsetpgrp(0, int(sys.argv[1]))
except OSError:
    pass
' "$_IDEM_UP_TERMINAL_PGRP" 2>/dev/null || true
}
if [[ -n ${_IDEM_UP_TERMINAL_PGRP:-} ]]; then
	idem_on_exit _up_give_back_terminal # the first hook, so it runs last
fi

STRIPE=${STRIPE:-mock}
case $STRIPE in
mock | fake) ;;
*) idem_die "STRIPE must be mock (stripe-mock, the default) or fake (the Stripe fake, which keeps PaymentIntents: declines, 3-D Secure); got '$STRIPE'" ;;
esac

LISTEN_ADDR=${LISTEN_ADDR:-127.0.0.1:8080}
export LISTEN_ADDR

listen_port=${LISTEN_ADDR##*:}
listen_host=${LISTEN_ADDR%:*}
listen_host=${listen_host#[}
listen_host=${listen_host%]}
[[ $LISTEN_ADDR == *:* && $listen_port =~ ^[0-9]+$ ]] ||
	idem_die "LISTEN_ADDR must look like host:port (got '$LISTEN_ADDR')"
case $listen_host in
'' | 0.0.0.0) client_host=127.0.0.1 ;;
:: | ::0) client_host=::1 ;;
*) client_host=$listen_host ;;
esac
if [[ $client_host == *:* ]]; then
	api_url="http://[$client_host]:$listen_port"
else
	api_url="http://$client_host:$listen_port"
fi

# port_busy HOST PORT: true if the address cannot be bound (or something answers).
port_busy() {
	if command -v python3 >/dev/null 2>&1; then
		if python3 - "$1" "$2" <<'EOF' 2>/dev/null; then
import socket, sys
host, port = sys.argv[1] or None, int(sys.argv[2])
for family, type_, proto, _, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
    s = socket.socket(family, type_, proto)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's net.Listen does
    s.bind(addr)
    s.close()
    break
EOF
			return 1
		fi
		return 0
	fi
	(: <"/dev/tcp/$client_host/$2") 2>/dev/null
}

if port_busy "$listen_host" "$listen_port"; then
	idem_die "LISTEN_ADDR $LISTEN_ADDR is already in use (another \`make up\`?). Stop that process or pick another address, e.g. LISTEN_ADDR=127.0.0.1:8081 make up"
fi

# 1. PostgreSQL
ensure_postgres
if [[ -n ${DATABASE_URL:-} ]]; then
	DATABASE_URL=$(ensure_database_url "$DATABASE_URL")
else
	DATABASE_URL=$(ensure_database idempay)
fi
export DATABASE_URL

# 2. Binaries and a Stripe: stripe-mock (stateless, never declines) or, with
# STRIPE=fake, the Stripe fake (keeps its PaymentIntents, declines
# pm_card_chargeDeclined, asks 3-D Secure for pm_card_threeDSecure2Required).
idem_log "building bin/idempay"
go build -o bin/idempay ./cmd/idempay
if [[ $STRIPE == fake ]]; then
	build_stripe_fake
	start_stripe_fake
	STRIPE_API_URL=$STRIPE_FAKE_URL
	stripe_name="the Stripe fake, STRIPE=fake"
else
	build_stripe_mock
	start_stripe_mock
	STRIPE_API_URL=$STRIPE_MOCK_URL
	stripe_name="stripe-mock"
	# stripe-mock lists the same fixed objects whatever was made, none of
	# them idempay's: reconciliation inside serve would only flag them.
	# `make up STRIPE=fake` reconciles, as production does.
	export RECONCILE_INTERVAL=${RECONCILE_INTERVAL:-0}
fi
# NATS JetStream for the order.paid consumer and the outbox relay: NATS_URL,
# else the NATS on 127.0.0.1:4222, else one of our own (bin/natsdev).
ensure_nats
export STRIPE_API_URL
export STRIPE_SECRET_KEY=sk_test_123
# Neither Stripe sends webhooks: `idempay webhooks trigger` signs and posts
# them with this secret, as Stripe would with an endpoint's secret.
if [[ -z ${STRIPE_WEBHOOK_SECRET:-} ]]; then
	STRIPE_WEBHOOK_SECRET="whsec_demo_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
fi
export STRIPE_WEBHOOK_SECRET
# Webhooks out (docs/webhooks-out.md): the key that seals the endpoints'
# signing secrets, made once and kept in .run/ (mode 600) so that the
# endpoints of an earlier run still sign; and, for the demo only, endpoints
# on loopback over plain http (the listener below).
mkdir -p .run
if [[ -z ${WEBHOOK_SECRETS_KEY:-} ]]; then
	if [[ ! -s .run/webhook-secrets-key ]]; then
		(umask 077 && head -c 32 /dev/urandom | base64 >.run/webhook-secrets-key)
	fi
	WEBHOOK_SECRETS_KEY=$(cat .run/webhook-secrets-key)
fi
export WEBHOOK_SECRETS_KEY
export WEBHOOK_ALLOW_PRIVATE=on WEBHOOK_ALLOW_HTTP=on

# 3. Schema
idem_log "applying migrations"
if ! bin/idempay migrate; then
	# While idempay has no installed base its one schema file is edited in
	# place (db/migrations/0001_schema.sql says why), so a demo database
	# made by an earlier checkout is refused: it is the demo's only.
	idem_log "if it says an applied migration changed: the demo database was made by an earlier version of the schema file; \`make clean\` drops it (and what the tests left), then \`make up\` again"
	exit 1
fi

# The console (docs/console.md) on the API's port + 2, unless CONSOLE_ADDR
# says otherwise or that port is taken (then none).
if [[ -z ${CONSOLE_ADDR:-} ]] && ! port_busy "$listen_host" "$((listen_port + 2))"; then
	CONSOLE_ADDR="$client_host:$((listen_port + 2))"
fi
export CONSOLE_ADDR=${CONSOLE_ADDR:-}
console_line="(off: CONSOLE_ADDR is not set and port $((listen_port + 2)) is taken)"
if [[ -n $CONSOLE_ADDR ]]; then
	console_line="http://$CONSOLE_ADDR (sign in with the API key below)"
fi

# 4. Serve. The server runs in its own session so that Ctrl-C reaches only
# this script, which then stops it once with SIGTERM (graceful shutdown) and
# stops the Stripe afterwards.
idem_log "starting idempay serve on $LISTEN_ADDR"
if [[ $- != *m* ]] && command -v setsid >/dev/null 2>&1; then
	setsid bin/idempay serve &
else
	bin/idempay serve &
fi
server_pid=$!
idem_on_exit "_idem_stop_pid $server_pid 'idempay serve' 20"

# The order.paid consumer, beside the server (run more of them to share the
# work); the outbox relay runs inside serve.
consumer_metrics=""
if ! port_busy "$listen_host" "$((listen_port + 1))"; then
	consumer_metrics="$client_host:$((listen_port + 1))"
fi
idem_log "starting idempay consume"
if [[ $- != *m* ]] && command -v setsid >/dev/null 2>&1; then
	METRICS_ADDR=$consumer_metrics setsid bin/idempay consume &
else
	METRICS_ADDR=$consumer_metrics bin/idempay consume &
fi
consumer_pid=$!
idem_on_exit "_idem_stop_pid $consumer_pid 'idempay consume' 20"

ready=""
for ((i = 0; i < 240; i++)); do
	if ! kill -0 "$server_pid" 2>/dev/null; then
		rc=0
		wait "$server_pid" || rc=$?
		idem_die "idempay serve exited with status $rc before listening on $LISTEN_ADDR"
	fi
	if (: <"/dev/tcp/$client_host/$listen_port") 2>/dev/null; then
		ready=1
		break
	fi
	sleep 0.25
done
[[ -n $ready ]] || idem_die "idempay serve did not start listening on $LISTEN_ADDR within 60s"

# 5. The demo account: the one an earlier run saved in .run/demo-account, if
# its key still works on this server (so a second `make up` shows the
# charges of the first), else a new one, saved there. The key goes to curl
# on stdin, never on a command line, and is printed to a terminal only.
mkdir -p .run
demo_account=.run/demo-account

# api_key_status KEY: the status of GET /v1/charges with KEY (200: it works).
api_key_status() {
	curl -s -o /dev/null -w '%{http_code}' --max-time 10 -H @- "$api_url/v1/charges?limit=1" \
		<<<"Authorization: Bearer $1" || true
}

# json_field NAME: read a JSON object on stdin, print its string field NAME.
json_field() {
	if command -v python3 >/dev/null 2>&1; then
		python3 -c '
import json, sys
text = sys.stdin.read().strip()
try:
    obj = json.loads(text)
except ValueError:  # tolerate stray lines around the object
    obj = json.loads([l for l in text.splitlines() if l.lstrip().startswith("{")][-1])
print(obj[sys.argv[1]])' "$1"
	else
		sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\\([^\"]*\\)\".*/\\1/p" | tail -n 1
	fi
}

account_id="" api_key="" account_note=""
if [[ -f $demo_account ]]; then
	chmod 600 "$demo_account"
	account_id=$(sed -n 's/^DEMO_ACCOUNT_ID=\(acct_[a-z0-9]*\)$/\1/p' "$demo_account" | tail -n 1)
	api_key=$(sed -n 's/^DEMO_API_KEY=\(sk_idem_[0-9a-f]*\)$/\1/p' "$demo_account" | tail -n 1)
	key_status=none
	if [[ -n $account_id && -n $api_key ]]; then
		key_status=$(api_key_status "$api_key")
	fi
	if [[ $key_status == 200 ]]; then
		account_note="reused from $demo_account"
		idem_log "demo account: reusing $account_id from $demo_account"
	else
		account_note="NEW: the account saved in $demo_account does not work on this server (GET /v1/charges with its key: $key_status); this one has no charges yet"
		idem_log "demo account: the one saved in $demo_account does not work on this server (GET /v1/charges with its key: $key_status); creating a new one"
		account_id="" api_key=""
	fi
fi
if [[ -z $account_id ]]; then
	idem_log "creating the demo account"
	account_json=$(bin/idempay accounts create --name demo)
	account_id=$(json_field id <<<"$account_json") || account_id=
	api_key=$(json_field api_key <<<"$account_json") || api_key=
	unset account_json
	[[ $account_id =~ ^acct_[a-z0-9]+$ && $api_key =~ ^sk_idem_[0-9a-f]+$ ]] ||
		idem_die "could not read id and api_key from the output of \`idempay accounts create\`"
	(
		umask 077
		tmp="$demo_account.tmp.$$"
		printf '# The demo account of make up, reused by the next run while its key works.\nDEMO_ACCOUNT_ID=%s\nDEMO_API_KEY=%s\n' \
			"$account_id" "$api_key" >"$tmp"
		chmod 600 "$tmp"
		mv -f "$tmp" "$demo_account"
	)
	account_note=${account_note:-"NEW, saved in $demo_account for the next make up"}
fi

# What `idempay webhooks trigger`, `idempay reconcile` and the client
# commands (`idempay charges ...`: the demo account's key) need to reach
# this server, its database and its Stripe, kept out of the terminal (the
# database URL may hold a password; mode 600, like the key's own file).
demo_env=.run/demo.env
(
	umask 077
	printf 'DATABASE_URL=%q\nLISTEN_ADDR=%q\nSTRIPE_WEBHOOK_SECRET=%q\nNATS_URL=%q\nSTRIPE_API_URL=%q\nSTRIPE_SECRET_KEY=%q\nIDEMPAY_API_URL=%q\nIDEMPAY_API_KEY=%q\n' \
		"$DATABASE_URL" "$LISTEN_ADDR" "$STRIPE_WEBHOOK_SECRET" "$NATS_URL" "$STRIPE_API_URL" "$STRIPE_SECRET_KEY" "$api_url" "$api_key" >"$demo_env"
	chmod 600 "$demo_env"
)

# The merchant's side of webhooks out: `idempay webhooks listen` registers
# itself as an endpoint of the demo account (replacing the one of an
# earlier run) and prints each delivery it receives, with its verdict, to
# .run/webhooks-listen.log.
if [[ $client_host == *:* ]]; then
	hooks_addr="[$client_host]:$((listen_port + 3))"
else
	hooks_addr="$client_host:$((listen_port + 3))"
fi
hooks_log=.run/webhooks-listen.log
idem_log "starting idempay webhooks listen on $hooks_addr (deliveries in $hooks_log)"
if [[ $- != *m* ]] && command -v setsid >/dev/null 2>&1; then
	IDEMPAY_API_URL=$api_url IDEMPAY_API_KEY=$api_key setsid bin/idempay webhooks listen --register --addr "$hooks_addr" >"$hooks_log" &
else
	IDEMPAY_API_URL=$api_url IDEMPAY_API_KEY=$api_key bin/idempay webhooks listen --register --addr "$hooks_addr" >"$hooks_log" &
fi
listen_pid=$!
idem_on_exit "_idem_stop_pid $listen_pid 'idempay webhooks listen' 5"

metrics_hint=""
if [[ -n $consumer_metrics ]]; then
	metrics_hint="curl -s http://$consumer_metrics/metrics | grep ^idempay_orders"
fi

# 6. The banner. The key goes to a terminal only: when the output is a file
# (a log), the commands read the key from $demo_account instead.
idem_key="demo-$(date +%s)-$RANDOM"
if [[ -t 1 ]]; then
	key_shown=$api_key
	key_line="KEY=$api_key"
else
	key_shown="in $demo_account (not printed: the output is not a terminal)"
	key_line="KEY=\$(sed -n 's/^DEMO_API_KEY=//p' $IDEMPAY_ROOT/$demo_account)"
fi
if [[ $STRIPE == fake ]]; then
	decline_hint=$(
		cat <<EOF
 A declined card: the Stripe fake declines Stripe's test payment method
 pm_card_chargeDeclined. The answer is 402 card-declined, a final answer
 that is stored like a success: run it twice, the second is the replay.

curl -s -i $api_url/v1/charges \\
  -H "Authorization: Bearer \$KEY" \\
  -H 'Idempotency-Key: $idem_key-declined' \\
  -H 'Content-Type: application/json' \\
  -d '{"amount":2000,"currency":"usd","payment_method":"pm_card_chargeDeclined"}'

 3-D Secure: pm_card_threeDSecure2Required answers requires_action with the
 customer's page (next_action.redirect_to_url.url); open it with
 ?result=succeed, then Stripe's event settles the charge:

SCA=\$(curl -s $api_url/v1/charges -H "Authorization: Bearer \$KEY" \\
  -H 'Idempotency-Key: $idem_key-3ds' -H 'Content-Type: application/json' \\
  -d '{"amount":4200,"currency":"eur","payment_method":"pm_card_threeDSecure2Required"}')
echo "\$SCA"
curl -s "\$(echo "\$SCA" | sed -n 's/.*"url":"\([^"]*\)".*/\1/p')?result=succeed"
(set -a; . $demo_env; bin/idempay webhooks trigger payment_intent.succeeded --charge "\$(echo "\$SCA" | sed -n 's/.*"id":"\(ch_[^"]*\)".*/\1/p')")
EOF
	)
else
	decline_hint=$(
		cat <<EOF
 stripe-mock is stateless: it answers every PaymentIntent with one fixed
 object, so a new charge stays pending until Stripe's event (the trigger
 payment_intent.succeeded above), and it never declines or asks for
 3-D Secure. Run make up STRIPE=fake for those: the Stripe fake keeps
 PaymentIntents as Stripe does.
EOF
	)
fi

cat <<EOF

==============================================================================
 idempay is running

   API          $api_url
   console      $console_line
   account      $account_id (demo, $account_note)
   API key      $key_shown
   database     $(_idem_redact "$DATABASE_URL")
   Stripe       $STRIPE_API_URL ($stripe_name)

 Make a charge (paste into another terminal, in $IDEMPAY_ROOT):

$key_line
curl -s -i $api_url/v1/charges \\
  -H "Authorization: Bearer \$KEY" \\
  -H 'Idempotency-Key: $idem_key' \\
  -H 'Content-Type: application/json' \\
  -d '{"amount":2000,"currency":"usd","payment_method":"pm_card_visa","description":"demo charge"}'

 Run it twice and see the replay: the second call returns the stored
 response of the first (same charge id, header Idempotent-Replayed: true)
 and charges nothing again.
 Change the Idempotency-Key to make a new charge.

 Then have "Stripe" tell the server something later, as a signed webhook
 (neither Stripe here sends any; this is what \`stripe trigger\` does): the
 PaymentIntent succeeded (stale if it had already), then a dispute.

CHARGE=\$(curl -s $api_url/v1/charges -H "Authorization: Bearer \$KEY" | grep -o '"id":"ch_[^"]*"' | head -n 1 | cut -d '"' -f 4)
(set -a; . $demo_env; bin/idempay webhooks trigger payment_intent.succeeded --charge "\$CHARGE")
(set -a; . $demo_env; bin/idempay webhooks trigger charge.dispute.created --charge "\$CHARGE")
curl -s $api_url/v1/charges/\$CHARGE -H "Authorization: Bearer \$KEY"

 Authorize now, capture later: an authorization ("capture": false answers
 requires_capture), its event (stale with the fake), a capture of part of it.

AUTH=\$(curl -s $api_url/v1/charges -H "Authorization: Bearer \$KEY" \\
  -H 'Idempotency-Key: $idem_key-auth' -H 'Content-Type: application/json' \\
  -d '{"amount":5000,"currency":"usd","payment_method":"pm_card_visa","capture":false}' | sed -n 's/.*"id":"\(ch_[^"]*\)".*/\1/p')
(set -a; . $demo_env; bin/idempay webhooks trigger payment_intent.amount_capturable_updated --charge "\$AUTH")
curl -s -i $api_url/v1/charges/\$AUTH/capture -H "Authorization: Bearer \$KEY" \\
  -H 'Idempotency-Key: $idem_key-capture' -H 'Content-Type: application/json' -d '{"amount":3000}'

 Run the trigger twice: a new event each time, applied once each (the
 second is stale). Other types: idempay webhooks trigger --help.

$decline_hint

 A billing service's order.paid message on NATS JetStream ($NATS_URL),
 charged by the consumer; publish it twice: one charge. Then the events
 idempay published for it (also on the stream IDEMPAY_EVENTS):

(set -a; . $demo_env; bin/idempay orders publish --account $account_id --amount 4200 --order-id $idem_key-order)
(set -a; . $demo_env; bin/idempay orders publish --account $account_id --amount 4200 --order-id $idem_key-order)
curl -s '$api_url/v1/charges?limit=1' -H "Authorization: Bearer \$KEY"
curl -s '$api_url/v1/events?limit=3' -H "Authorization: Bearer \$KEY"
$metrics_hint

 Webhooks out: every event above also goes, signed, to a local endpoint of
 the demo account served by \`idempay webhooks listen\`, which prints each
 delivery with its webhook-id and verdict. Watch it, list the deliveries,
 send one again (the same webhook-id: a duplicate at the receiver):

tail -f $hooks_log
curl -s $api_url/v1/webhook_endpoints -H "Authorization: Bearer \$KEY"
EVT=\$(curl -s '$api_url/v1/events?limit=1' -H "Authorization: Bearer \$KEY" | grep -o '"id":"evt_[^"]*"' | head -n 1 | cut -d '"' -f 4)
curl -s $api_url/v1/events/\$EVT/deliveries -H "Authorization: Bearer \$KEY"
curl -s $api_url/v1/events/\$EVT/resend -H "Authorization: Bearer \$KEY" -H 'Idempotency-Key: $idem_key-resend' -H 'Content-Type: application/json' -d '{}'

 Ctrl-C stops everything make up started (the server, the consumer, the
 Stripe, a NATS of its own) and exits 0; the demo account is kept for the
 next run.
==============================================================================

EOF

rc=0
wait "$server_pid" || rc=$?
idem_log "idempay serve exited with status $rc"
exit "$rc"
