-- name: EventInsert :exec
-- Records one event in the settling batch, with the version of the object
-- that the batch's guarded update of the object wrote: the object's row lock
-- orders its events, and nothing any other object writes is touched. The id
-- is a pure function of the event (events.ID): a row that has it is this
-- event, committed already, and is left as it is (events.Record says why).
INSERT INTO events (id, account_id, type, object_id, object_version, data)
VALUES (@id, @account_id, @type, @object_id, @object_version, @data)
ON CONFLICT (id) DO NOTHING;

-- name: EventGetByID :one
SELECT * FROM events WHERE account_id = @account_id AND id = @id;

-- name: EventList :many
-- Newest first (events_account_created, backwards); the cursor is the
-- (created_at, seq) of the last event of the previous page (NULL: from the
-- newest).
SELECT * FROM events
WHERE account_id = @account_id
  AND (sqlc.narg(before_seq)::bigint IS NULL
       OR (created_at, seq) < (sqlc.narg(before_created_at)::timestamptz, sqlc.narg(before_seq)::bigint))
ORDER BY created_at DESC, seq DESC
LIMIT @max_rows;

-- name: EventListUnpublished :many
SELECT * FROM events WHERE published_at IS NULL ORDER BY seq LIMIT @max_rows;

-- name: EventMarkPublished :exec
UPDATE events SET published_at = now() WHERE id = ANY (@ids::text[]) AND published_at IS NULL;

-- name: EventOldestUnpublished :one
-- The created time of the oldest event not yet published, now() when none
-- (outbox lag).
SELECT COALESCE(min(created_at), now())::timestamptz FROM events WHERE published_at IS NULL;
