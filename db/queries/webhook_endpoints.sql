-- name: WebhookEndpointLockAccount :exec
-- Runs creations of an account's endpoints one after another, so that the
-- guarded insert after it counts every endpoint committed before it (as
-- APIKeyLockAccount does for revocations). FOR NO KEY UPDATE: it does not
-- wait for an insert that checks its foreign key to the account.
SELECT 1 FROM accounts WHERE id = @account_id FOR NO KEY UPDATE;

-- name: WebhookEndpointCount :one
SELECT count(*) FROM webhook_endpoints WHERE account_id = @account_id;

-- name: WebhookEndpointInsert :exec
-- A new endpoint, with the id and sealed secret its maker chose (it is
-- queued in the claim's batch, after WebhookEndpointLockAccount), unless
-- the account has @max_endpoints already: the caller counted fewer in a
-- read, and when that no longer holds it raises IDS01, and the caller
-- counts again.
WITH w AS (
    INSERT INTO webhook_endpoints (id, account_id, url, enabled_events, secret, idempotency_key_id)
    SELECT @id, @account_id, @url, @enabled_events, @secret, @idempotency_key_id
    WHERE (SELECT count(*) FROM webhook_endpoints WHERE account_id = @account_id) < @max_endpoints::bigint
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM w), 'IDS01', 'the account''s endpoints changed since they were counted');

-- name: WebhookEndpointGetByID :one
-- The endpoint, and now: the database's now() unless a test passes its
-- clock (Config.Now), by which a request judges the times the endpoint's
-- answer shows (whether the previous secret still signs) and a recovery's
-- window, in the read it makes anyway.
SELECT sqlc.embed(webhook_endpoints), coalesce(sqlc.narg(now)::timestamptz, now())::timestamptz AS now
FROM webhook_endpoints WHERE account_id = @account_id AND id = @id;

-- name: WebhookEndpointExists :one
-- Whether the account has the endpoint, and now as WebhookEndpointGetByID
-- has it, in one row even when it has not: a recovery's request judges
-- its since by that now before it answers that the endpoint is unknown.
SELECT coalesce(sqlc.narg(now)::timestamptz, now())::timestamptz AS now,
       EXISTS (SELECT 1 FROM webhook_endpoints WHERE account_id = @account_id AND id = @id) AS found;

-- name: WebhookEndpointGetByIdempotencyKeyID :one
SELECT * FROM webhook_endpoints WHERE idempotency_key_id = @idempotency_key_id;

-- name: WebhookEndpointList :many
-- The account's endpoints, each with now as WebhookEndpointGetByID has it.
SELECT sqlc.embed(webhook_endpoints), coalesce(sqlc.narg(now)::timestamptz, now())::timestamptz AS now
FROM webhook_endpoints WHERE account_id = @account_id ORDER BY created_at, id;

-- name: WebhookEndpointUpdate :exec
-- The merchant's change, guarded by the version read before the phase
-- (IDS01 when it changed: the runner reads and applies it again).
WITH w AS (
    UPDATE webhook_endpoints
    SET url = @url, enabled_events = @enabled_events, enabled = @enabled,
        disabled_reason = CASE WHEN @enabled THEN NULL ELSE disabled_reason END,
        failing_since = CASE WHEN @enabled AND NOT enabled THEN NULL ELSE failing_since END,
        version = version + 1, updated_at = now()
    WHERE account_id = @account_id AND id = @id AND version = @version
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM w), 'IDS01', 'the webhook endpoint changed since it was read');

-- name: WebhookEndpointRotate :exec
-- A new secret; the one before stays valid (signed with as well) until
-- previous_expires_at, @overlap_seconds after now: the database's now()
-- (the transaction's time, which the claim's batch reads as the record's
-- created_at) unless a test passes its clock (Config.Now), the clock the
-- workers judge it by (WebhookDeliveryClaim's claimed_at). Guarded like
-- WebhookEndpointUpdate.
WITH w AS (
    UPDATE webhook_endpoints
    SET previous_secret = secret,
        previous_expires_at = coalesce(sqlc.narg(now)::timestamptz, now()) + make_interval(secs => @overlap_seconds::float8),
        secret = @secret,
        version = version + 1, updated_at = now()
    WHERE account_id = @account_id AND id = @id AND version = @version
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM w), 'IDS01', 'the webhook endpoint changed since it was read');

