package merchanthooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
)

// secretNote stands in the stored (replayed) answer of a creation or
// rotation in place of the secret, which only the first answer shows.
const secretNote = "The signing secret is shown only in the first answer to this request; " +
	"if it was lost, rotate it (POST /v1/webhook_endpoints/{id}/rotate_secret)."

// maxEnabledEvents bounds enabled_events (the schema's CHECK).
const maxEnabledEvents = 32

// Service is webhooks out: the endpoints API, the deliveries' history,
// resend and recovery (their HTTP adapter is merchanthookshttp), and the
// dispatcher and workers (Dispatch, Work, ExpandRecovery).
type Service struct {
	pool   *pgxpool.Pool
	q      *dbsqlc.Queries
	runner *idempotency.Runner
	cfg    Config
	seal   *sealer // nil when Config.SecretsKey is not set
	events *events.Reader
	log    *slog.Logger
	// beforeSend, when set, runs before each delivery's check of its
	// lease (tests stall the worker there).
	beforeSend func()
}

// New returns the service and registers the creation of an endpoint with
// the runner, so that the completer finishes one that crashed; as local
// (RegisterLocal): its call reaches no one outside the database, and
// nothing else could finish a parked record of it (Settle is for Stripe's
// events and reconciliation), so it must never be parked. The other
// POSTs are finished by the client's retry (their record names the
// endpoint or event only in its path). Without a valid Config.SecretsKey
// (CheckSecretsKey) webhooks out are off (Enabled).
func New(pool *pgxpool.Pool, runner *idempotency.Runner, cfg Config, log *slog.Logger) *Service {
	s := &Service{pool: pool, q: dbsqlc.New(), runner: runner, cfg: cfg, events: events.NewReader(pool), log: log}
	if len(cfg.SecretsKey) > 0 {
		var err error
		if s.seal, err = newSealer(cfg.SecretsKey); err != nil {
			log.Error("webhooks out are off", "err", err)
		}
	}
	runner.RegisterLocal(http.MethodPost, RouteEndpoints, func() idempotency.Operation { return &createOp{s: s} })
	return s
}

// CheckSecretsKey reports whether key can seal the signing secrets (32
// bytes), for the configuration's check.
func CheckSecretsKey(key []byte) error {
	if len(key) != 32 {
		return fmt.Errorf("want 32 bytes, got %d", len(key))
	}
	return nil
}

// Enabled reports whether webhooks out are configured (a secrets key).
func (s *Service) Enabled() bool { return s.seal != nil }

func (s *Service) requireEnabled() error {
	if s.seal == nil {
		return &apierror.Error{Type: apierror.ServiceUnavailable, RetryAfter: 60,
			Detail: "Webhooks out are not configured on this server (WEBHOOK_SECRETS_KEY).", Cause: errNoSecretsKey}
	}
	return nil
}

// Endpoint is the API representation of a webhook endpoint: its secret only
// in the answer that created or rotated it.
type Endpoint struct {
	ID             string   `json:"id"`
	Object         string   `json:"object"`
	URL            string   `json:"url"`
	EnabledEvents  []string `json:"enabled_events"`
	Enabled        bool     `json:"enabled"`
	DisabledReason *string  `json:"disabled_reason"`
	Secret         *string  `json:"secret,omitempty"`
	Note           string   `json:"note,omitempty"`
	// PreviousSecretExpiresAt is when the secret before the last rotation
	// stops signing; nil when none does.
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	CreatedAt               time.Time  `json:"created_at"`
}

// endpointOf is row as the API shows it at now, a time on the database's
// clock (the read's, or the claim's: never this process's), which says
// whether the previous secret still signs.
func endpointOf(row dbsqlc.WebhookEndpoint, now time.Time) Endpoint {
	e := Endpoint{ID: row.ID, Object: "webhook_endpoint", URL: row.Url, EnabledEvents: row.EnabledEvents,
		Enabled: row.Enabled, DisabledReason: row.DisabledReason, CreatedAt: row.CreatedAt.UTC()}
	if row.PreviousExpiresAt != nil && row.PreviousExpiresAt.After(now) {
		t := row.PreviousExpiresAt.UTC()
		e.PreviousSecretExpiresAt = &t
	}
	return e
}

