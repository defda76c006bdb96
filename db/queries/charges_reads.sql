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

-- name: LedgerRowOfRecordExists :one
-- Whether the request of a record made its charge or refund: their ids
-- derive from the record's (ledgerID), so a row exists only when this same
-- request ran before, and Peek says what the claim would (IDE01) after
-- retention deleted the record.
SELECT (EXISTS (SELECT 1 FROM charges c WHERE c.id = @charge_id::text)
        OR EXISTS (SELECT 1 FROM refunds r WHERE r.id = @refund_id::text))::boolean AS made;
