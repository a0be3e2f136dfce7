package demo

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/internal/testcluster"
)

// walClusterConf is the private cluster's configuration when the server
// lacks wal_level = logical: logical decoding and a bounded slot.
const walClusterConf = "wal_level = logical\nmax_slot_wal_keep_size = '1GB'\nmax_replication_slots = 10\nmax_wal_senders = 10"

// walRun is a Capture CaptureWAL run's state: the slot, and the events the
// producer emitted in committed transactions.
type walRun struct {
	slot string
	// unbounded: the server's max_slot_wal_keep_size is -1; the relay is
	// told to create its slot anyway, and the demo drops it at the end.
	unbounded bool

	mu      sync.Mutex
	pending []string // ids emitted in the open transaction
	ids     []string // ids emitted in committed transactions
}

// walServer makes sure the run has a server with wal_level = logical: the
// one at DatabaseURL when it has it, else a private cluster the demo starts
// (and stop removes), else an error naming the setting.
func (r *run) walServer(ctx context.Context) (stop func(), err error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	admin, err := pgx.Connect(cctx, r.cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("demo: connect to PostgreSQL (--database-url, DATABASE_URL): %w", err)
	}
	var level, keep string
	err = admin.QueryRow(cctx, `SELECT pg_catalog.current_setting('wal_level'), pg_catalog.current_setting('max_slot_wal_keep_size')`).Scan(&level, &keep)
	admin.Close(context.Background())
	if err != nil {
		return nil, fmt.Errorf("demo: read wal_level: %w", err)
	}
	// Slot names are server-wide: one of the demo's database's own.
	w := &walRun{slot: min63("pgrelay_" + r.cfg.Database)}
	if level == "logical" {
		w.unbounded = keep == "-1"
		r.wal = w
		r.say("--capture wal: the server has wal_level = logical; the relay streams the slot %q", w.slot)
		return func() {}, nil
	}
	r.say("--capture wal: the server at %s has wal_level = %s, not logical; starting a private cluster (initdb, %s)",
		pgurl.Redact(r.cfg.DatabaseURL), level, testcluster.BinDir())
	sctx, scancel := context.WithTimeout(ctx, 3*time.Minute)
	defer scancel()
	c, err := testcluster.New(sctx, walClusterConf)
	if err != nil {
		if c != nil {
			c.Remove()
		}
		return nil, fmt.Errorf("demo: Capture (--capture) %q needs wal_level = logical: the server at %s has wal_level = %s "+
			"(set wal_level = logical in postgresql.conf and restart it, or point --database-url at a server that has it), "+
			"and a private cluster could not be started: %w", CaptureWAL, pgurl.Redact(r.cfg.DatabaseURL), level, err)
	}
	r.cfg.DatabaseURL = c.URL()
	r.wal = w
	r.say("private cluster on 127.0.0.1:%d (wal_level = logical, max_slot_wal_keep_size = 1GB), removed when the demo ends", c.Port)
	return c.Remove, nil
}

func min63(s string) string {
	if len(s) > 63 {
		return s[:63]
	}
	return s
}

// relayEnv is the relay's WAL settings.
func (w *walRun) relayEnv() []string {
	env := []string{"RELAY_CAPTURE=wal", "RELAY_WAL_SLOT=" + w.slot}
	if w.unbounded {
		env = append(env, "RELAY_WAL_ALLOW_UNBOUNDED_SLOT=true")
	}
	return env
}

