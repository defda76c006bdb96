-- name: IdempotencyKeyDeleteFinishedBefore :execrows
-- One bounded retention batch: finished records created before the cutoff,
-- oldest first, through the partial index on created_at.
DELETE FROM idempotency_keys
WHERE id IN (
    SELECT ik.id FROM idempotency_keys ik
    WHERE ik.recovery_point = 'finished'
      AND ik.created_at < @created_before
    ORDER BY ik.created_at
    LIMIT @max_records
    FOR UPDATE SKIP LOCKED
);
