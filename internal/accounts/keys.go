package accounts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
	"github.com/idempay/idempay/internal/listing"
)

// Routes of the API keys, as stored on idempotency records.
const (
	RouteKeys = "/v1/api_keys"
	RouteKey  = "/v1/api_keys/:id"
)

// secretNote stands in the stored (replayed) answer of a key's creation in
// place of the secret, which is never stored.
const secretNote = "The secret is shown only in the first answer to this request and is not stored; " +
	"if it was lost, revoke this key and create another."

// KeysAPI is what POST, GET /v1/api_keys and DELETE /v1/api_keys/{id} do
// (their HTTP adapter is accountshttp.Keys).
type KeysAPI struct {
	pool   *pgxpool.Pool
	q      *dbsqlc.Queries
	runner *idempotency.Runner
}

// NewKeysAPI returns the API and registers its operations with the runner,
// so that the completer finishes a creation or revocation that crashed.
// They call no one outside (RegisterLocal): their records are never parked.
func NewKeysAPI(pool *pgxpool.Pool, runner *idempotency.Runner) *KeysAPI {
	k := &KeysAPI{pool: pool, q: dbsqlc.New(), runner: runner}
	runner.RegisterLocal(http.MethodPost, RouteKeys, func() idempotency.Operation { return &createKeyOp{k: k} })
	runner.RegisterLocal(http.MethodDelete, RouteKey, func() idempotency.Operation { return &revokeKeyOp{k: k} })
	return k
}

