-- name: AccountInsert :one
INSERT INTO accounts (name) VALUES (@name) RETURNING *;

-- name: AccountGetByID :one
SELECT * FROM accounts WHERE id = @id;

-- name: AccountSetMode :execrows
UPDATE accounts SET idempotency_mode = @idempotency_mode WHERE id = @id;
