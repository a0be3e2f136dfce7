package relay

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/pgrelay/pgrelay/internal/pooler"
	"github.com/pgrelay/pgrelay/migrations"
)

// The lowest migration version the relay's code needs, per capture mode: a
// database at or above it is served (said to be behind while migrations
// are pending), one below it is refused. Raise them when the relay starts
// using a newer migration's objects (queries/relay.sql, queries/wal.sql,
// queries/metrics.sql's OutboxGauges, the SQL in relay/*.go): the tests
// migrate a database to exactly minSchemaTable and publish from it.
const (
	// minSchemaTable: 00118_relay_lock_keys (relay_nodes.lock_key,
	// relay_partitions.owner_lock_key, read and written by every relay).
	minSchemaTable int64 = 118
	// minSchemaWAL: 00120_wal_slot_history (wal_slot_history, wal_gaps),
	// besides 00116's wal_keys, 00109's wal_seq_assignments and 00108's
	// outbox_wal.
	minSchemaWAL int64 = 120
)

// schemaInterval is how often the relay re-reads each database's schema
// version, so that a database migrated meanwhile is no longer said to be
// behind.
const schemaInterval = time.Minute

// minSchema is the lowest migration version the relay's capture mode needs.
func (r *Relay) minSchema() int64 {
	if r.cfg.Capture == CaptureWAL {
		return minSchemaWAL
	}
	return minSchemaTable
}

// schemaAttrs are the log attributes of database name's schema.
func schemaAttrs(name string, st migrations.Status, minimum int64) []any {
	return []any{slog.String("database", name), slog.Int64("version", st.Current), slog.Int64("latest", st.Latest),
		slog.Any("pending", st.Pending), slog.Int64("minimum", minimum)}
}

// noteSchema records d's schema in its gauges and logs a change: a
// database behind (served: within the supported range) is a warning, one
// below the minimum (rolled back while served) an error.
func (r *Relay) noteSchema(d *dbRun, st migrations.Status, first bool) {
	d.schemaGauges.Set(st.Current, len(st.Pending))
	d.e.floorReady.Store(st.Current >= floorSchema)
	if h := r.cfg.hooks.schemaNoted; h != nil {
		h(st.Current)
	}
	was := d.schema
	d.schema = st
	if !first && was.Current == st.Current && slices.Equal(was.Pending, st.Pending) {
		return
	}
	minimum := r.minSchema()
	attrs := schemaAttrs(d.db.Name, st, minimum)
	switch {
	case st.Require(minimum) != nil:
		r.log.Error("database schema below the relay's minimum: its queries may fail; apply the pending migrations", attrs...)
	case st.Behind():
		r.log.Warn("database schema behind the latest migration: served, within the relay's supported range; apply the pending migrations", attrs...)
	case !first:
		r.log.Info("database schema up to date", attrs...)
	}
}

// watchSchema re-reads d's schema version every schemaInterval until ctx
// ends.
func (r *Relay) watchSchema(ctx context.Context, d *dbRun) {
	every := schemaInterval
	if r.cfg.hooks.schemaInterval > 0 {
		every = r.cfg.hooks.schemaInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, or(r.cfg.QueryTimeout, DefaultQueryTimeout))
		st, err := pooler.SchemaStatus(qctx, d.db.Pool)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("could not read the database schema version", slog.String("database", d.db.Name), slog.Any("error", err))
			}
			continue
		}
		r.noteSchema(d, st, false)
	}
}