-- name: WebhookEndpointDelete :one
-- Deletes the account's endpoint, only while the API key that asked is
-- still active (I11): a revocation committed since the request
-- authenticated deletes nothing, and key_active says so. A plain read of
-- the key, in the statement that writes, as the claim's INSERT reads it.
WITH k AS (
    SELECT 1 FROM api_keys ak
    WHERE ak.id = @key_id AND ak.account_id = @account_id AND ak.revoked_at IS NULL
), d AS (
    DELETE FROM webhook_endpoints we
    WHERE we.account_id = @account_id AND we.id = @id AND EXISTS (SELECT 1 FROM k)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM k)::boolean AS key_active, (SELECT count(*) FROM d)::bigint AS deleted;

-- name: WebhookEndpointsLock :many
-- A batch's endpoints, locked first in its recording transaction, in id
-- order: every transaction that writes an endpoint and its deliveries
-- (recording a batch, disabling or enabling an endpoint, the fan-out, a
-- resend, a recovery) takes the endpoint's row before the deliveries'
-- rows, so that none waits for another in a cycle. Returns the failure
-- clocks as they are under the lock (another worker's batch may have
-- started one since this batch was claimed).
SELECT id, failing_since FROM webhook_endpoints WHERE id = ANY (@ids::text[]) ORDER BY id FOR NO KEY UPDATE;