// waitSlot waits until the relay created its slot: events emitted before
// the slot exists are not in it (docs/wal.md).
func (r *run) waitSlot(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var n int
		err := r.pool.QueryRow(qctx, `SELECT pg_catalog.count(*) FROM pg_replication_slots WHERE slot_name = $1`, r.wal.slot).Scan(&n)
		cancel()
		if err == nil && n == 1 {
			r.say("the relay created the replication slot %q; the producer emits to the WAL (pgrelay.Emit)", r.wal.slot)
			return nil
		}
		if time.Now().After(deadline) || !r.relay.Running() {
			return fmt.Errorf("demo: the relay did not create the replication slot %q (err %v); see %s/relay.log", r.wal.slot, err, r.report.LogsDir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// dropSlot drops the run's slot once its relay stopped, so that it does not
// keep WAL on the server after the demo.
func (r *run) dropSlot() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.pool.Exec(ctx, `SELECT pg_catalog.pg_drop_replication_slot($1)`, r.wal.slot); err != nil {
		r.say("drop the replication slot %q: %v (drop it by hand: it keeps WAL)", r.wal.slot, err)
		return
	}
	r.say("replication slot %q dropped", r.wal.slot)
}

// put writes one event in tx: Enqueue into the outbox, or Emit to the WAL.
func (r *run) put(ctx context.Context, tx pgx.Tx, m pgrelay.Message) error {
	if r.wal == nil {
		return r.ob.Enqueue(ctx, tx, m)
	}
	if m.EventID == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return err
		}
		m.EventID = u.String()
	}
	if err := r.ob.Emit(ctx, tx, m); err != nil {
		return err
	}
	r.wal.mu.Lock()
	r.wal.pending = append(r.wal.pending, m.EventID)
	r.wal.mu.Unlock()
	return nil
}

// producerTx runs one producer transaction and, in WAL mode, counts its
// emitted events once it committed.
func (r *run) producerTx(ctx context.Context, f func(pgx.Tx) error) error {
	err := r.tx(ctx, f)
	if r.wal != nil {
		r.wal.mu.Lock()
		if err == nil {
			r.wal.ids = append(r.wal.ids, r.wal.pending...)
		}
		r.wal.pending = r.wal.pending[:0]
		r.wal.mu.Unlock()
	}
	return err
}

func (w *walRun) emitted() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return int64(len(w.ids))
}

// publishedEvents returns up to max published events to replay as
// duplicates: the outbox's, or in WAL mode (no outbox rows) the inbox's.
func (r *run) publishedEvents(ctx context.Context, max int32) ([]db.DemoOutboxEventsRow, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if r.wal == nil {
		rows, err := db.New().DemoOutboxEvents(qctx, r.pool, max)
		if err != nil {
			return nil, fmt.Errorf("demo: read published events: %w", err)
		}
		return rows, nil
	}
	rows, err := db.New().DemoInboxEvents(qctx, r.pool, max)
	if err != nil {
		return nil, fmt.Errorf("demo: read relayed events: %w", err)
	}
	out := make([]db.DemoOutboxEventsRow, len(rows))
	for i, row := range rows {
		out[i] = db.DemoOutboxEventsRow{EventID: row.EventID, Topic: row.Topic, Key: row.Key, EventType: row.EventType, Payload: row.Payload}
	}
	return out, nil
}

// verifyWAL sets the report's produced and published counts in WAL mode:
// the events emitted in committed transactions, and those of them the
// consumer processed (the relay published them: no outbox row records it).
func (r *run) verifyWAL(ctx context.Context) error {
	r.wal.mu.Lock()
	ids := append([]string(nil), r.wal.ids...)
	r.wal.mu.Unlock()
	var processed int64
	// A one-off count for the report, as ledger_orders's.
	if err := r.pool.QueryRow(ctx, `SELECT pg_catalog.count(*) FROM pgrelay.inbox WHERE event_id = ANY($1) AND status = 'processed'`, ids).Scan(&processed); err != nil {
		return fmt.Errorf("demo: count the emitted events processed: %w", err)
	}
	r.report.Produced, r.report.Published = int64(len(ids)), processed
	return nil
}

// checks are the WAL mode's checks in place of "every outbox event
// published".
func (w *walRun) checks(check func(name string, ok bool, format string, args ...any), ob db.DemoOutboxCountsRow, rep *Report) {
	check("no outbox row (WAL capture)", ob.Total == 0, "%d outbox rows, slot %s", ob.Total, w.slot)
	check("every emitted event applied", rep.Published == rep.Produced,
		"%d of %d emitted events processed by the consumer", rep.Published, rep.Produced)
}