func notFound() error { return apierror.New(apierror.NotFound, "No such webhook endpoint.") }

// goneStep finishes a record whose endpoint was deleted before the record
// finished (its server died after the claim, then a DELETE came): a stored
// 404, final, where a Load that could not find the endpoint would fail on
// every retry of the key, and on every pass of the completer.
func goneStep() idempotency.Step {
	return idempotency.Finish(func(context.Context, *idempotency.Batch) (idempotency.Response, error) {
		return apierror.New(apierror.NotFound, "The webhook endpoint of this request was deleted before the request's answer was recorded.").Stored(), nil
	})
}

// get reads the account's endpoint id, and the database's now as of the
// read (Config.Now in a test); another account's is not found.
func (s *Service) get(ctx context.Context, accountID, id string) (dbsqlc.WebhookEndpoint, time.Time, error) {
	row, err := s.q.WebhookEndpointGetByID(ctx, s.pool, &dbsqlc.WebhookEndpointGetByIDParams{
		AccountID: accountID, ID: id, Now: s.cfg.dbNow()})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return row.WebhookEndpoint, row.Now, notFound()
	} else if err != nil {
		return row.WebhookEndpoint, row.Now, fmt.Errorf("reading webhook endpoint: %w", err)
	}
	return row.WebhookEndpoint, row.Now, nil
}

// Get is the account's endpoint id.
func (s *Service) Get(ctx context.Context, accountID, id string) (Endpoint, error) {
	row, now, err := s.get(ctx, accountID, id)
	if err != nil {
		return Endpoint{}, err
	}
	return endpointOf(row, now), nil
}

// List is the account's endpoints, oldest first.
func (s *Service) List(ctx context.Context, accountID string) ([]Endpoint, error) {
	rows, err := s.q.WebhookEndpointList(ctx, s.pool, &dbsqlc.WebhookEndpointListParams{AccountID: accountID, Now: s.cfg.dbNow()})
	if err != nil {
		return nil, fmt.Errorf("listing webhook endpoints: %w", err)
	}
	out := make([]Endpoint, 0, len(rows))
	for _, r := range rows {
		out = append(out, endpointOf(r.WebhookEndpoint, r.Now))
	}
	return out, nil
}

// Delete removes the account's endpoint id with its deliveries, asked by
// the account's API key keyID: a key revoked since the request
// authenticated deletes nothing (401, I11). The endpoint's and its
// deliveries' rows are locked by the workers too: the delete waits for
// them at most RowLockWait, as a claim does (Runner.LimitLockWait), and is
// refused as resource-busy past it, with nothing deleted.
func (s *Service) Delete(ctx context.Context, accountID, keyID, id string) error {
	row, err := db.WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) (dbsqlc.WebhookEndpointDeleteRow, error) {
		if err := s.runner.LimitLockWait(ctx, tx); err != nil {
			return dbsqlc.WebhookEndpointDeleteRow{}, err
		}
		return s.q.WebhookEndpointDelete(ctx, tx, &dbsqlc.WebhookEndpointDeleteParams{KeyID: keyID, AccountID: accountID, ID: id})
	})
	switch {
	case err != nil:
		return fmt.Errorf("deleting webhook endpoint: %w", err)
	case !row.KeyActive:
		return apierror.New(apierror.Unauthorized, "The API key was revoked; nothing was deleted.")
	case row.Deleted == 0:
		return notFound()
	}
	return nil
}