-- name: WebhookEndpointsLockFree :many
-- WebhookEndpointsLock without waiting: the batch's endpoints that no
-- other transaction holds, locked. A batch whose recording waited past
-- RowLockWait for an endpoint (an operator's open transaction) records
-- the deliveries of these and leaves the others leased (finish).
SELECT id, failing_since FROM webhook_endpoints WHERE id = ANY (@ids::text[]) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED;

-- name: WebhookEndpointsSucceeded :exec
-- The endpoints an attempt of a batch reached: no longer failing.
UPDATE webhook_endpoints SET failing_since = NULL WHERE id = ANY (@ids::text[]) AND failing_since IS NOT NULL;

-- name: WebhookEndpointsFailed :many
-- The endpoints every attempt of a batch failed at: failing since now
-- unless they were already; returns whether each has been failing for
-- @disable_after_seconds (it is to be disabled). Now is the database's
-- now() unless a test passes its clock (Config.Now).
UPDATE webhook_endpoints SET failing_since = COALESCE(failing_since, coalesce(sqlc.narg(now)::timestamptz, now()))
WHERE id = ANY (@ids::text[])
RETURNING id, (failing_since <= coalesce(sqlc.narg(now)::timestamptz, now())
                                - make_interval(secs => @disable_after_seconds::float8))::boolean AS disable;

-- name: WebhookEndpointDisable :one
-- idempay disables the endpoint (reason 'gone' or 'failing'); no row when
-- it is disabled already. now is as WebhookEndpointGetByID has it.
UPDATE webhook_endpoints
SET enabled = false, disabled_reason = @reason, version = version + 1, updated_at = now()
WHERE id = @id AND enabled
RETURNING sqlc.embed(webhook_endpoints), coalesce(sqlc.narg(now)::timestamptz, now())::timestamptz AS now;

-- name: WebhookDeliveriesPause :exec
-- The endpoint is disabled: its pending deliveries leave the workers' due
-- index (paused) until it is enabled again. A statement of its own, after
-- the endpoint's update in the same transaction, so that its snapshot sees
-- every delivery a concurrent fan-out, resend or recovery committed while
-- it waited for the endpoint's row (they lock it FOR SHARE). Stated as the
-- head-of-line index's predicate, which finds the endpoint's unfinished
-- deliveries and not its delivered ones.
UPDATE webhook_deliveries SET state = 'paused'
WHERE endpoint_id = @endpoint_id AND state <> 'delivered' AND state <> 'failed' AND state = 'pending';

-- name: WebhookDeliveriesUnpause :exec
-- The endpoint is enabled again: its paused deliveries are pending, due
-- when they were (so at once, for most).
UPDATE webhook_deliveries SET state = 'pending'
WHERE endpoint_id = @endpoint_id AND state <> 'delivered' AND state <> 'failed' AND state = 'paused';

-- name: WebhookDeliveriesGiveBack :exec
-- Claimed deliveries a worker did not send, its lease nearly spent when it
-- came to them (the process stalled): due again at once, with no attempt,
-- unless another worker has claimed them since.
UPDATE webhook_deliveries d SET lease_until = NULL
FROM (SELECT unnest(@ids::text[]) AS id, unnest(@claims::bigint[]) AS claims) u
WHERE d.id = u.id AND d.claims = u.claims;

-- name: WebhookDispatcherLock :one
-- One dispatcher pass at a time, in any number of processes: the row lock
-- lasts as long as the pass's transaction.
SELECT last_seq FROM webhook_dispatcher WHERE id = 1 FOR UPDATE;

-- name: WebhookDispatcherAdvance :exec
UPDATE webhook_dispatcher SET last_seq = @last_seq WHERE id = 1;

-- name: WebhookDispatcherRead :many
-- The seqs of the committed events after the position, in order.
SELECT seq FROM events WHERE seq > @after_seq ORDER BY seq LIMIT @max_rows;

-- name: WebhookDispatchGapsStamp :exec
-- First in a pass, before its own gaps are kept: the gaps that earlier
-- passes kept get this pass's transaction id, which the dispatcher's lock
-- gave it. A transaction that may still commit a gap's event took its seq,
-- so its id, before the earlier pass read the events, and so before this
-- pass began: its id is lower.
UPDATE webhook_dispatch_gaps SET settle_after = pg_current_xact_id() WHERE settle_after IS NULL;

-- name: WebhookDispatchGapsAdd :exec
INSERT INTO webhook_dispatch_gaps (seq)
SELECT unnest(@seqs::bigint[])
ON CONFLICT (seq) DO NOTHING;

-- name: WebhookDispatchGapsResolve :many
-- The gaps that are settled: their event committed, or every transaction
-- with an id below the gap's stamp has ended (so none of them will commit
-- it). Both are read from this statement's snapshot, the one its EXISTS
-- reads the events with, not from the commit log (pg_xact_status): a
-- transaction is committed in the log a moment before snapshots see it,
-- and a gap forgotten in that moment would lose its event. "Ended" is an
-- id below the snapshot's xmax and not in its list of running ids: a
-- snapshot does not list a running transaction whose id is at or above its
-- xmax (the last completed id, plus one), so a gap is never judged by the
-- snapshot that found it. A long transaction holds back the gaps of the
-- passes after it began, which hold nothing else back. The events are
-- looked up from the lowest gap on (events has no B-tree on seq): a few
-- recent pages, where an unbounded lookup read the whole table, or its
-- index, once per pass.
DELETE FROM webhook_dispatch_gaps g
WHERE EXISTS (SELECT 1 FROM events e WHERE e.seq = g.seq AND e.seq >= (SELECT min(seq) FROM webhook_dispatch_gaps))
   OR (g.settle_after < pg_snapshot_xmax(pg_current_snapshot())
       AND NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(pg_current_snapshot()) x WHERE x < g.settle_after))
RETURNING g.seq;

