package main

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/webhooks"
)

// TestMain lets a test run this binary's main as a child process: with
// IDEMPAY_TEST_MAIN=1, the test binary is idempay.
func TestMain(m *testing.M) {
	if os.Getenv("IDEMPAY_TEST_MAIN") == "1" {
		os.Args = append([]string{"idempay"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// idempay runs the command with exactly env (nothing inherited) and
// returns its stdout, stderr and exit status (apitest.RunCommand: one that
// has not ended in 2 minutes is killed and reported).
func idempay(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return apitest.RunCommand(t, "idempay", os.Args[0], append([]string{"IDEMPAY_TEST_MAIN=1"}, env...), args...)
}

// TestHelpNeedsNoEnvironment: --help, -h and `help` print the usage of the
// command asked about on stdout and exit 0, with no environment at all (no
// API key, no NATS_URL, no DATABASE_URL), and run nothing: `serve --help`
// does not serve.
func TestHelpNeedsNoEnvironment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string // a line of the usage that must be printed
	}{
		{[]string{"--help"}, "usage: idempay <command>"},
		{[]string{"-h"}, "usage: idempay <command>"},
		{[]string{"help"}, "usage: idempay <command>"},
		{[]string{"serve", "--help"}, "usage: idempay <command>"},
		{[]string{"consume", "-h"}, "usage: idempay <command>"},
		{[]string{"charges", "--help"}, "idempay charges create --amount N"},
		{[]string{"charges", "create", "--help"}, "idempay charges create --amount N"},
		{[]string{"refunds", "get", "-h"}, "idempay refunds get ID"},
		{[]string{"api-keys", "--help"}, "idempay api-keys revoke ID"},
		{[]string{"orders", "--help"}, "idempay orders publish --account ACCT"},
		{[]string{"orders", "publish", "-help"}, "idempay orders publish --account ACCT"},
		{[]string{"accounts", "create", "--help"}, "usage: idempay accounts create --name NAME"},
		{[]string{"webhooks", "trigger", "--help"}, "usage: idempay webhooks trigger TYPE"},
	} {
		stdout, stderr, code := idempay(t, nil, tc.args...)
		if code != 0 || !strings.Contains(stdout, tc.want) || stderr != "" {
			t.Errorf("idempay %s: exit %d, stdout %.120q, stderr %q; want exit 0 and %q on stdout, nothing on stderr",
				strings.Join(tc.args, " "), code, stdout, stderr, tc.want)
		}
	}
}

// TestErrorPrintedOnce: an error answer of the API is printed as its
// problem and one line that says "idempay:" once (it said
// "idempay: idempay: 422 ..."), against the real API and database.
func TestErrorPrintedOnce(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	client := env.NewClient(t)
	vars := []string{"IDEMPAY_API_URL=" + env.Server.URL, "IDEMPAY_API_KEY=" + client.Account.APIKey}
	key := apitest.NewKey()
	if _, stderr, code := idempay(t, vars, "charges", "create", "--amount", "100", "--payment-method", "tok_visa", "--idempotency-key", key); code != 0 {
		t.Fatalf("charges create: exit %d, stderr %s", code, stderr)
	}
	_, stderr, code := idempay(t, vars, "charges", "create", "--amount", "200", "--payment-method", "tok_visa", "--idempotency-key", key)
	if code != 1 {
		t.Fatalf("charges create with a reused key: exit %d, want 1; stderr %s", code, stderr)
	}
	if !strings.Contains(stderr, "/problems/idempotency-key-reused") {
		t.Errorf("stderr does not show the problem:\n%s", stderr)
	}
	if n := strings.Count(stderr, "idempay:"); n != 1 || !strings.Contains(stderr, "idempay: 422") {
		t.Errorf("stderr has %q %d times, want one line \"idempay: 422 ...\":\n%s", "idempay:", n, stderr)
	}
}

// TestStripeKeyOnlyForStripeCommands: STRIPE_SECRET_KEY is required by the
// commands that call Stripe, and not by relay and deliver, which never
// do: without it they get past the configuration to their own first
// requirement (NATS_URL, WEBHOOK_SECRETS_KEY).
func TestStripeKeyOnlyForStripeCommands(t *testing.T) {
	t.Parallel()
	// A database no one listens on: the pool connects lazily, and every
	// command here stops before its first query.
	env := []string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"}
	for _, tc := range []struct {
		cmd  string
		want string // in the error
	}{
		{"serve", "STRIPE_SECRET_KEY is required"},
		{"completer", "STRIPE_SECRET_KEY is required"},
		{"consume", "STRIPE_SECRET_KEY is required"},
		{"reconcile", "STRIPE_SECRET_KEY is required"},
		{"relay", "NATS_URL"},
		{"deliver", "WEBHOOK_SECRETS_KEY is not set"},
	} {
		_, stderr, code := idempay(t, env, tc.cmd)
		if code != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("idempay %s without STRIPE_SECRET_KEY: exit %d, stderr %q; want exit 1 and %q", tc.cmd, code, stderr, tc.want)
		}
		if tc.cmd == "relay" || tc.cmd == "deliver" {
			if strings.Contains(stderr, "STRIPE_SECRET_KEY") {
				t.Errorf("idempay %s asks for STRIPE_SECRET_KEY, which it never uses: %q", tc.cmd, stderr)
			}
		}
	}
}

// TestOrdersDLQFlagsRefusedClearly: a bad flag of `idempay orders dlq` (a
// limit out of its range, negative or not a number, a sequence that is not
// one) is named, with what it takes, at once: before any broker is asked
// (here there is none), exit 1, never a panic nor the usage of every
// orders command in its place.
func TestOrdersDLQFlagsRefusedClearly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--limit", "0"}, "--limit must be an integer between 1 and 100, not 0"},
		{[]string{"--limit", "101"}, "--limit must be an integer between 1 and 100, not 101"},
		{[]string{"--limit", "-5"}, "--limit must be an integer between 1 and 100, not -5"},
		{[]string{"--limit", "ten"}, `invalid value "ten" for flag -limit`},
		{[]string{"--limit", "99999999999999999999"}, `invalid value "99999999999999999999" for flag -limit: value out of range`},
		{[]string{"--starting-after", "-1"}, `invalid value "-1" for flag -starting-after`},
		{[]string{"--starting-after", "18446744073709551616"}, `invalid value "18446744073709551616" for flag -starting-after: value out of range`},
		{[]string{"--starting-after", "7x"}, `invalid value "7x" for flag -starting-after`},
	} {
		args := append([]string{"orders", "dlq"}, tc.args...)
		_, stderr, code := idempay(t, nil, args...)
		if code != 1 || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "panic") || strings.Contains(stderr, "NATS_URL") {
			t.Errorf("idempay %s: exit %d, stderr %.300q; want exit 1 and %q", strings.Join(args, " "), code, stderr, tc.want)
		}
	}
}

