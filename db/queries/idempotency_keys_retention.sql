-- name: IdempotencyKeyDeleteFinishedBefore :execrows
-- One bounded retention batch: finished records created more than
-- @keep_seconds ago by the database's clock (or the runner's, sqlc.narg(now),
-- which stamped their creation), oldest first, through the partial index on
-- created_at. A record's ledger row, which the delete sets to NULL, may be
-- locked by another transaction (an operator's): the batch waits for it at
-- most @row_lock_wait (lockwait.go), then fails, deleting nothing, and
-- the next pass tries again.
DELETE FROM idempotency_keys
WHERE set_config('lock_timeout', @row_lock_wait::text, true) IS NOT NULL
  AND id IN (
    SELECT ik.id FROM idempotency_keys ik
    WHERE ik.recovery_point = 'finished'
      AND ik.created_at < coalesce(sqlc.narg(now)::timestamptz, now()) - make_interval(secs => @keep_seconds::float8)
    ORDER BY ik.created_at
    LIMIT @max_records
    FOR UPDATE SKIP LOCKED
);
