#!/usr/bin/env bash
# Run idempay locally from a fresh checkout (this is `make up`):
#
#   1. find or start PostgreSQL and create the `idempay` database
#      (or use $DATABASE_URL as is, creating its database if missing),
#   2. build bin/idempay and bin/stripe-mock, start stripe-mock on loopback,
#      and find or start NATS JetStream (ensure_nats),
#   3. apply migrations and create a `demo` account,
#   4. print the API key and example commands, then run `idempay serve`
#      (with the outbox relay) and `idempay consume` until Ctrl-C / SIGTERM,
#      which stop them, stripe-mock and a NATS of our own.
#
# Environment: LISTEN_ADDR (default 127.0.0.1:8080), DATABASE_URL and
# NATS_URL (optional), IDEMPOTENCY_LOCK_TIMEOUT and IDEMPOTENCY_RETENTION
# (passed through).
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$IDEMPAY_ROOT"

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

# 2. Binaries and stripe-mock
idem_log "building bin/idempay"
go build -o bin/idempay ./cmd/idempay
build_stripe_mock
start_stripe_mock
# NATS JetStream for the order.paid consumer and the outbox relay: NATS_URL,
# else the NATS on 127.0.0.1:4222, else one of our own (bin/natsdev).
ensure_nats
export STRIPE_API_URL=$STRIPE_MOCK_URL
export STRIPE_SECRET_KEY=sk_test_123
# stripe-mock sends no webhooks: `idempay webhooks trigger` signs and posts
# them with this secret, as Stripe would with an endpoint's secret.
if [[ -z ${STRIPE_WEBHOOK_SECRET:-} ]]; then
	STRIPE_WEBHOOK_SECRET="whsec_demo_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
fi
export STRIPE_WEBHOOK_SECRET

# 3. Schema and a demo account
idem_log "applying migrations"
bin/idempay migrate

idem_log "creating the demo account"
account_json=$(bin/idempay accounts create --name demo)

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
account_id=$(json_field id <<<"$account_json") || account_id=
api_key=$(json_field api_key <<<"$account_json") || api_key=
[[ -n $account_id && -n $api_key ]] ||
	idem_die "could not read id and api_key from \`idempay accounts create\` output: $account_json"

# 4. Serve. The server runs in its own session so that Ctrl-C reaches only
# this script, which then stops it once with SIGTERM (graceful shutdown) and
# stops stripe-mock afterwards.
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

# What `idempay webhooks trigger` needs to reach this server and its
# database, kept out of the terminal (the database URL may hold a password).
mkdir -p .run
demo_env=.run/demo.env
(
	umask 077
	printf 'DATABASE_URL=%q\nLISTEN_ADDR=%q\nSTRIPE_WEBHOOK_SECRET=%q\nNATS_URL=%q\n' \
		"$DATABASE_URL" "$LISTEN_ADDR" "$STRIPE_WEBHOOK_SECRET" "$NATS_URL" >"$demo_env"
)

metrics_hint=""
if [[ -n $consumer_metrics ]]; then
	metrics_hint="curl -s http://$consumer_metrics/metrics | grep ^idempay_orders"
fi

idem_key="demo-$(date +%s)-$RANDOM"
cat <<EOF

==============================================================================
 idempay is running

   API          $api_url
   account      $account_id (demo)
   API key      $api_key
   database     $(_idem_redact "$DATABASE_URL")
   stripe-mock  $STRIPE_MOCK_URL

 Make a charge (paste into another terminal):

curl -s -i $api_url/v1/charges \\
  -H 'Authorization: Bearer $api_key' \\
  -H 'Idempotency-Key: $idem_key' \\
  -H 'Content-Type: application/json' \\
  -d '{"amount":2000,"currency":"usd","payment_method":"tok_visa","description":"demo charge"}'

 Run it twice and see the replay: the second call returns the stored
 response of the first (same charge id, header Idempotent-Replayed: true)
 and charges nothing again.
 Change the Idempotency-Key to make a new charge.

 Then have "Stripe" tell the server something later, as a signed webhook
 (stripe-mock sends none; this is what \`stripe trigger\` does): a dispute.

CHARGE=\$(curl -s $api_url/v1/charges -H 'Authorization: Bearer $api_key' | grep -o '"id":"ch_[^"]*"' | head -n 1 | cut -d '"' -f 4)
(set -a; . $demo_env; bin/idempay webhooks trigger charge.dispute.created --charge "\$CHARGE")
curl -s $api_url/v1/charges/\$CHARGE -H 'Authorization: Bearer $api_key'

 Run the trigger twice: a new event each time, applied once each (the
 second is stale). Other types: idempay webhooks trigger --help.

 A billing service's order.paid message on NATS JetStream ($NATS_URL),
 charged by the consumer; publish it twice: one charge. Then the events
 idempay published for it (also on the stream IDEMPAY_EVENTS):

(set -a; . $demo_env; bin/idempay orders publish --account $account_id --amount 4200 --order-id 1042)
(set -a; . $demo_env; bin/idempay orders publish --account $account_id --amount 4200 --order-id 1042)
curl -s '$api_url/v1/charges?limit=1' -H 'Authorization: Bearer $api_key'
curl -s '$api_url/v1/events?limit=3' -H 'Authorization: Bearer $api_key'
$metrics_hint
 Ctrl-C stops the server and stripe-mock.
==============================================================================

EOF

rc=0
wait "$server_pid" || rc=$?
idem_log "idempay serve exited with status $rc"
exit "$rc"
