-- name: AccountInsert :one
INSERT INTO accounts (name, api_key_hash)
VALUES (@name, @api_key_hash)
RETURNING *;

-- name: AccountGetByAPIKeyHash :one
SELECT * FROM accounts WHERE api_key_hash = @api_key_hash;

-- name: AccountGetByID :one
SELECT * FROM accounts WHERE id = @id;
