package db

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// FailingOver tells whether err says that the server behind a connection
// is not (or no longer) a primary that accepts writes: SQLSTATE 25006, a
// write refused as read-only, which is what a pooled connection gets once
// it has landed on a standby (after a switchover, through a pooler that
// still points at the old primary, now a replica), and the shutdown codes
// of a server going away (57P01 admin shutdown, 57P02 crash shutdown,
// 57P03 cannot connect now). Such a connection is no use any more: the
// next one, opened with target_session_attrs=read-write, finds the
// primary.
func FailingOver(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "25006", "57P01", "57P02", "57P03":
		return true
	}
	return false
}

// DropOnFailover makes the pool close, instead of reuse, every connection
// on which a statement or a batch failed with an error that FailingOver
// recognises, so that the pool's next connection is a new one, which
// target_session_attrs=read-write sends to the primary. Left in the pool,
// a connection to a standby would refuse every write until it was closed
// for its age. It wraps the connection's tracer, if it has one, and the
// pool's AfterRelease and BeforeClose, if set.
func DropOnFailover(pc *pgxpool.Config) {
	d := &failoverDropper{next: pc.ConnConfig.Tracer}
	pc.ConnConfig.Tracer = d
	afterRelease, beforeClose := pc.AfterRelease, pc.BeforeClose
	pc.AfterRelease = func(c *pgx.Conn) bool {
		if d.take(c.PgConn()) {
			return false // destroyed
		}
		return afterRelease == nil || afterRelease(c)
	}
	pc.BeforeClose = func(c *pgx.Conn) {
		d.take(c.PgConn())
		if beforeClose != nil {
			beforeClose(c)
		}
	}
}

// failoverDropper marks the connections that saw a failover error (a
// query tracer sees every statement's and batch's outcome), for the pool's
// AfterRelease to destroy. It passes every trace on to next.
type failoverDropper struct {
	next   pgx.QueryTracer
	marked sync.Map // *pgconn.PgConn -> struct{}
}

func (d *failoverDropper) mark(c *pgx.Conn, err error) {
	if err != nil && FailingOver(err) {
		d.marked.Store(c.PgConn(), struct{}{})
	}
}

func (d *failoverDropper) take(c *pgconn.PgConn) bool {
	_, ok := d.marked.LoadAndDelete(c)
	return ok
}

func (d *failoverDropper) TraceQueryStart(ctx context.Context, c *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if d.next != nil {
		return d.next.TraceQueryStart(ctx, c, data)
	}
	return ctx
}

func (d *failoverDropper) TraceQueryEnd(ctx context.Context, c *pgx.Conn, data pgx.TraceQueryEndData) {
	d.mark(c, data.Err)
	if d.next != nil {
		d.next.TraceQueryEnd(ctx, c, data)
	}
}

func (d *failoverDropper) TraceBatchStart(ctx context.Context, c *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if t, ok := d.next.(pgx.BatchTracer); ok {
		return t.TraceBatchStart(ctx, c, data)
	}
	return ctx
}

func (d *failoverDropper) TraceBatchQuery(ctx context.Context, c *pgx.Conn, data pgx.TraceBatchQueryData) {
	d.mark(c, data.Err)
	if t, ok := d.next.(pgx.BatchTracer); ok {
		t.TraceBatchQuery(ctx, c, data)
	}
}

func (d *failoverDropper) TraceBatchEnd(ctx context.Context, c *pgx.Conn, data pgx.TraceBatchEndData) {
	d.mark(c, data.Err)
	if t, ok := d.next.(pgx.BatchTracer); ok {
		t.TraceBatchEnd(ctx, c, data)
	}
}

func (d *failoverDropper) TracePrepareStart(ctx context.Context, c *pgx.Conn, data pgx.TracePrepareStartData) context.Context {
	if t, ok := d.next.(pgx.PrepareTracer); ok {
		return t.TracePrepareStart(ctx, c, data)
	}
	return ctx
}

func (d *failoverDropper) TracePrepareEnd(ctx context.Context, c *pgx.Conn, data pgx.TracePrepareEndData) {
	d.mark(c, data.Err)
	if t, ok := d.next.(pgx.PrepareTracer); ok {
		t.TracePrepareEnd(ctx, c, data)
	}
}

var (
	_ pgx.BatchTracer   = (*failoverDropper)(nil)
	_ pgx.PrepareTracer = (*failoverDropper)(nil)
)