// TestOrdersPublishRefusesFlagsNotText: `idempay orders publish` with a
// flag's value that is not UTF-8 is refused at once, naming the flag,
// before any broker is asked (here there is none); it published the
// message with U+FFFD in place of each bad byte, an order nobody sent.
func TestOrdersPublishRefusesFlagsNotText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--order-id", "o\xff"}, "--order-id: not UTF-8 text"},
		{[]string{"--description", "caf\xe9"}, "--description: not UTF-8 text"},
		{[]string{"--idempotency-key", "k\xc3", "--payment-method", "pm_\xff"}, "--idempotency-key, --payment-method: not UTF-8 text"},
	} {
		args := append([]string{"orders", "publish", "--account", "acct_1", "--amount", "100"}, tc.args...)
		_, stderr, code := idempay(t, []string{"NATS_URL=nats://127.0.0.1:1"}, args...)
		if code != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("idempay %q: exit %d, stderr %.300q; want exit 1 and %q", args, code, stderr, tc.want)
		}
	}
}

// TestChargesListLimitRefusedClearly: `idempay charges list --limit N`
// (and `api-keys list`, which pages alike) with N out of 1 to 100 is
// refused at once, naming the flag, before any request (here the API is
// unreachable): --limit 0 listed the server's default of 10, as if the
// flag had not been given.
func TestChargesListLimitRefusedClearly(t *testing.T) {
	t.Parallel()
	env := []string{"IDEMPAY_API_URL=http://127.0.0.1:1", "IDEMPAY_API_KEY=sk_idem_x"}
	for _, list := range []string{"charges", "api-keys"} {
		for _, n := range []string{"0", "101", "-1"} {
			_, stderr, code := idempay(t, env, list, "list", "--limit", n)
			want := list + " list: --limit must be an integer between 1 and 100, not " + n
			if code != 1 || !strings.Contains(stderr, want) {
				t.Errorf("idempay %s list --limit %s: exit %d, stderr %.300q; want exit 1 and %q", list, n, code, stderr, want)
			}
		}
	}
}

