-- name: ChargeGetByID :one
SELECT * FROM charges WHERE account_id = @account_id AND id = @id;

-- name: ChargeList :many
-- Newest first. The cursor is the last charge of the previous page; a NULL
-- cursor starts at the newest.
SELECT * FROM charges
WHERE account_id = @account_id
  AND (sqlc.narg(cursor_created_at)::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg(cursor_created_at)::timestamptz, sqlc.narg(cursor_id)::text))
ORDER BY created_at DESC, id DESC
LIMIT @max_rows;

-- name: ChargeGet :one
-- A charge of any account, for operator commands (idempay webhooks trigger).
SELECT * FROM charges WHERE id = @id;