// decodeBody decodes the body of req strictly into p and validates it, by
// the rules every body of the API follows (jsonbody.Decode, docs/api.md):
// names match exactly, an unknown name, a name given twice or text that is
// not UTF-8 is refused, and every problem is named in invalid_params. A
// body that is not JSON is an invalid-json. The fingerprint covers the
// body as sent (its RFC 8785 form, as idempotency.Prepare makes it): these
// routes have no normalised form of their own.
func decodeBody(req *idempotency.Request, p jsonbody.Body) error {
	// expires_in is the only integer field of these bodies.
	if err := jsonbody.Decode(req.Body, p, expiresInRange); err != nil {
		return apierror.FromBody(err)
	}
	return req.Normalize(json.RawMessage(req.Body))
}

// checkEvents validates enabled_events: 1 to maxEnabledEvents known types
// or "*", each once (a type listed twice is refused rather than stored
// twice, docs/webhooks-out.md). Each entry at fault is named by its index.
func checkEvents(types []string) []jsonbody.Param {
	if len(types) == 0 || len(types) > maxEnabledEvents {
		return []jsonbody.Param{{Name: "enabled_events", Reason: fmt.Sprintf("must list 1 to %d event types, or [\"*\"]", maxEnabledEvents)}}
	}
	var bad []jsonbody.Param
	for i, t := range types {
		name := fmt.Sprintf("enabled_events[%d]", i)
		if t != "*" && !slices.Contains(events.Types(), t) {
			bad = append(bad, jsonbody.Param{Name: name, Reason: fmt.Sprintf("%q is not an event type", t)})
		} else if first := slices.Index(types, t); first < i {
			bad = append(bad, jsonbody.Param{Name: name, Reason: fmt.Sprintf("repeats enabled_events[%d]: list each event type once", first)})
		}
	}
	return bad
}

func (s *Service) checkURL(ctx context.Context, u string) error {
	reason, err := checkURL(ctx, s.cfg, u)
	switch {
	case err != nil:
		return &apierror.Error{Type: apierror.ServiceUnavailable, RetryAfter: 1, Cause: err,
			Detail: "The URL's host could not be resolved just now (no answer from DNS). Retry shortly."}
	case reason != "":
		return apierror.Invalid(apierror.InvalidParam{Name: "url", Reason: reason})
	}
	return nil
}

// showSecret replaces the stored answer's body with one that shows the
// secret in place of the note, when this process made the secret and the
// answer is the endpoint (not on a replay, a resumed record, or a
// refusal): the first answer is the stored one, secret and all.
func showSecret(resp idempotency.Response, secret string) (idempotency.Response, error) {
	if resp.Replayed || secret == "" || resp.Status >= http.StatusMultipleChoices {
		return resp, nil
	}
	var shown Endpoint
	if err := json.Unmarshal(resp.Body, &shown); err != nil {
		return idempotency.Response{}, fmt.Errorf("reading the stored answer: %w", err)
	}
	shown.Secret, shown.Note = &secret, ""
	body, err := json.Marshal(shown)
	if err != nil {
		return idempotency.Response{}, err
	}
	resp.Body = body
	return resp, nil
}

func storedResponse(status int, e Endpoint, note string) (idempotency.Response, error) {
	e.Note = note
	body, err := json.Marshal(e)
	if err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.Response{Status: status, Body: body, Headers: idempotency.Headers{
		ContentType: "application/json", Location: RouteEndpoints + "/" + e.ID}}, nil
}

// CreateParams is the body of POST /v1/webhook_endpoints.
type CreateParams struct {
	URL           string   `json:"url"`
	EnabledEvents []string `json:"enabled_events"`
}

// Validate checks what needs no lookup; the URL's form and host are
// checked when the request runs (Service.checkURL), not again on a replay.
func (p *CreateParams) Validate() error {
	var bad []jsonbody.Param
	if p.URL == "" {
		bad = append(bad, jsonbody.Param{Name: "url", Reason: "is required, such as https://example.com/webhooks"})
	}
	bad = append(bad, checkEvents(p.EnabledEvents)...)
	if len(bad) > 0 {
		return jsonbody.Invalid(bad...)
	}
	return nil
}