// APIKey is the API representation of a key: never its hash, and its
// secret only in the answer that created it.
type APIKey struct {
	ID         string     `json:"id"`
	Object     string     `json:"object"`
	Prefix     string     `json:"prefix"`
	Secret     *string    `json:"secret"`
	Note       string     `json:"note,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
}

func apiKeyJSON(row dbsqlc.ApiKey) APIKey {
	k := APIKey{ID: row.ID, Object: "api_key", Prefix: row.Prefix, CreatedAt: row.CreatedAt.UTC()}
	if row.LastUsedAt != nil {
		t := row.LastUsedAt.UTC()
		k.LastUsedAt = &t
	}
	return k
}

// List is one page of the account's active keys, newest first.
type List = listing.List[APIKey]

// List is GET /v1/api_keys: one page of at most limit of the account's
// active keys, newest first, after the key startingAfter when it is not "".
// The cursor may be a key revoked since the page before was read: it still
// marks the place. One that is no key of the account is a 400 naming it.
func (k *KeysAPI) List(ctx context.Context, accountID string, limit int, startingAfter string) (List, error) {
	p := &dbsqlc.APIKeyListParams{AccountID: accountID, MaxRows: int32(limit + 1)}
	if startingAfter != "" {
		cur, err := k.q.APIKeyGetByID(ctx, k.pool, &dbsqlc.APIKeyGetByIDParams{AccountID: accountID, ID: startingAfter})
		if errors.Is(db.NotFound(err), db.ErrNotFound) {
			return List{}, apierror.Invalid(apierror.InvalidParam{Name: "starting_after", Reason: "is not an API key of this account"})
		} else if err != nil {
			return List{}, fmt.Errorf("reading cursor API key: %w", err)
		}
		p.CursorCreatedAt, p.CursorID = &cur.CreatedAt, &cur.ID
	}
	rows, err := k.q.APIKeyList(ctx, k.pool, p)
	if err != nil {
		return List{}, fmt.Errorf("listing API keys: %w", err)
	}
	return listing.Page(rows, limit, apiKeyJSON), nil
}

// noParams is the body of POST /v1/api_keys: an empty object.
type noParams struct{}

// Validate has nothing to check: an empty object is the whole of it.
func (noParams) Validate() error { return nil }

// Create makes another key for the account; req is its POST, key and body
// read (idempotency.PrepareBody). Like every POST it is idempotent; its
// stored answer (what a retry replays) carries the key's id and prefix and
// a note instead of the secret, which is never stored. The body is refused
// as every body is (jsonbody): one that is not JSON is an invalid-json
// that says where it breaks, and JSON other than {} (a field, a name given
// twice, text that is not valid Unicode) an invalid-request naming each
// place. Its fingerprint covers the body as sent, in its RFC 8785 form.
// Errors are a refusal of the body (*apierror.Error), the core's
// (*idempotency.Error) or the database's.
func (k *KeysAPI) Create(ctx context.Context, accountID string, req idempotency.Request) (idempotency.Response, error) {
	var p noParams
	if err := apierror.FromBody(jsonbody.Decode(req.Body, &p, "")); err != nil {
		if pe := (*apierror.Error)(nil); errors.As(err, &pe) && pe.Type == apierror.InvalidRequest {
			pe.Detail = "The body of POST /v1/api_keys is an empty JSON object: {}."
		}
		return idempotency.Response{}, err
	}
	if err := req.Normalize(json.RawMessage(req.Body)); err != nil {
		return idempotency.Response{}, err
	}
	op := &createKeyOp{k: k, accountID: accountID}
	resp, err := k.runner.Run(ctx, req, op)
	if err != nil {
		return idempotency.Response{}, err
	}
	if !resp.Replayed && op.secret != "" {
		shown := apiKeyJSON(op.key)
		shown.Secret = &op.secret
		body, err := json.Marshal(shown)
		if err != nil {
			return idempotency.Response{}, err
		}
		resp.Body = body
	}
	return resp, nil
}

// createKeyOp inserts the key in the claim transaction; there is no
// downstream call.
type createKeyOp struct {
	k         *KeysAPI
	accountID string
	key       dbsqlc.ApiKey
	secret    string // known only to the process that made it
}

// Begin queues the key's insert into the claim's batch. Its foreign key
// locks the account's row (FOR KEY SHARE), which an operator's FOR UPDATE
// or an open delete of the account would hold: it waits at most RowLockWait.
func (op *createKeyOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	if err := b.LimitLockWait(ctx); err != nil {
		return err
	}
	var err error
	op.key, op.secret, err = NewKey(ctx, b, op.accountID, &rec.ID)
	return err
}

func (op *createKeyOp) Load(ctx context.Context, rec *idempotency.Record) error {
	var err error
	op.key, err = op.k.q.APIKeyGetByIdempotencyKeyID(ctx, op.k.pool, &rec.ID)
	return err
}

func (op *createKeyOp) Call(_ context.Context, rec *idempotency.Record) idempotency.Step {
	if op.key.CreatedAt.IsZero() { // inserted by this process, in the claim's batch
		op.key.CreatedAt = rec.CreatedAt
	}
	return idempotency.Finish(func(context.Context, *idempotency.Batch) (idempotency.Response, error) {
		stored := apiKeyJSON(op.key)
		stored.Note = secretNote
		body, err := json.Marshal(stored)
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: http.StatusCreated, Body: body, Headers: idempotency.Headers{
			ContentType: "application/json", Location: RouteKeys + "/" + op.key.ID}}, nil
	})
}

// Revoke revokes the account's key id. With req, a request under the
// client's Idempotency-Key (or Idempotency-Token), it runs through the
// idempotency core, so a retry replays the first 204 instead of answering
// 404 (the Azure guideline); with nil, a request without a key, it is a
// plain revocation. The account's last active key cannot be revoked (409):
// the account would lock itself out. Every process refuses the key from the
// moment the revocation commits, since each reads the key from the database
// on every request (I11).
//
// Revocations of one account's keys take the account's row lock first, in a
// statement of their own (APIKeyLockAccount), and count the account's keys
// in a later one, which sees every revocation committed before the lock was
// granted: of two revocations of an account's last two keys, exactly one
// succeeds and the other is refused as the last key.
func (k *KeysAPI) Revoke(ctx context.Context, accountID, callerKeyID, id string, req *idempotency.Request) (idempotency.Response, error) {
	if req != nil {
		return k.runner.Run(ctx, *req, &revokeKeyOp{k: k, accountID: accountID, keyID: id})
	}
	if _, err := db.WithTx(ctx, k.pool, func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
		// The account's lock is waited for as a claim waits for it: a
		// transaction that holds it without end gets this request a 409
		// resource-busy, not a wait as long as its client's.
		if err := k.runner.LimitLockWait(ctx, tx); err != nil {
			return struct{}{}, err
		}
		if err := k.q.APIKeyLockAccount(ctx, tx, accountID); err != nil {
			return struct{}{}, fmt.Errorf("locking the account: %w", err)
		}
		// Read under the lock, in the transaction: what is checked holds
		// until the revocation commits. The caller's own key first: one
		// revoked since the request authenticated (by a revocation that
		// took this lock before) revokes nothing (I11), as the claim's
		// INSERT refuses it on the path with an Idempotency-Key.
		if active, err := k.active(ctx, tx, accountID, callerKeyID); err != nil {
			return struct{}{}, fmt.Errorf("reading the caller's API key: %w", err)
		} else if !active {
			return struct{}{}, apierror.New(apierror.Unauthorized, "The API key was revoked; nothing was revoked.")
		}
		if err := k.checkRevocable(ctx, tx, accountID, id); err != nil {
			return struct{}{}, err
		}
		if err := k.q.APIKeyRevoke(ctx, tx, &dbsqlc.APIKeyRevokeParams{AccountID: accountID, ID: id}); err != nil {
			return struct{}{}, fmt.Errorf("revoking API key: %w", err)
		}
		return struct{}{}, nil
	}); err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.Response{Status: http.StatusNoContent}, nil
}

// active reads through r whether id is an active (not revoked) key of the
// account; an unknown id is not.
func (k *KeysAPI) active(ctx context.Context, r dbsqlc.DBTX, accountID, id string) (bool, error) {
	row, err := k.q.APIKeyGetByID(ctx, r, &dbsqlc.APIKeyGetByIDParams{AccountID: accountID, ID: id})
	if err = db.NotFound(err); errors.Is(err, db.ErrNotFound) {
		return false, nil
	}
	return err == nil && row.RevokedAt == nil, err
}

// checkRevocable reads through r whether the key can be revoked: it is an
// active key of the account, and not its last one.
func (k *KeysAPI) checkRevocable(ctx context.Context, r dbsqlc.DBTX, accountID, id string) error {
	if active, err := k.active(ctx, r, accountID, id); err != nil {
		return fmt.Errorf("reading API key: %w", err)
	} else if !active {
		return apierror.New(apierror.NotFound, "No such active API key.")
	}
	// Two rows tell whether id is the only one.
	active, err := k.q.APIKeyList(ctx, r, &dbsqlc.APIKeyListParams{AccountID: accountID, MaxRows: 2})
	if err != nil {
		return fmt.Errorf("listing API keys: %w", err)
	}
	if len(active) == 1 && active[0].ID == id {
		return apierror.New(apierror.LastAPIKey, "This is the account's last active API key; create another before revoking it.")
	}
	return nil
}

// revokeKeyOp revokes the key in the claim transaction (the revocation
// commits with its record); there is no downstream call, and the answer is
// 204.
type revokeKeyOp struct {
	k         *KeysAPI
	accountID string
	keyID     string
}

// Begin checks that the key can be revoked, reading before the phase, then
// queues the account's lock and the guarded revocation into the claim's
// batch: each statement of the batch takes a snapshot of its own, so the
// revocation sees every revocation committed before the lock was granted.
// One that changed what was checked raises ErrStale, and the runner reads
// and checks again (which answers the last key's 409, or 404).
func (op *revokeKeyOp) Begin(ctx context.Context, b *idempotency.Batch, _ *idempotency.Record) error {
	k := op.k
	if err := k.checkRevocable(ctx, k.pool, op.accountID, op.keyID); err != nil {
		return err
	}
	if err := b.LimitLockWait(ctx); err != nil {
		return err
	}
	if err := k.q.APIKeyLockAccount(ctx, b, op.accountID); err != nil {
		return fmt.Errorf("locking the account: %w", err)
	}
	if err := k.q.APIKeyRevoke(ctx, b, &dbsqlc.APIKeyRevokeParams{AccountID: op.accountID, ID: op.keyID}); err != nil {
		return fmt.Errorf("revoking API key: %w", err)
	}
	return nil
}

// Load has nothing to read: the revocation committed with the record.
func (op *revokeKeyOp) Load(context.Context, *idempotency.Record) error { return nil }

func (op *revokeKeyOp) Call(context.Context, *idempotency.Record) idempotency.Step {
	return idempotency.Finish(func(context.Context, *idempotency.Batch) (idempotency.Response, error) {
		return idempotency.Response{Status: http.StatusNoContent}, nil
	})
}