// TestStrayArgumentsRefused: a word after a command's flags is refused
// with its usage, before anything is asked of the database or the broker
// (here neither is reachable). `accounts create --name Acme Corp` made an
// account named Acme, and `orders publish --description Big order`
// published "Big": the rest of an unquoted value was dropped, and the
// command succeeded; `webhooks listen --secret A B` verified with A only;
// serve, migrate, purge and the other commands that take no argument ran
// as if none had been given.
func TestStrayArgumentsRefused(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1",
		"NATS_URL=nats://127.0.0.1:1", "STRIPE_WEBHOOK_SECRET=whsec_test"}
	for _, args := range [][]string{
		{"accounts", "create", "--name", "Acme", "Corp"},
		{"orders", "publish", "--account", "acct_1", "--amount", "100", "--description", "Big", "order"},
		{"webhooks", "trigger", "payment_intent.succeeded", "--charge", "ch_1", "extra"},
		// Two secrets apart instead of comma-separated: the second was
		// dropped, and deliveries signed with it rejected. The address
		// cannot be listened on, so a run that got past the flags fails
		// without the refusal.
		{"webhooks", "listen", "--addr", "127.0.0.1:99999", "--secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_b2xk"},
		// The commands configured by the environment alone take no word:
		// `idempay migrate --dry-run` migrated, `idempay purge --older 48h`
		// purged by the configured retention.
		{"serve", "--listen", "127.0.0.1:9000"},
		{"migrate", "--dry-run"},
		{"purge", "--older", "48h"},
		{"completer", "now"},
		{"consume", "orders.paid"},
		{"relay", "once"},
		{"deliver", "4"},
	} {
		_, stderr, code := idempay(t, env, args...)
		if code != 1 || !strings.Contains(stderr, "usage") || !strings.Contains(stderr, "stray argument") {
			t.Errorf("idempay %q: exit %d, stderr %.300q; want exit 1 refusing the stray argument, with the usage", args, code, stderr)
		}
	}
}

// TestTriggerStatusRefusedClearly: `idempay webhooks trigger --help` says
// what --status takes for each type (a refund's status, every dispute
// status idempay knows, a canceled PaymentIntent's cancellation_reason),
// where the flag's help named a refund's status and a closed dispute's
// only; and a --status the type does not take, an unknown event type
// among them, is refused at once with what it takes, before the database
// is asked (here it is unreachable): it was sent to the server, and a
// dispute in a status idempay does not know came back unknown_object.
func TestTriggerStatusRefusedClearly(t *testing.T) {
	t.Parallel()
	stdout, _, code := idempay(t, nil, "webhooks", "trigger", "--help")
	for typ, values := range webhooks.TriggerStatuses {
		for _, want := range values {
			if code != 0 || !strings.Contains(stdout, want) {
				t.Errorf("idempay webhooks trigger --help: exit %d, does not name %s's --status %s; stdout:\n%s", code, typ, want, stdout)
			}
		}
	}
	for _, want := range []string{"warning_needs_response", "warning_under_review", "warning_closed", "needs_response", "under_review", "won", "lost"} {
		if !slices.Contains(webhooks.TriggerStatuses["charge.dispute.updated"], want) {
			t.Errorf("charge.dispute.updated's --status values %q lack %s", webhooks.TriggerStatuses["charge.dispute.updated"], want)
		}
	}
	env := []string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1", "STRIPE_WEBHOOK_SECRET=whsec_test"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"charge.dispute.closed", "--status", "bogus"}, `--status "bogus" is not one of charge.dispute.closed's: warning_needs_response, warning_under_review, warning_closed, needs_response, under_review, won, lost`},
		{[]string{"charge.dispute.updated", "--status", "succeeded"}, `--status "succeeded" is not one of charge.dispute.updated's`},
		{[]string{"refund.updated", "--status", "won"}, `--status "won" is not one of refund.updated's: succeeded, pending, requires_action, failed, canceled`},
		{[]string{"payment_intent.canceled", "--status", "expired"}, `--status "expired" is not one of payment_intent.canceled's`},
		{[]string{"charge.succeeded", "--status", "failed"}, "charge.succeeded takes no --status"},
		{[]string{"charge.disputed", "--status", "won"}, `unknown event type "charge.disputed"`},
	} {
		args := append([]string{"webhooks", "trigger", tc.args[0], "--charge", "ch_1"}, tc.args[1:]...)
		_, stderr, code := idempay(t, env, args...)
		if code != 1 || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "connect") {
			t.Errorf("idempay %q: exit %d, stderr %.400q; want exit 1 and %q, before the database", args, code, stderr, tc.want)
		}
	}
	// A status the type takes passes, to the database.
	for _, st := range []string{"needs_response", "under_review", "warning_needs_response", "warning_under_review", "warning_closed", "won", "lost"} {
		args := []string{"webhooks", "trigger", "charge.dispute.updated", "--charge", "ch_1", "--status", st}
		if _, stderr, code := idempay(t, env, args...); code != 1 || !strings.Contains(stderr, "connect") {
			t.Errorf("idempay %q: exit %d, stderr %.300q; want it past the flags, to the unreachable database", args, code, stderr)
		}
	}
}