// Create registers an endpoint for the account; req is its POST. Like
// every POST it is idempotent; the first answer shows the signing secret,
// the stored one (what a retry replays) a note instead.
func (s *Service) Create(ctx context.Context, accountID string, req idempotency.Request) (idempotency.Response, error) {
	var p CreateParams
	if err := decodeBody(&req, &p); err != nil {
		return idempotency.Response{}, err
	}
	if err := s.requireEnabled(); err != nil {
		return idempotency.Response{}, err
	}
	op := &createOp{s: s, accountID: accountID, p: p}
	resp, err := s.runner.Run(ctx, req, op)
	if err != nil {
		return idempotency.Response{}, err
	}
	return showSecret(resp, op.secret)
}

// createOp inserts the endpoint in the claim's batch; there is no
// downstream call.
type createOp struct {
	s         *Service
	accountID string
	p         CreateParams
	row       dbsqlc.WebhookEndpoint
	secret    string // known only to the process that made it
	gone      bool   // Load found the endpoint deleted (goneStep)
}

// MaxEndpoints is how many endpoints an account may have, as on Stripe:
// every event is sent to each endpoint that wants it, so the number bounds
// what one event costs.
const MaxEndpoints = 16

// Begin checks the URL and counts the account's endpoints, reading before
// the phase, then queues the account's lock and the guarded insert into
// the claim's batch: an insert that would pass MaxEndpoints (another
// creation committed since the count) raises ErrStale, and the runner
// counts again, which answers the refusal.
func (op *createOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	if err := op.s.checkURL(ctx, op.p.URL); err != nil {
		return err
	}
	if n, err := op.s.q.WebhookEndpointCount(ctx, op.s.pool, op.accountID); err != nil {
		return fmt.Errorf("counting webhook endpoints: %w", err)
	} else if n >= MaxEndpoints {
		return apierror.Newf(apierror.InvalidRequest, "The account has %d webhook endpoints, the most it may have; delete one first.", MaxEndpoints)
	}
	id := newID("we_")
	secret, err := newSecret()
	if err != nil {
		return err
	}
	sealed, err := op.s.seal.seal(id, secret)
	if err != nil {
		return err
	}
	op.row = dbsqlc.WebhookEndpoint{ID: id, AccountID: op.accountID, Url: op.p.URL, EnabledEvents: op.p.EnabledEvents,
		Enabled: true, Version: 1, IdempotencyKeyID: &rec.ID}
	op.secret = secret
	if err := b.LimitLockWait(ctx); err != nil {
		return err
	}
	if err := op.s.q.WebhookEndpointLockAccount(ctx, b, op.accountID); err != nil {
		return fmt.Errorf("locking the account: %w", err)
	}
	if err := op.s.q.WebhookEndpointInsert(ctx, b, &dbsqlc.WebhookEndpointInsertParams{ID: id, AccountID: op.accountID,
		Url: op.p.URL, EnabledEvents: op.p.EnabledEvents, Secret: sealed, IdempotencyKeyID: &rec.ID, MaxEndpoints: MaxEndpoints}); err != nil {
		return fmt.Errorf("inserting webhook endpoint: %w", err)
	}
	return nil
}

func (op *createOp) Load(ctx context.Context, rec *idempotency.Record) error {
	var err error
	op.row, err = op.s.q.WebhookEndpointGetByIdempotencyKeyID(ctx, op.s.pool, &rec.ID)
	if err = db.NotFound(err); errors.Is(err, db.ErrNotFound) {
		op.gone = true // the claim inserted it with the record: deleted since
		return nil
	} else if err != nil {
		return fmt.Errorf("reading the webhook endpoint of %s: %w", rec.ID, err)
	}
	return nil
}

func (op *createOp) Call(_ context.Context, rec *idempotency.Record) idempotency.Step {
	if op.gone {
		return goneStep()
	}
	if op.row.CreatedAt.IsZero() { // inserted by this process, in the claim's batch
		op.row.CreatedAt = rec.CreatedAt
	}
	return idempotency.Finish(func(context.Context, *idempotency.Batch) (idempotency.Response, error) {
		return storedResponse(http.StatusCreated, endpointOf(op.row, rec.CreatedAt), secretNote)
	})
}