-- name: WebhookDeliveriesFanOut :execrows
-- One delivery per event (by seq, between lo and hi) and matching enabled
-- endpoint of its account created before it; repeated, it creates nothing.
-- The endpoints are locked FOR SHARE: an endpoint being disabled meanwhile
-- is either seen disabled (the lock waits, and the row is read again), or
-- disabled after this commits, and its pause then finds these deliveries
-- (WebhookDeliveriesPause): none is left pending for a disabled endpoint.
-- Locked in id order (the lock is taken above the sort), as a batch's
-- recording locks them (WebhookEndpointsLock). Each is due at once: at
-- @now, the database's now() unless a test passes its clock (Config.Now).
INSERT INTO webhook_deliveries (event_id, endpoint_id, account_id, object_id, object_version, next_attempt_at)
SELECT e.id, w.id, e.account_id, e.object_id, e.object_version, coalesce(sqlc.narg(now)::timestamptz, now())
FROM events e JOIN webhook_endpoints w ON w.account_id = e.account_id
WHERE e.seq BETWEEN @lo::bigint AND @hi::bigint AND e.seq = ANY (@seqs::bigint[])
  AND w.enabled AND w.created_at <= e.created_at
  AND (e.type::text = ANY (w.enabled_events) OR '*' = ANY (w.enabled_events))
ORDER BY w.id
FOR SHARE OF w
ON CONFLICT (event_id, endpoint_id) DO NOTHING;

