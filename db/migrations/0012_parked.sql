-- A ceiling on how long an unfinished record is retried (I16). Stripe keeps
-- an idempotency key for about 24 hours ("keys may be removed after they are
-- at least 24 hours old"); a call under a key Stripe has forgotten runs as a
-- new payment. So a record still unfinished when it is older than the
-- ceiling (IDEMPOTENCY_RETRY_CEILING, well under 24 h) is parked: never
-- called downstream again, neither by the completer nor by a client's retry,
-- and left to Stripe's events and reconciliation, which finish it the way
-- they finish any record (Runner.Settle). A state of its own, so that key
-- inspection shows it and the completer's index leaves it out.
--
-- ALTER TYPE ... ADD VALUE may run in the migration's transaction, but the
-- new label cannot be used before that transaction commits: nothing below
-- names 'parked'.
ALTER TYPE recovery_point ADD VALUE 'parked' BEFORE 'finished';

-- The completer's index held every record that is not finished. A parked
-- record is never claimed again; the index now holds only the records the
-- completer may resume, and the claim names the same two points.
DROP INDEX idempotency_keys_unfinished_next_attempt;
CREATE INDEX idempotency_keys_resumable_next_attempt ON idempotency_keys (next_attempt_at)
    WHERE recovery_point IN ('started', 'downstream_called');

-- A Stripe event whose object cannot be applied (it does not decode as the
-- object its type names: a non-integer amount, a field of another type) ends
-- processed with the outcome failed and the reason in last_error, instead of
-- staying unprocessed and retried forever.
ALTER TABLE stripe_events
    DROP CONSTRAINT stripe_events_outcome_check,
    ADD CONSTRAINT stripe_events_outcome_check
        CHECK (outcome IN ('applied', 'stale', 'ignored', 'unknown_object', 'failed'));