// UpdateParams is the body of POST /v1/webhook_endpoints/{id}: the fields
// to change.
type UpdateParams struct {
	URL           *string  `json:"url"`
	EnabledEvents []string `json:"enabled_events"`
	Enabled       *bool    `json:"enabled"`
}

// Validate checks enabled_events when it is given; whether anything is
// given at all is Update's to say, once the body decoded.
func (p *UpdateParams) Validate() error {
	if p.EnabledEvents != nil {
		if bad := checkEvents(p.EnabledEvents); len(bad) > 0 {
			return jsonbody.Invalid(bad...)
		}
	}
	return nil
}

// Update changes the account's endpoint id (url, enabled_events, enabled);
// enabling an endpoint idempay disabled clears its failure. Idempotent.
func (s *Service) Update(ctx context.Context, accountID, id string, req idempotency.Request) (idempotency.Response, error) {
	var p UpdateParams
	if err := decodeBody(&req, &p); err != nil {
		return idempotency.Response{}, err
	}
	if p.URL == nil && p.EnabledEvents == nil && p.Enabled == nil {
		return idempotency.Response{}, apierror.New(apierror.InvalidRequest, "Name at least one of url, enabled_events, enabled.")
	}
	return s.runner.Run(ctx, req, &changeOp{s: s, accountID: accountID, id: id, change: func(ctx context.Context, b *idempotency.Batch, row *dbsqlc.WebhookEndpoint) error {
		if p.URL != nil {
			if err := s.checkURL(ctx, *p.URL); err != nil {
				return err
			}
			row.Url = *p.URL
		}
		if p.EnabledEvents != nil {
			row.EnabledEvents = p.EnabledEvents
		}
		was := row.Enabled
		if p.Enabled != nil {
			if *p.Enabled {
				row.DisabledReason = nil
			}
			row.Enabled = *p.Enabled
		}
		if err := s.q.WebhookEndpointUpdate(ctx, b, &dbsqlc.WebhookEndpointUpdateParams{AccountID: accountID, ID: id,
			Url: row.Url, EnabledEvents: row.EnabledEvents, Enabled: row.Enabled, Version: row.Version}); err != nil {
			return err
		}
		// Its deliveries not yet sent wait while it is disabled, out of
		// the workers' way (paused), and go when it is enabled again.
		switch {
		case was && !row.Enabled:
			return s.q.WebhookDeliveriesPause(ctx, b, id)
		case !was && row.Enabled:
			return s.q.WebhookDeliveriesUnpause(ctx, b, id)
		}
		return nil
	}})
}

// RotateParams is the body of POST /v1/webhook_endpoints/{id}/rotate_secret.
type RotateParams struct {
	// ExpiresIn is how many seconds the current secret still signs
	// (default Config.RotationOverlap; 0 ends it at once).
	ExpiresIn *int64 `json:"expires_in"`
}

// maxOverlap bounds a rotation's overlap.
const maxOverlap = 7 * 24 * time.Hour

// expiresInRange is what expires_in takes, in seconds.
var expiresInRange = fmt.Sprintf("an integer between 0 and %d", int64(maxOverlap/time.Second))

// Validate bounds expires_in. The number of seconds is compared with the
// bound before it becomes a time.Duration, which would overflow past
// about 292 years and wrap to a short or negative overlap.
func (p *RotateParams) Validate() error {
	if p.ExpiresIn != nil && (*p.ExpiresIn < 0 || *p.ExpiresIn > int64(maxOverlap/time.Second)) {
		return jsonbody.Invalid(jsonbody.Param{Name: "expires_in", Reason: "must be " + expiresInRange})
	}
	return nil
}

