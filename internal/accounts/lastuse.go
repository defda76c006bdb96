package accounts

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// NoteUsesInterval is how often a server process notes the last use of the
// keys it authenticated (RunNoteUses): last_used_at is at most this late.
const NoteUsesInterval = time.Minute

// maxNotedKeys bounds the key ids a process collects between two notes;
// a key seen once the set is full is noted the next time it is used.
const maxNotedKeys = 10_000

// noteUse adds a key's id to those NoteUses writes next.
func (a *Authenticator) noteUse(keyID string) {
	a.mu.Lock()
	if len(a.used) < maxNotedKeys {
		a.used[keyID] = struct{}{}
	}
	a.mu.Unlock()
}

// NoteUses writes the last use of the keys authenticated since its previous
// call, in one statement that waits on no lock (APIKeyNoteUse). The use is
// a hint for the account's key listing, not a record: the ids are
// forgotten whether or not the write succeeds, and a key used again is
// noted again.
func (a *Authenticator) NoteUses(ctx context.Context) error {
	a.mu.Lock()
	ids := slices.Collect(maps.Keys(a.used))
	clear(a.used)
	a.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	if err := dbsqlc.New().APIKeyNoteUse(ctx, a.db, ids); err != nil {
		return fmt.Errorf("noting the use of %d API keys: %w", len(ids), err)
	}
	return nil
}

// RunNoteUses calls NoteUses every interval until ctx is done, and once
// more then (bounded by a few seconds), so a server that stops notes what
// it saw last.
func (a *Authenticator) RunNoteUses(ctx context.Context, interval time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := a.NoteUses(fctx); err != nil {
				log.WarnContext(fctx, "API keys: noting their last use", "err", err)
			}
			return
		case <-t.C:
			if err := a.NoteUses(ctx); err != nil {
				log.WarnContext(ctx, "API keys: noting their last use", "err", err)
			}
		}
	}
}