-- name: WebhookDeliveryClaim :many
-- Up to @max_rows due deliveries of enabled endpoints (a disabled
-- endpoint's are paused, out of the due index; the join is the check),
-- each the lowest
-- version of its object pending for its endpoint (head of line per
-- object), oldest first, leased to the caller, each with what its attempt
-- needs: the event it sends, and its endpoint's URL and secrets. One
-- statement for a whole batch. SKIP LOCKED: two workers never
-- claim one delivery, and neither waits for the other. A batch never
-- holds two versions of one object for one endpoint: the later one waits
-- while the earlier is pending.
--
-- The plan must not depend on statistics, which a queue table outruns
-- (taken while nothing was pending, they call every partial index empty,
-- and a join was then planned as a scan of the whole backlog for each
-- delivery read). So: webhook_deliveries_due is read in order until the
-- batch is full; the head-of-line check is a subquery run once per
-- delivery read, with that delivery's endpoint and object as its keys,
-- which names pending as webhook_deliveries_object's predicate does
-- (neither delivered nor failed) so that only that index can answer it,
-- in one probe, lowest version first.
--
-- Due, leased and the lease's end are by one clock, the database's
-- now() (a test passes its own, Config.Now), never the worker's: a
-- worker whose clock runs ahead does not take a lease before it ends, nor
-- one behind send a delivery late. claimed_at is that now, which the
-- worker stamps its attempts' times from.
WITH due AS (
    SELECT d.id FROM webhook_deliveries d
    JOIN webhook_endpoints w ON w.id = d.endpoint_id AND w.enabled
    WHERE d.state = 'pending' AND d.next_attempt_at <= coalesce(sqlc.narg(now)::timestamptz, now())
      AND (d.lease_until IS NULL OR d.lease_until <= coalesce(sqlc.narg(now)::timestamptz, now()))
      AND d.object_version = (
          SELECT p.object_version FROM webhook_deliveries p
          WHERE p.endpoint_id = d.endpoint_id AND p.object_id = d.object_id
            AND p.state <> 'delivered' AND p.state <> 'failed'
          ORDER BY p.object_version LIMIT 1)
    ORDER BY d.next_attempt_at
    LIMIT @max_rows
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries d
SET lease_until = coalesce(sqlc.narg(now)::timestamptz, now()) + make_interval(secs => @lease_seconds::float8),
    claims = d.claims + 1
FROM due, events e, webhook_endpoints w
WHERE d.id = due.id AND e.id = d.event_id AND w.id = d.endpoint_id
RETURNING d.id, d.endpoint_id, d.next_attempt_at, d.attempts, d.claims,
    coalesce(sqlc.narg(now)::timestamptz, now())::timestamptz AS claimed_at,
    e.id AS event_id, e.account_id, e.type, e.object_id, e.object_version, e.data, e.created_at AS event_created_at,
    w.url, w.secret, w.previous_secret, w.previous_expires_at;

-- name: WebhookDeliveriesFinish :many
-- The outcomes of a batch's attempts (status 0: no answer; an empty error:
-- none), each fenced by its claim: a worker whose lease ran out, and whose
-- delivery another worker took, or whose delivery a resend or a recovery
-- started again meanwhile (WebhookDeliveriesResend), changes nothing. A
-- delivery paused while it was being sent (its endpoint disabled
-- meanwhile) stays paused unless it was delivered. The ids it returns are
-- the outcomes that counted. Each is due next @retry_in_seconds after now
-- (0 for one delivered, failed or gone), on the claim's clock: the
-- database's now() unless a test passes its own (WebhookDeliveryClaim).
UPDATE webhook_deliveries d
SET state = CASE WHEN d.state = 'paused' AND u.state = 'pending' THEN 'paused' ELSE u.state END,
    attempts = d.attempts + 1, lease_until = NULL,
    next_attempt_at = coalesce(sqlc.narg(now)::timestamptz, now()) + make_interval(secs => u.retry_in_seconds),
    last_status = NULLIF(u.status, 0), last_error = NULLIF(u.error, ''),
    delivered_at = CASE WHEN u.state = 'delivered' THEN coalesce(sqlc.narg(now)::timestamptz, now()) ELSE d.delivered_at END
FROM (SELECT unnest(@ids::text[]) AS id, unnest(@claims::bigint[]) AS claims, unnest(@states::text[]) AS state,
             unnest(@retry_in_seconds::float8[]) AS retry_in_seconds, unnest(@statuses::int[]) AS status,
             unnest(@errors::text[]) AS error) u
WHERE d.id = u.id AND d.claims = u.claims AND d.state IN ('pending', 'paused')
RETURNING d.id;

-- name: WebhookAttemptsInsert :exec
-- A batch's attempts, every one of them, fenced or not (status 0: no
-- answer; an empty error: none), except those of a delivery that is gone:
-- its endpoint was deleted while the batch was being sent (ON DELETE
-- CASCADE), and its attempt has nothing left to belong to. The batch's
-- endpoints are locked by then (WebhookEndpointsLock), so no delete
-- commits between this check and the insert.
INSERT INTO webhook_attempts (delivery_id, scheduled_at, started_at, duration_ms, status_code, response_body, error)
SELECT u.delivery_id, u.scheduled_at, u.started_at, u.duration_ms, NULLIF(u.status, 0), u.response_body, NULLIF(u.error, '')
FROM (SELECT unnest(@delivery_ids::text[]) AS delivery_id, unnest(@scheduled_ats::timestamptz[]) AS scheduled_at,
             unnest(@started_ats::timestamptz[]) AS started_at, unnest(@durations_ms::int[]) AS duration_ms,
             unnest(@statuses::int[]) AS status, unnest(@response_bodies::text[]) AS response_body,
             unnest(@errors::text[]) AS error) u
WHERE EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.id = u.delivery_id);

-- name: WebhookDeliveryOfEndpoint :one
-- Whether id is one of the account's endpoint's deliveries: the check of
-- a page's cursor (starting_after).
SELECT EXISTS (SELECT 1 FROM webhook_deliveries
               WHERE id = @id AND account_id = @account_id AND endpoint_id = @endpoint_id);

-- name: WebhookDeliveryListByEndpoint :many
SELECT * FROM webhook_deliveries
WHERE account_id = @account_id AND endpoint_id = @endpoint_id
  AND (sqlc.narg(before_id)::text IS NULL OR id < sqlc.narg(before_id)::text)
ORDER BY id DESC LIMIT @max_rows;

-- name: WebhookDeliveryListByEvent :many
SELECT * FROM webhook_deliveries WHERE account_id = @account_id AND event_id = @event_id ORDER BY id;