// TestMetadataKeyTwiceRefused: `idempay charges create` with one
// metadata key given twice is refused, naming the key, before any request
// (here the API is unreachable), as the API refuses a name given twice in
// a body; the second value silently replaced the first.
func TestMetadataKeyTwiceRefused(t *testing.T) {
	t.Parallel()
	env := []string{"IDEMPAY_API_URL=http://127.0.0.1:1", "IDEMPAY_API_KEY=sk_idem_x"}
	args := []string{"charges", "create", "--amount", "100", "--payment-method", "pm_card_visa",
		"--metadata", "order=1", "--metadata", "order=2"}
	_, stderr, code := idempay(t, env, args...)
	if want := `metadata key "order" is given twice`; code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("idempay %q: exit %d, stderr %.300q; want exit 1 and %q", args, code, stderr, want)
	}
}

// TestRelayRefusesNoInterval: RELAY_INTERVAL=0 keeps the relay out of
// serve; `idempay relay` with it is refused at once, naming the variable,
// where it ran its passes without a pause (thousands of queries a second
// on an empty outbox). The database here is unreachable: the refusal comes
// before anything is asked of it.
func TestRelayRefusesNoInterval(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1",
		"NATS_URL=nats://127.0.0.1:1", "RELAY_INTERVAL=0"}
	_, stderr, code := idempay(t, env, "relay")
	if code != 1 || !strings.Contains(stderr, "RELAY_INTERVAL must be above 0") {
		t.Errorf("idempay relay with RELAY_INTERVAL=0: exit %d, stderr %.300q; want exit 1 naming RELAY_INTERVAL", code, stderr)
	}
}

// TestOrdersReplayNeedsAWholeSequence: `idempay orders replay SEQ` replays
// the dead letter SEQ names, all of it: "5abc" was read as 5 and replayed
// dead letter 5. A SEQ that is not a whole number from 1 is refused at
// once, naming it, before any broker is asked (here there is none).
func TestOrdersReplayNeedsAWholeSequence(t *testing.T) {
	t.Parallel()
	for _, seq := range []string{"5abc", "-1", "0", "", " 7", "18446744073709551616", "1e3"} {
		_, stderr, code := idempay(t, nil, "orders", "replay", seq)
		want := "SEQ must be a dead letter's stream sequence, a whole number from 1, not " + strconv.Quote(seq)
		if code != 1 || !strings.Contains(stderr, want) {
			t.Errorf("idempay orders replay %q: exit %d, stderr %.300q; want exit 1 and %q", seq, code, stderr, want)
		}
	}
}

