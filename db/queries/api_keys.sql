-- name: APIKeyExpectActive :exec
-- First in the claim's batch of an API request: the API key that sent it
-- is still active and belongs to the account whose scope the record is
-- claimed in. A revocation committed since the request's first statement
-- read the key raises IDA01, and nothing of the batch commits: the request
-- is refused (401) as if it had come after the revocation, which it did
-- (I11). A plain read, like APIKeyAuthenticate: it takes no lock.
SELECT idempay_expect(
    (SELECT count(*) FROM api_keys
     WHERE key_hash = @key_hash AND account_id = @account_id AND revoked_at IS NULL),
    'IDA01', 'the API key is not active');
