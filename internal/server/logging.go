package server

import (
	"context"
	"log/slog"
)

// LogKeyRequestID is the attribute that LogHandler adds to every record
// logged with the context of a request.
const LogKeyRequestID = "request_id"

type requestIDKey struct{}

// WithRequestID returns ctx carrying the request id, for LogHandler.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestID is the request id ctx carries, or "".
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// LogHandler wraps a slog.Handler so that every record logged with a
// request's context (log.InfoContext(ctx, ...)) carries request_id, however
// deep in the call stack it is logged and whichever logger logs it: the
// request line, the idempotency runner, the error handler. A grep for one
// request id then shows everything that request did. Records logged without
// a request context (the completer, retention) are left as they are.
//
// The attribute is added at the top level, so it is not nested under a
// group opened with WithGroup; idempay does not use groups.
type LogHandler struct {
	inner slog.Handler
}

// NewLogHandler wraps h; wrapping a LogHandler again returns it unchanged.
func NewLogHandler(h slog.Handler) slog.Handler {
	if lh, ok := h.(*LogHandler); ok {
		return lh
	}
	return &LogHandler{inner: h}
}

// Enabled defers to the wrapped handler.
func (h *LogHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

// Handle adds request_id from ctx unless the record already has one.
func (h *LogHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := RequestID(ctx); id != "" {
		has := false
		r.Attrs(func(a slog.Attr) bool {
			has = a.Key == LogKeyRequestID
			return !has
		})
		if !has {
			r = r.Clone()
			r.AddAttrs(slog.String(LogKeyRequestID, id))
		}
	}
	return h.inner.Handle(ctx, r)
}

// WithAttrs keeps the wrapper around the derived handler.
func (h *LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &LogHandler{inner: h.inner.WithAttrs(attrs)}
}

// WithGroup keeps the wrapper around the derived handler.
func (h *LogHandler) WithGroup(name string) slog.Handler {
	return &LogHandler{inner: h.inner.WithGroup(name)}
}