// TestRepeatedFlagRefused: a flag that takes one value, given twice, is
// refused, naming it, before anything is asked of the API, the database or
// the broker (none is reachable here): Go's flag package kept the last
// value and said nothing, so `--amount 5 --amount 7` charged 7, where the
// API refuses a field given twice. --metadata stays repeatable, one key a
// time.
func TestRepeatedFlagRefused(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1",
		"NATS_URL=nats://127.0.0.1:1", "STRIPE_WEBHOOK_SECRET=whsec_test", "STRIPE_SECRET_KEY=sk_test_x",
		"STRIPE_API_URL=http://127.0.0.1:1", "IDEMPAY_API_URL=http://127.0.0.1:1", "IDEMPAY_API_KEY=sk_idem_x"}
	for _, tc := range []struct {
		flag string
		args []string
	}{
		{"amount", []string{"charges", "create", "--amount", "5", "--payment-method", "pm_card_visa", "--amount", "7"}},
		{"capture", []string{"charges", "create", "--amount", "5", "--payment-method", "pm_card_visa", "--capture=false", "--capture=true"}},
		{"amount", []string{"charges", "capture", "ch_1", "--amount", "5", "--amount=7"}},
		{"limit", []string{"charges", "list", "--limit", "2", "-limit", "3"}},
		{"charge", []string{"refunds", "create", "--charge", "ch_1", "--amount", "5", "--charge", "ch_2"}},
		{"idempotency-key", []string{"api-keys", "revoke", "key_1", "--idempotency-key", "a", "--idempotency-key", "b"}},
		{"amount", []string{"orders", "publish", "--account", "acct_1", "--amount", "5", "--amount", "7"}},
		{"limit", []string{"orders", "dlq", "--limit", "2", "--limit", "3"}},
		{"name", []string{"accounts", "create", "--name", "Acme", "--name", "Corp"}},
		{"charge", []string{"webhooks", "trigger", "payment_intent.succeeded", "--charge", "ch_1", "--charge", "ch_2"}},
		{"addr", []string{"webhooks", "listen", "--addr", "127.0.0.1:99999", "--addr", "127.0.0.1:99998"}},
		{"since", []string{"reconcile", "--since", "1h", "--since", "2h"}},
	} {
		_, stderr, code := idempay(t, env, tc.args...)
		if want := "--" + tc.flag + " is given more than once"; code != 1 || !strings.Contains(stderr, want) {
			t.Errorf("idempay %q: exit %d, stderr %.300q; want exit 1 and %q", tc.args, code, stderr, want)
		}
	}
	// Metadata is a flag given once per key: two keys pass the flags, to
	// the usage that the missing --payment-method gets.
	args := []string{"charges", "create", "--amount", "5", "--metadata", "a=1", "--metadata", "b=2"}
	if _, stderr, code := idempay(t, env, args...); code != 1 || strings.Contains(stderr, "more than once") || !strings.Contains(stderr, "usage") {
		t.Errorf("idempay %q: exit %d, stderr %.300q; want it past its flags, to the usage", args, code, stderr)
	}
}

// TestOrdersPublishRefusesWhatTheConsumerRefuses: `idempay orders publish`
// checks its message as the consumer does (orders.Check: the charge's
// fields as POST /v1/charges checks them, the key as the consumer takes
// it) and refuses, in the consumer's words, one it would dead-letter, at
// once, before any broker is asked (here there is none): --amount -5 was
// published, to end as a dead letter.
func TestOrdersPublishRefusesWhatTheConsumerRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--amount", "-5"}, "amount must be an integer between 1 and 99999999"},
		{[]string{"--amount", "100000000"}, "amount must be an integer between 1 and 99999999"},
		{[]string{"--amount", "100", "--currency", "xyz"}, "currency must be a supported three-letter ISO 4217 code"},
		{[]string{"--amount", "100", "--idempotency-key", " k"}, "idempotency_key has white space around it"},
	} {
		args := append([]string{"orders", "publish", "--account", "acct_1"}, tc.args...)
		_, stderr, code := idempay(t, []string{"NATS_URL=nats://127.0.0.1:1"}, args...)
		if code != 1 || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "stream ORDERS") {
			t.Errorf("idempay %q: exit %d, stderr %.300q; want exit 1 and %q, before the broker", args, code, stderr, tc.want)
		}
	}
}