-- name: WebhookAttemptListByDeliveries :many
SELECT * FROM webhook_attempts WHERE delivery_id = ANY (@delivery_ids::text[]) ORDER BY delivery_id, id;

-- name: WebhookDeliveriesResend :exec
-- Makes the event's deliveries pending again with a new schedule, and
-- creates the missing ones for the account's enabled endpoints that want
-- it; the same event id goes out again. A worker's lease is kept: a
-- delivery being sent is not sent twice at once. claims moves on, which
-- fences that worker's finish (WebhookDeliveriesFinish): its attempt is
-- recorded, but its outcome (a failure that spent the schedule, a retry
-- hours away) does not overwrite the new schedule; the delivery goes again
-- once the lease has run out. The endpoints are locked, and each delivery
-- is due, as by the fan-out (WebhookDeliveriesFanOut).
INSERT INTO webhook_deliveries (event_id, endpoint_id, account_id, object_id, object_version, next_attempt_at)
SELECT e.id, w.id, e.account_id, e.object_id, e.object_version, coalesce(sqlc.narg(now)::timestamptz, now())
FROM events e JOIN webhook_endpoints w ON w.account_id = e.account_id
WHERE e.account_id = @account_id AND e.id = @event_id AND w.enabled
  AND (e.type::text = ANY (w.enabled_events) OR '*' = ANY (w.enabled_events))
ORDER BY w.id
FOR SHARE OF w
ON CONFLICT (event_id, endpoint_id) DO UPDATE
SET state = 'pending', attempts = 0, next_attempt_at = excluded.next_attempt_at, claims = webhook_deliveries.claims + 1;

-- name: WebhookRecoveryInsert :exec
-- A recovery, in the claim's batch of its request, until its time (the
-- batch's transaction's); the workers expand it (WebhookRecoveryExpand)
-- from its cursor, which starts at since. Guarded by the endpoint the
-- request read (WebhookEndpointExists), locked as the foreign key's check
-- would lock it: IDS01 when it was deleted since (a delete in flight is
-- waited for), and the runner reads again and answers that it is not
-- found, where the insert broke the foreign key.
WITH w AS (
    SELECT e.id FROM webhook_endpoints e WHERE e.account_id = @account_id AND e.id = @endpoint_id FOR KEY SHARE
), r AS (
    INSERT INTO webhook_recoveries (id, account_id, endpoint_id, since, after_created_at, idempotency_key_id)
    SELECT @id, @account_id, w.id, @since, @since, @idempotency_key_id FROM w
    RETURNING 1
)
SELECT idempay_expect((SELECT count(*) FROM r), 'IDS01', 'the webhook endpoint was deleted since it was read');

-- name: WebhookRecoveryGetByIdempotencyKeyID :one
SELECT * FROM webhook_recoveries WHERE idempotency_key_id = @idempotency_key_id;

-- name: WebhookRecoveryGet :one
SELECT * FROM webhook_recoveries WHERE account_id = @account_id AND endpoint_id = @endpoint_id AND id = @id;