// Rotate gives the endpoint a new signing secret, shown once; the one
// before keeps signing beside it for the overlap, so that the receiver can
// move to the new one without refusing a delivery. Idempotent.
func (s *Service) Rotate(ctx context.Context, accountID, id string, req idempotency.Request) (idempotency.Response, error) {
	var p RotateParams
	if err := decodeBody(&req, &p); err != nil {
		return idempotency.Response{}, err
	}
	if err := s.requireEnabled(); err != nil {
		return idempotency.Response{}, err
	}
	overlap := s.cfg.RotationOverlap
	if p.ExpiresIn != nil { // within maxOverlap (Validate)
		overlap = time.Duration(*p.ExpiresIn) * time.Second
	}
	var secret string
	var now *time.Time
	op := &changeOp{s: s, accountID: accountID, id: id, note: secretNote, change: func(ctx context.Context, b *idempotency.Batch, row *dbsqlc.WebhookEndpoint) error {
		var err error
		if secret, err = newSecret(); err != nil {
			return err
		}
		sealed, err := s.seal.seal(id, secret)
		if err != nil {
			return err
		}
		// The expiry is stamped by the database's clock, in the claim's
		// batch; stamped gives the answer the same time.
		now = s.cfg.dbNow()
		return s.q.WebhookEndpointRotate(ctx, b, &dbsqlc.WebhookEndpointRotateParams{AccountID: accountID, ID: id,
			Secret: sealed, Now: now, OverlapSeconds: overlap.Seconds(), Version: row.Version})
	}, stamped: func(row *dbsqlc.WebhookEndpoint, claimedAt time.Time) {
		expires := claimedAt.Add(overlap)
		if now != nil {
			expires = now.Add(overlap)
		}
		row.PreviousExpiresAt = &expires
	}}
	resp, err := s.runner.Run(ctx, req, op)
	if err != nil {
		return idempotency.Response{}, err
	}
	return showSecret(resp, secret)
}

// changeOp applies change to the endpoint in the claim's batch, guarded by
// the version it read; the answer is the endpoint after it.
type changeOp struct {
	s         *Service
	accountID string
	id        string
	note      string
	change    func(ctx context.Context, b *idempotency.Batch, row *dbsqlc.WebhookEndpoint) error
	// stamped, when set, puts in the row what change's statement stamped
	// by the claim's clock, which a batch does not return: claimedAt is
	// the claim's transaction's now() (the record's CreatedAt), which the
	// statement read too.
	stamped func(row *dbsqlc.WebhookEndpoint, claimedAt time.Time)
	row     dbsqlc.WebhookEndpoint
	begun   bool // the row is Begin's (stamped), not Load's
	gone    bool // Load found the endpoint deleted (goneStep)
}

func (op *changeOp) Begin(ctx context.Context, b *idempotency.Batch, _ *idempotency.Record) error {
	row, _, err := op.s.get(ctx, op.accountID, op.id)
	if err != nil {
		return err
	}
	// The endpoint's row is locked by the workers too (a batch's
	// recording, the fan-out): the change waits for it at most RowLockWait.
	if err := b.LimitLockWait(ctx); err != nil {
		return err
	}
	if err := op.change(ctx, b, &row); err != nil {
		return err
	}
	op.row, op.begun = row, true
	return nil
}

func (op *changeOp) Load(ctx context.Context, _ *idempotency.Record) error {
	var err error
	op.row, _, err = op.s.get(ctx, op.accountID, op.id)
	op.begun = false
	if pe := (*apierror.Error)(nil); errors.As(err, &pe) && pe.Type == apierror.NotFound {
		op.gone, err = true, nil
	}
	return err
}

func (op *changeOp) Call(_ context.Context, rec *idempotency.Record) idempotency.Step {
	if op.gone {
		return goneStep()
	}
	if op.begun && op.stamped != nil {
		op.stamped(&op.row, rec.CreatedAt)
	}
	return idempotency.Finish(func(context.Context, *idempotency.Batch) (idempotency.Response, error) {
		return storedResponse(http.StatusOK, endpointOf(op.row, rec.CreatedAt), op.note)
	})
}
