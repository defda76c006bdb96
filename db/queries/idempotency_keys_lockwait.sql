-- name: IdempotencyKeyLockWait :exec
-- Queued by an operation before it locks a row that other transactions
-- lock too (Batch.LimitLockWait): PostgreSQL's lock_timeout for the
-- batch's implicit transaction only (set_config's is_local), so that a
-- statement that waits longer than @lock_timeout (Config.RowLockWait, as
-- '5000ms') for a row lock another transaction holds fails with
-- lock_not_available (55P03), and nothing of the batch commits. '0ms' is
-- PostgreSQL's own 0: no bound.
SELECT set_config('lock_timeout', @lock_timeout::text, true);