-- name: WebhookRecoveryExpand :one
-- One chunk of a recovery, in one statement (so one transaction). The
-- oldest recovery not done that no other worker holds is locked with its
-- endpoint, SKIP LOCKED: two workers never expand one recovery at once,
-- neither waits for the other, and a recovery whose endpoint is being
-- recorded, changed or deleted waits for a later pass (a delete cascades
-- to it once this commits). The account's next @max_rows events of the
-- window after the cursor are read in (created_at, seq) order, through
-- events_account_created from the cursor on: the first chunk starts at
-- since, whatever the number of the account's older events, and every
-- event the chunks read is in the window. That order is each object's
-- version order (an event's created_at is its statement's time, after its
-- object's update took the row's lock, so after the version before it
-- committed: the schema), so an object's events are recovered in order
-- across chunks.
-- Each one the endpoint wants is sent again under its own id: pending
-- (due as the fan-out's are), or paused while the endpoint is disabled (as
-- the lock found it: a disabling that commits later pauses these
-- deliveries, as it does the fan-out's). A delivery being sent keeps its
-- worker's lease, and that worker's outcome is fenced, as by
-- WebhookDeliveriesResend. The cursor moves to the last event read. The
-- recovery is done once a chunk comes short, having read the window's
-- last event (the events after the window's end are the fan-out's), at
-- now(): the database's clock, the one its until and its events'
-- created_at are stamped by, which a GET shows done_at beside. @now (a
-- test's clock, Config.Now) is the deliveries' schedule's, and no
-- statement compares done_at with a time: only whether it is NULL. No
-- row when no recovery was free. A delivery's row that another transaction
-- holds (an operator's) is waited for at most @row_lock_wait, set before r
-- yields its row, so before any insert: past it the chunk fails, changing
-- nothing, and a later pass expands it again.
WITH r AS MATERIALIZED (
    SELECT r.id, r.account_id, r.endpoint_id, r.until, r.after_created_at, r.after_seq, w.enabled, w.enabled_events
    FROM webhook_recoveries r JOIN webhook_endpoints w ON w.id = r.endpoint_id
    WHERE r.done_at IS NULL
      AND set_config('lock_timeout', @row_lock_wait::text, true) IS NOT NULL -- the chunk's waits (lockwait.go)
    ORDER BY r.until
    LIMIT 1
    FOR NO KEY UPDATE OF r SKIP LOCKED
    FOR SHARE OF w SKIP LOCKED
), chunk AS MATERIALIZED (
    SELECT e.seq, e.id, e.type, e.object_id, e.object_version, e.created_at
    FROM events e
    WHERE e.account_id = (SELECT account_id FROM r)
      AND (e.created_at, e.seq) > ((SELECT after_created_at FROM r), (SELECT after_seq FROM r))
      AND e.created_at <= (SELECT until FROM r)
    ORDER BY e.created_at, e.seq
    LIMIT @max_rows::int
), recovered AS (
    INSERT INTO webhook_deliveries (event_id, endpoint_id, account_id, object_id, object_version, state, next_attempt_at)
    SELECT c.id, r.endpoint_id, r.account_id, c.object_id, c.object_version, CASE WHEN r.enabled THEN 'pending' ELSE 'paused' END,
           coalesce(sqlc.narg(now)::timestamptz, now())
    FROM chunk c, r
    WHERE c.type::text = ANY (r.enabled_events) OR '*' = ANY (r.enabled_events)
    ORDER BY c.created_at, c.seq
    ON CONFLICT (event_id, endpoint_id) DO UPDATE
    SET state = excluded.state, attempts = 0, next_attempt_at = excluded.next_attempt_at, claims = webhook_deliveries.claims + 1
), last AS (
    SELECT created_at, seq FROM chunk ORDER BY created_at DESC, seq DESC LIMIT 1
)
UPDATE webhook_recoveries u
SET after_created_at = COALESCE((SELECT created_at FROM last), r.after_created_at),
    after_seq = COALESCE((SELECT seq FROM last), r.after_seq),
    done_at = CASE WHEN (SELECT count(*) FROM chunk) < @max_rows::int THEN now() END
FROM r
WHERE u.id = r.id
RETURNING u.id, (u.done_at IS NOT NULL)::boolean AS done;

-- name: WebhookEventGet :one
-- The event a delivery sends.
SELECT * FROM events WHERE id = @id;

-- name: WebhookOldestPending :many
-- Per endpoint, the creation time of its oldest pending delivery (a disabled
-- endpoint's paused ones count: they go out when it is enabled again). For
-- the metrics.
SELECT endpoint_id, min(created_at)::timestamptz AS oldest
FROM webhook_deliveries WHERE state <> 'delivered' AND state <> 'failed' GROUP BY endpoint_id;

-- name: WebhookEndpointsDisabled :one
SELECT count(*) FROM webhook_endpoints WHERE NOT enabled;
