-- name: EventInsert :one
-- Records one event in the settling transaction. The account's row lock
-- (UPDATE accounts) orders the account's settling transactions, so
-- account_seq follows their commit order.
WITH next AS (
    UPDATE accounts SET event_seq = event_seq + 1 WHERE id = @account_id RETURNING event_seq
)
INSERT INTO events (account_id, account_seq, type, object_id, data)
SELECT @account_id, next.event_seq, @type, @object_id, @data FROM next
RETURNING *;

-- name: EventGetByID :one
SELECT * FROM events WHERE account_id = @account_id AND id = @id;

-- name: EventList :many
-- Newest first; the cursor is the account_seq of the last event of the
-- previous page (NULL: from the newest).
SELECT * FROM events
WHERE account_id = @account_id
  AND (sqlc.narg(before_seq)::bigint IS NULL OR account_seq < sqlc.narg(before_seq)::bigint)
ORDER BY account_seq DESC
LIMIT @max_rows;

-- name: EventListUnpublished :many
SELECT * FROM events WHERE published_at IS NULL ORDER BY seq LIMIT @max_rows;

-- name: EventMarkPublished :exec
UPDATE events SET published_at = now() WHERE id = ANY (@ids::text[]) AND published_at IS NULL;

-- name: EventOldestUnpublished :one
-- The created time of the oldest event not yet published, now() when none
-- (outbox lag).
SELECT COALESCE(min(created_at), now())::timestamptz FROM events WHERE published_at IS NULL;
