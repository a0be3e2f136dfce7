package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgrelay/pgrelay"
	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/db"
	"github.com/pgrelay/pgrelay/internal/wait"
	"github.com/pgrelay/pgrelay/internal/walmsg"
)

// The WAL capture (Config.Capture CaptureWAL) is a capture source beside the
// partition workers: it reads the events producers wrote with
// pg_logical_emit_message from a logical replication slot, publishes them in
// commit order through the same Publisher path (Relay.publish), and confirms
// a position to the slot only once the broker acknowledged every event of
// every transaction that ended at or before it. After a crash the next
// reader starts at the confirmed position: the events after it are published
// again, and the broker's duplicate window and the inbox absorb the repeats.
//
// The server lets one connection stream a slot: a second relay's
// START_REPLICATION fails with SQLSTATE 55006 and it retries every
// WAL.StandbyPoll, taking over once the reader's connection is gone (a
// crash, a graceful stop, or the server's wal_sender_timeout cutting a
// paused or partitioned reader). A reader that finds it went silent longer
// than half of wal_sender_timeout (a pause) drops its session without
// publishing or confirming anything it read before.
//
// Before publishing a batch the reader drops the events that expired and
// numbers the keyed ones (wal_seq.go): per-key sequences in commit order,
// recorded so that a re-read publishes the same numbers.

// walPartition is the partition number the WAL capture reports metrics
// under.
const walPartition = -1

// errSlotLost: the slot was invalidated; nothing more can be read from it.
var errSlotLost = errors.New("replication slot lost")

// errSlotGone: the slot disappeared under the running capture; it checks
// for a gap (setup) before anything else.
var errSlotGone = errors.New("replication slot gone")

// errWALGap: the slot's history shows a gap no operator accepted; the
// capture streams nothing until one does (docs/wal.md#failover).
var errWALGap = errors.New("WAL capture refused: the slot has a gap no operator accepted")

// errStale: this relay went silent long enough for the server to have
// handed the slot to another reader.
var errStale = errors.New("the session went silent past half of wal_sender_timeout; dropped")

// errServerStopping ends a session whose server is shutting down. A WAL
// sender stopping with its server waits until its client confirmed all it
// sent, and this relay confirms only what the broker acknowledged (and
// numbering keyed events needs the server): a session kept alive with
// status updates would hold a fast shutdown until pg_ctl gives up. Dropped,
// it lets the server stop; the next session reads again from the slot.
var errServerStopping = errors.New("the server is shutting down; the session is dropped without confirming what is not acknowledged")

// serverStopping reports whether err is the server refusing work because
// it is shutting down: admin_shutdown (57P01), crash_shutdown (57P02),
// cannot_connect_now (57P03).
func serverStopping(err error) bool {
	return isCode(err, "57P01") || isCode(err, "57P02") || isCode(err, "57P03")
}

// walTx is one committed transaction's events.
type walTx struct {
	msgs   []pgrelay.Message
	dead   int // pgrelay messages that could not be decoded
	end    pglogrepl.LSN
	commit time.Time
}

// walSource is the WAL capture of one relay.
type walSource struct {
	r       *engine
	log     *slog.Logger
	connCfg *pgconn.Config
	// senderTimeout is the server's wal_sender_timeout (0: none).
	senderTimeout time.Duration

	mu     sync.Mutex
	status WALSlotStatus
	cur    *walSession // the streaming session, nil while a standby
}

// serverID names the server and timeline a replication connection reaches
// (IDENTIFY_SYSTEM).
type serverID struct {
	system   string
	timeline int32
}

// runWAL runs the WAL capture until ctx ends (nil) or the slot is lost or
// misconfigured (an error).
func (r *engine) runWAL(ctx context.Context) error {
	cfg := r.cfg.walConnConfig
	if cfg == nil && r.cfg.ListenConnConfig != nil {
		cfg = &r.cfg.ListenConnConfig.Config
	}
	if cfg == nil {
		cfg = &r.cfg.Pool.Config().ConnConfig.Config
	}
	cfg = cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["replication"] = "database"
	// The reader waits for the stream with a deadline every status
	// interval: a deadline must end the wait, never send a cancel request.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	w := &walSource{r: r, log: r.log.With(slog.String("capture", CaptureWAL), slog.String("slot", r.cfg.WALSlot)), connCfg: cfg}
	r.walMu.Lock()
	r.wal = w
	r.walMu.Unlock()
	w.log.Info("relay starting", slog.Int("batch_size", r.cfg.BatchSize))
	for {
		err := w.run(ctx)
		if !errors.Is(err, errSlotGone) || ctx.Err() != nil {
			w.log.Info("relay stopped")
			return err
		}
		w.log.Error("the replication slot is gone; checking its history for a gap before going on", slog.Any("error", err))
	}
}

// run sets the capture up and streams until ctx ends or the slot is lost or
// gone.
func (w *walSource) run(ctx context.Context) error {
	if err := w.setup(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); w.monitor(runCtx, cancel) }()
	go func() { defer bg.Done(); w.truncateLoop(runCtx) }()
	err := w.loop(runCtx)
	cancel(nil)
	bg.Wait()
	if cause := context.Cause(runCtx); errors.Is(cause, errSlotLost) || errors.Is(cause, errSlotGone) {
		err = cause
	}
	if err == nil && ctx.Err() == nil {
		err = context.Cause(runCtx)
	}
	return err
}

// slotLostError is the loud failure of a lost slot, with the recovery.
func (w *walSource) slotLostError(detail string) error {
	return fmt.Errorf("relay: %w: slot %q is invalidated (wal_status lost%s): the WAL it needed was removed and cannot be read; "+
		"keep the relays stopped and recover as docs/wal.md#a-lost-slot says: note the slot's confirmed_flush_lsn, drop the slot, "+
		"start one relay (it creates a new slot) and re-emit the window's events from the WAL archive (or the producers' own records)", errSlotLost, w.r.cfg.WALSlot, detail)
}

// reportLost records and reports the slot as lost when the replication
// protocol said so before the monitor saw it in pg_replication_slots, so that
// WALStatus and the metrics show it whichever noticed first.
func (w *walSource) reportLost() {
	w.mu.Lock()
	st := w.status
	st.Slot, st.Exists, st.Reading, st.WALStatus, st.At = w.r.cfg.WALSlot, true, false, "lost", time.Now()
	w.status = st
	w.mu.Unlock()
	w.r.observeSlot(st)
}

// setup checks the server's settings and creates the publication and the
// slot when missing. Connection failures are retried; a setting that makes
// the capture unsafe or impossible is returned.
func (w *walSource) setup(ctx context.Context) error {
	bo := wait.New(w.r.backoffPolicy())
	reported := ""
	for {
		err := w.setupOnce(ctx)
		var fatal *setupError
		if err == nil || errors.As(err, &fatal) || errors.Is(err, errSlotLost) {
			return err
		}
		if errors.Is(err, errWALGap) {
			// Refused, loudly, until an operator accepts the gap.
			w.reportGap(err.Error())
			if err.Error() != reported {
				w.log.Error("the WAL capture streams nothing: its slot has a gap no operator accepted", slog.Any("error", err))
				reported = err.Error()
			}
			if !wait.Sleep(ctx, w.r.cfg.walStandbyPoll) {
				return ctx.Err()
			}
			continue
		}
		w.log.Warn("WAL capture set-up failed; retrying", slog.Any("error", err))
		if !wait.Sleep(ctx, bo.Next()) {
			return ctx.Err()
		}
	}
}

// setupError is a set-up failure no retry fixes.
type setupError struct{ err error }

func (e *setupError) Error() string { return e.err.Error() }
func (e *setupError) Unwrap() error { return e.err }

func (w *walSource) setupOnce(ctx context.Context) error {
	cfg := w.r.cfg
	qctx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
	defer cancel()
	// sqlc's catalog has no system views: these statements stay here.
	var walLevel, keep, database string
	var timeoutMS int64
	var version int
	err := cfg.Pool.QueryRow(qctx, `SELECT pg_catalog.current_setting('wal_level'), pg_catalog.current_setting('max_slot_wal_keep_size'),
		(SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'), pg_catalog.current_database(),
		pg_catalog.current_setting('server_version_num')::int`).Scan(&walLevel, &keep, &timeoutMS, &database, &version)
	if err != nil {
		return fmt.Errorf("read server settings: %w", err)
	}
	w.senderTimeout = time.Duration(timeoutMS) * time.Millisecond
	if walLevel != "logical" {
		return &setupError{bad("Capture", "{} %q needs the server's wal_level = logical (it is %s): set it in postgresql.conf and restart PostgreSQL", CaptureWAL, walLevel)}
	}
	if _, err := w.loadKeys(qctx); err != nil {
		if isCode(err, "42501") { // insufficient_privilege
			return &setupError{err}
		}
		return err
	}
	// The publication publishes inserts only: pgrelay.outbox_wal's, added
	// by setupTable; its TRUNCATE is not sent.
	if _, err := cfg.Pool.Exec(qctx, "CREATE PUBLICATION "+pgx.Identifier{cfg.walPublication}.Sanitize()+" WITH (publish = 'insert')"); err != nil && !isCode(err, "42710") {
		return fmt.Errorf("create publication %s: %w", cfg.walPublication, err)
	}
	id, err := w.identify(qctx)
	if err != nil {
		return err
	}
	st, err := w.slotStatus(qctx)
	if err != nil {
		return err
	}
	if st.exists {
		switch {
		case st.plugin != "pgoutput":
			return &setupError{bad("WALSlot", "{}: slot %q uses the plugin %q, not pgoutput: name another slot", cfg.WALSlot, st.plugin)}
		case st.database != database:
			return &setupError{bad("WALSlot", "{}: slot %q belongs to the database %q, not %q: name another slot", cfg.WALSlot, st.database, database)}
		case st.walStatus == "lost":
			w.reportLost()
			return w.slotLostError("")
		}
	}
	create := func() error { return w.createSlot(qctx, keep, version) }
	if err := w.checkGap(qctx, st.exists, id, create); err != nil {
		return err
	}
	if !st.exists {
		if err := create(); err != nil {
			return err
		}
	}
	if err := w.r.q.RecordWALSlotHistory(qctx, cfg.Pool, db.RecordWALSlotHistoryParams{SystemIdentifier: id.system, Timeline: id.timeline, Slot: cfg.WALSlot}); err != nil {
		return fmt.Errorf("record the slot's history: %w", err)
	}
	return w.setupTable(qctx)
}

// createSlot creates the slot; on PostgreSQL 17 and later a failover slot,
// which the standbys that sync_replication_slots names keep in step, so that
// it survives a promotion.
func (w *walSource) createSlot(ctx context.Context, keep string, version int) error {
	cfg := w.r.cfg
	if keep == "-1" && !cfg.WALAllowUnboundedSlot {
		return &setupError{bad("WALAllowUnboundedSlot", "the server's max_slot_wal_keep_size is -1 (unlimited): a relay stopped for long would make "+
			"the slot keep WAL until the disk fills; set max_slot_wal_keep_size (docs/wal.md), or set {} to create the slot anyway")}
	}
	// A new slot lacks the rows committed before it: out of the
	// publication until setupTable re-inserts them, so that nothing
	// truncates them meanwhile, even after a crash here.
	if err := w.leavePublication(ctx); err != nil {
		return err
	}
	var err error
	if version >= 170000 {
		// sqlc's catalog lacks the failover argument (PostgreSQL 17): the
		// statement stays here.
		_, err = cfg.Pool.Exec(ctx, `SELECT pg_catalog.pg_create_logical_replication_slot($1::text, 'pgoutput', false, false, true)`, cfg.WALSlot)
	} else {
		_, err = w.r.q.CreateWALSlot(ctx, cfg.Pool, cfg.WALSlot)
	}
	if err != nil && !isCode(err, "42710") {
		return fmt.Errorf("create replication slot %s: %w", cfg.WALSlot, err)
	}
	w.log.Info("created the replication slot", slog.String("max_slot_wal_keep_size", keep), slog.Bool("failover", version >= 170000))
	return nil
}

// identify returns the server and timeline the replication connection
// reaches.
func (w *walSource) identify(ctx context.Context) (serverID, error) {
	conn, err := pgconn.ConnectConfig(ctx, w.connCfg)
	if err != nil {
		return serverID{}, fmt.Errorf("connect for replication: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	res, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return serverID{}, fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	return serverID{system: res.SystemID, timeline: res.Timeline}, nil
}

// checkGap compares the slot with its history (pgrelay.wal_slot_history,
// which replicates physically to standbys). A slot missing where the
// history had one, or a history from another server, is a gap: the events
// after the last confirmed position were read from no slot. The gap is
// recorded, the slot created past it (create) so that nothing after its
// start is lost, and errWALGap returned until an operator accepts it. No
// history (a first start) is no gap.
func (w *walSource) checkGap(ctx context.Context, exists bool, id serverID, create func() error) error {
	cfg, q := w.r.cfg, w.r.q
	gap, err := q.OpenWALGap(ctx, cfg.Pool, cfg.WALSlot)
	open := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read the slot's gaps: %w", err)
	}
	if !open {
		h, err := q.WALSlotHistory(ctx, cfg.Pool, cfg.WALSlot)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read the slot's history: %w", err)
		}
		var cause string
		switch {
		case h.SystemIdentifier != id.system:
			cause = fmt.Sprintf("the slot's history is from the server with system identifier %s (timeline %d); this server's is %s (timeline %d)",
				h.SystemIdentifier, h.Timeline, id.system, id.timeline)
		case !exists && h.Timeline != id.timeline:
			cause = fmt.Sprintf("the slot is missing after a promotion: the server's timeline moved from %d to %d, and before PostgreSQL 17 a slot does not follow a promotion",
				h.Timeline, id.timeline)
		case !exists:
			cause = fmt.Sprintf("the slot is missing on this server (timeline %d): it was dropped", id.timeline)
		default:
			if h.Timeline != id.timeline {
				w.log.Info("the slot followed the server's promotion (a failover slot)", slog.Any("from_timeline", h.Timeline), slog.Any("timeline", id.timeline))
			}
			return nil
		}
		if err := q.InsertWALGap(ctx, cfg.Pool, db.InsertWALGapParams{Slot: cfg.WALSlot, FromLsn: h.ConfirmedLsn, ConfirmedAt: h.ConfirmedAt, Cause: cause}); err != nil {
			return fmt.Errorf("record the slot's gap: %w", err)
		}
		if gap, err = q.OpenWALGap(ctx, cfg.Pool, cfg.WALSlot); err != nil {
			return fmt.Errorf("read the slot's gaps: %w", err)
		}
	}
	// The gap ends where the new slot starts.
	if !exists {
		if err := create(); err != nil {
			return err
		}
	}
	if gap.ToLsn == "" || !exists {
		if err := q.SetWALGapEnd(ctx, cfg.Pool, cfg.WALSlot); err != nil {
			return fmt.Errorf("record the slot's gap: %w", err)
		}
		if gap, err = q.OpenWALGap(ctx, cfg.Pool, cfg.WALSlot); err != nil {
			return fmt.Errorf("read the slot's gaps: %w", err)
		}
	}
	// The history names this server and the new slot from now on.
	if err := q.RecordWALSlotHistory(ctx, cfg.Pool, db.RecordWALSlotHistoryParams{SystemIdentifier: id.system, Timeline: id.timeline, Slot: cfg.WALSlot}); err != nil {
		return fmt.Errorf("record the slot's history: %w", err)
	}
	slot := cfg.WALSlot
	return fmt.Errorf("relay: %w: slot %q: %s. The events committed after %s (the slot's last confirmed position, recorded at %s) and before %s (the new slot's start) "+
		"were read from no slot. The relay streams nothing until an operator accepts the gap: re-emit those events (deploy/wal-rescan.sh <wal-archive> %s %s, "+
		"or from the producers' own records), then run: relay wal accept-gap --slot %s --actor NAME --reason TEXT (docs/wal.md#failover)",
		errWALGap, slot, gap.Cause, gap.FromLsn, gap.ConfirmedAt.UTC().Format(time.RFC3339Nano), gap.ToLsn, gap.FromLsn, gap.ToLsn, slot)
}

// reportGap records and reports the unaccepted gap that stops the capture.
func (w *walSource) reportGap(msg string) {
	w.mu.Lock()
	st := WALSlotStatus{Slot: w.r.cfg.WALSlot, Exists: true, Gap: msg, At: time.Now()}
	w.status = st
	w.mu.Unlock()
	w.r.observeSlot(st)
}

type slotRow struct {
	exists                      bool
	plugin, database, walStatus string
	active                      bool
	lagBytes                    int64
}

// slotStatus reads the slot's row in pg_replication_slots.
func (w *walSource) slotStatus(ctx context.Context) (slotRow, error) {
	var s slotRow
	err := w.r.cfg.Pool.QueryRow(ctx, `SELECT plugin::text, database::text, coalesce(wal_status, ''), active,
		coalesce(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, w.r.cfg.WALSlot).Scan(&s.plugin, &s.database, &s.walStatus, &s.active, &s.lagBytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read replication slot %s: %w", w.r.cfg.WALSlot, err)
	}
	s.exists = true
	return s, nil
}

// isCode reports whether err is a PostgreSQL error with SQLSTATE code.
func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// loop streams the slot, or waits as a standby, until ctx ends.
func (w *walSource) loop(ctx context.Context) error {
	bo := wait.New(w.r.backoffPolicy())
	standby := false
	for ctx.Err() == nil {
		began := time.Now()
		err := w.session(ctx)
		if time.Since(began) > w.r.cfg.BackoffMax {
			bo.Reset() // it streamed: a new failure, not a repeated one
		}
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case errors.Is(err, errSlotLost):
			return err
		case isCode(err, "55006"): // replication slot is active for another PID
			if !standby {
				w.log.Info("standby: another relay streams the slot; waiting to take over")
				standby = true
			}
			if !wait.Sleep(ctx, wait.Jitter(w.r.cfg.walStandbyPoll, jitterSpread)) {
				return nil
			}
			continue
		case err != nil:
			w.log.Warn("WAL capture session ended; reconnecting", slog.Any("error", err))
		}
		standby = false
		if !wait.Sleep(ctx, bo.Next()) {
			return nil
		}
	}
	return nil
}

// session streams the slot once: until ctx ends or the connection fails.
func (w *walSource) session(ctx context.Context) error {
	keys, err := w.loadKeys(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, w.r.cfg.QueryTimeout)
	conn, err := pgconn.ConnectConfig(cctx, w.connCfg)
	cancel()
	if err != nil {
		return fmt.Errorf("connect for replication: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	cctx, cancel = context.WithTimeout(ctx, w.r.cfg.QueryTimeout)
	ident, err := pglogrepl.IdentifySystem(cctx, conn)
	if err != nil {
		cancel()
		return fmt.Errorf("IDENTIFY_SYSTEM: %w", err)
	}
	err = pglogrepl.StartReplication(cctx, conn, w.r.cfg.WALSlot, 0, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'",
		"publication_names '" + w.r.cfg.walPublication + "'", // validated: [a-z0-9_]
		"messages 'true'",
		"binary 'true'", // pgrelay.outbox_wal's rows: no DateStyle or bytea_output to follow
	}})
	cancel()
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55000" && w.lostAtStart(ctx, pgErr) {
			w.reportLost()
			return w.slotLostError(": " + pgErr.Message)
		}
		return fmt.Errorf("start replication: %w", err)
	}
	s := w.newSession(conn)
	s.keys = keys
	s.id = serverID{system: ident.SystemID, timeline: ident.Timeline}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s.end = stop
	w.mu.Lock()
	w.cur = s
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.cur = nil
		w.mu.Unlock()
	}()
	w.log.Info("streaming the slot", slog.Duration("wal_sender_timeout", w.senderTimeout))

	pubErr := make(chan error, 1)
	go func() {
		defer stop()
		pubErr <- s.publishLoop(sctx)
	}()
	readErr := s.read(sctx)
	stop()
	perr := <-pubErr
	if ctx.Err() != nil && readErr == nil && perr == nil && !s.stale.Load() {
		// A graceful stop: confirm what the last batch acknowledged.
		if err := s.sendStatus(true); err != nil {
			w.log.Debug("final standby status", slog.Any("error", err))
		}
	}
	if readErr != nil {
		return readErr
	}
	return perr
}

// lostAtStart reports whether START_REPLICATION's object-state error
// (SQLSTATE 55000) means the slot was invalidated: PostgreSQL 15 says
// "cannot read from logical replication slot" (detail: "This slot has been
// invalidated ..."), later versions "can no longer get changes from
// replication slot"; failing those, the slot's wal_status says so.
func (w *walSource) lostAtStart(ctx context.Context, pgErr *pgconn.PgError) bool {
	if strings.Contains(pgErr.Message, "can no longer get changes") || strings.Contains(pgErr.Detail, "invalidated") {
		return true
	}
	qctx, cancel := context.WithTimeout(ctx, w.r.cfg.QueryTimeout)
	defer cancel()
	row, err := w.slotStatus(qctx)
	return err == nil && row.walStatus == "lost"
}

// walSession is one replication connection's streaming: the reader (the
// connection's only user) and the publisher, joined by txs.
type walSession struct {
	w    *walSource
	conn *pgconn.PgConn
	txs  chan *walTx

	// interval is how often the reader sends a standby status update;
	// staleAfter how long a silence makes the session stale (0: never).
	interval, staleAfter time.Duration

	handed    atomic.Uint64 // end of the last transaction handed to the publisher
	confirmed atomic.Uint64 // end of the last transaction acknowledged in full
	lastSent  atomic.Int64  // when the last status update was sent (UnixNano)
	oldest    atomic.Int64  // commit time of the oldest transaction not acknowledged (UnixNano; 0: none)
	stale     atomic.Bool
	// end ends the session (its reader and publisher); set before the
	// session is published in walSource.cur.
	end context.CancelFunc

	// sent is the last position confirmed to the server; idle the position
	// the server reported having decoded while nothing was pending (reader
	// only).
	sent, idle pglogrepl.LSN
	// rels are the relations pgoutput described, by id, and types decodes
	// their columns (reader only).
	rels  map[uint32]*pglogrepl.RelationMessage
	types *pgtype.Map
	// keys are pgrelay.wal_keys' secrets by id, which sign the emitted
	// events (reader only).
	keys map[int32][]byte
	// id is the server streamed, recorded in the slot's history.
	id serverID
}

func (w *walSource) newSession(conn *pgconn.PgConn) *walSession {
	s := &walSession{w: w, conn: conn, txs: make(chan *walTx, 256), interval: time.Second,
		rels: map[uint32]*pglogrepl.RelationMessage{}, types: pgtype.NewMap()}
	if t := w.senderTimeout; t > 0 {
		s.staleAfter = t / 2
		if t/4 < s.interval {
			s.interval = t / 4
		}
	}
	s.lastSent.Store(time.Now().UnixNano())
	return s
}

// checkFresh marks the session stale when it went silent past staleAfter: a
// process pause (SIGSTOP, a suspended VM) long enough for the server to have
// cut the connection and another relay to have taken the slot.
func (s *walSession) checkFresh() error {
	if s.stale.Load() {
		return errStale
	}
	if s.staleAfter > 0 && time.Since(time.Unix(0, s.lastSent.Load())) > s.staleAfter {
		s.stale.Store(true)
		s.w.log.Warn("this relay went silent past half of wal_sender_timeout (paused?): dropping the session without publishing or confirming what it read",
			slog.Duration("wal_sender_timeout", s.w.senderTimeout))
		return errStale
	}
	return nil
}

// sendStatus confirms to the server the position every event before which
// the broker acknowledged. idle says the reader holds no partial
// transaction, so that the server's decoded position may be confirmed when
// everything handed over is acknowledged.
func (s *walSession) sendStatus(idle bool) error {
	if h := s.w.r.cfg.hooks.walBeforeStatus; h != nil {
		h()
	}
	if err := s.checkFresh(); err != nil {
		return err
	}
	pos := pglogrepl.LSN(s.confirmed.Load())
	if idle && s.handed.Load() == s.confirmed.Load() && s.idle > pos {
		pos = s.idle
	}
	if pos < s.sent {
		pos = s.sent
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos})
	if err != nil {
		return fmt.Errorf("standby status update: %w", err)
	}
	s.sent = pos
	s.lastSent.Store(time.Now().UnixNano())
	return nil
}

// read receives the stream, hands each committed transaction to the
// publisher in commit order, and keeps the server informed.
func (s *walSession) read(ctx context.Context) error {
	var cur *walTx
	next := time.Now().Add(s.interval)
	for {
		if ctx.Err() != nil {
			return nil
		}
		if !time.Now().Before(next) {
			if err := s.sendStatus(cur == nil); err != nil {
				return err
			}
			next = time.Now().Add(s.interval)
		}
		rctx, cancel := context.WithDeadline(ctx, next)
		raw, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("receive: %w", err)
		}
		if err := s.checkFresh(); err != nil {
			return err
		}
		var data []byte
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyData:
			data = m.Data
		default:
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return fmt.Errorf("parse keepalive: %w", err)
			}
			// A keepalive's position is the server's decoded position:
			// every transaction that ended before it was sent already.
			if cur == nil && pkm.ServerWALEnd > s.idle {
				s.idle = pkm.ServerWALEnd
			}
			if pkm.ReplyRequested {
				next = time.Now()
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(data[1:])
			if err != nil {
				return fmt.Errorf("parse XLogData: %w", err)
			}
			lm, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				return fmt.Errorf("parse pgoutput message: %w", err)
			}
			switch lm := lm.(type) {
			case *pglogrepl.BeginMessage:
				cur = &walTx{}
			case *pglogrepl.LogicalDecodingMessage:
				if !lm.Transactional {
					// The heartbeat (or another non-transactional message):
					// decoded in order, so what ended before it was sent.
					if cur == nil && lm.LSN > s.idle {
						s.idle = lm.LSN
					}
					continue
				}
				if lm.Prefix != walmsg.Prefix || cur == nil {
					continue
				}
				body, err := s.verify(ctx, lm)
				if err != nil {
					if !errors.Is(err, errRejected) {
						return err
					}
					continue
				}
				we, err := walmsg.Decode(body)
				m := walMessage(we)
				if err == nil {
					err = checkWALEvent(m)
				}
				if err != nil {
					s.w.log.Error("a pgrelay message in the WAL cannot be decoded; it is skipped (written with pg_logical_emit_message by hand?)",
						slog.String("lsn", lm.LSN.String()), slog.Any("error", err))
					cur.dead++
					continue
				}
				cur.msgs = append(cur.msgs, m)
			case *pglogrepl.RelationMessage:
				s.rels[lm.RelationID] = lm
			case *pglogrepl.InsertMessage:
				rel := s.rels[lm.RelationID]
				if cur == nil || rel == nil || !isWALTable(rel) {
					continue
				}
				m, err := decodeWALRow(s.types, rel, lm.Tuple)
				if err != nil {
					s.w.log.Error("a row inserted into "+walTable+" cannot be read as an event; it is skipped", slog.Any("error", err))
					cur.dead++
					continue
				}
				cur.msgs = append(cur.msgs, m)
			case *pglogrepl.CommitMessage:
				if cur == nil {
					continue
				}
				cur.end, cur.commit = lm.TransactionEndLSN, lm.CommitTime
				s.w.log.Debug("transaction read", slog.Int("events", len(cur.msgs)), slog.Any("end", cur.end))
				if err := s.hand(ctx, cur, &next); err != nil {
					return err
				}
				cur = nil
			}
		}
	}
}

// hand gives tx to the publisher, keeping the status updates going while the
// publisher is busy.
func (s *walSession) hand(ctx context.Context, tx *walTx, next *time.Time) error {
	for {
		t := time.NewTimer(time.Until(*next))
		select {
		case s.txs <- tx:
			t.Stop()
			s.handed.Store(uint64(tx.end))
			return nil
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
			if err := s.sendStatus(false); err != nil {
				return err
			}
			*next = time.Now().Add(s.interval)
		}
	}
}

// walLanes is how many lanes publish the WAL capture's events at once. A
// key's events always take the same lane (laneOf), and each lane publishes
// its part of batch after batch in commit order, so a key's events reach the
// broker in commit order, as the table capture's partitions publish theirs.
const walLanes = 16

// walNumberChunk is how many events one numbering statement takes at most.
const walNumberChunk = 1000

// walAhead is how many batches may be numbered and handed to the lanes
// before the oldest of them is acknowledged in full.
const walAhead = 4

// walBatch is a batch handed to the lanes: confirmed once every lane
// acknowledged its part, and every batch before it was confirmed.
type walBatch struct {
	end    pglogrepl.LSN // end of its last transaction
	commit time.Time     // commit of its first
	left   atomic.Int32  // parts not yet acknowledged
	done   chan struct{} // closed when none is left
}

func (b *walBatch) arrive() {
	if b.left.Add(-1) == 0 {
		close(b.done)
	}
}

// walPart is a lane's part of a batch, numbered, in commit order.
type walPart struct {
	b    *walBatch
	msgs []pgrelay.Message
	ends []pglogrepl.LSN
}

// laneOf is the lane publishing m: by its key (its event id when it has
// none), so that a key's events keep their order.
func laneOf(m *pgrelay.Message) int {
	k := m.Key
	if k == "" {
		k = m.EventID
	}
	h := uint32(2166136261) // FNV-1a
	for i := 0; i < len(k); i++ {
		h = (h ^ uint32(k[i])) * 16777619
	}
	return int(h % walLanes)
}

// publishLoop publishes the handed transactions in batches of up to
// BatchSize events, in commit order: it numbers each batch (publishTxs's
// numbering), hands each lane its part, and records a batch's end as
// confirmed once the lanes acknowledged all of it and all before it. Up to
// walAhead batches are in the lanes at once, so the broker's round trips of
// one batch overlap the numbering and the publishing of the next.
func (s *walSession) publishLoop(parent context.Context) error {
	ctx, cancel := context.WithCancelCause(parent)
	lanes := make([]chan walPart, walLanes)
	var wg sync.WaitGroup
	for i := range lanes {
		lanes[i] = make(chan walPart, walAhead)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range lanes[i] {
				if ctx.Err() != nil {
					continue // stopping: nothing more is published
				}
				if err := s.publishPart(ctx, p); err != nil {
					cancel(err)
					continue
				}
				p.b.arrive()
			}
		}()
	}
	defer func() {
		for _, l := range lanes {
			close(l)
		}
		cancel(nil)
		wg.Wait()
	}()
	stopped := func() error {
		cause := context.Cause(ctx)
		if parent.Err() != nil && !errors.Is(cause, errStale) {
			return nil // stopping: what is in the lanes is not confirmed
		}
		return cause
	}
	var ahead []*walBatch // handed to the lanes, not yet confirmed, in order
	for {
		for len(ahead) > 0 && isClosed(ahead[0].done) {
			s.confirm(ahead[0], ahead[1:])
			ahead = ahead[1:]
		}
		var front chan struct{}
		if len(ahead) > 0 {
			front = ahead[0].done
		}
		if len(ahead) >= walAhead {
			select {
			case <-front:
				continue
			case <-ctx.Done():
				return stopped()
			}
		}
		var tx *walTx
		select {
		case tx = <-s.txs:
		case <-front:
			continue
		case <-ctx.Done():
			return stopped()
		}
		if len(ahead) == 0 {
			s.oldest.Store(tx.commit.UnixNano())
		}
		batch, ok := s.gather(ctx, []*walTx{tx})
		if !ok {
			return stopped()
		}
		b := &walBatch{end: batch[len(batch)-1].end, commit: batch[0].commit, done: make(chan struct{})}
		b.left.Store(1) // publishTxs's own, until every part is handed over
		ahead = append(ahead, b)
		err := s.publishTxs(ctx, batch, func(lane int, p walPart) {
			p.b = b
			b.left.Add(1)
			select {
			case lanes[lane] <- p:
			case <-ctx.Done():
				b.left.Add(-1)
			}
		})
		if err != nil {
			if ctx.Err() != nil {
				return stopped()
			}
			return err
		}
		b.arrive()
	}
}

// confirm records b, acknowledged in full, as confirmed; next are the
// batches after it in the lanes.
func (s *walSession) confirm(b *walBatch, next []*walBatch) {
	s.w.log.Debug("batch acknowledged", slog.Any("end", b.end))
	s.confirmed.Store(uint64(b.end))
	switch {
	case s.confirmed.Load() == s.handed.Load():
		s.oldest.Store(0)
	case len(next) > 0:
		s.oldest.Store(next[0].commit.UnixNano())
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// gather adds to batch the transactions handed over already, up to
// BatchSize events. As the table capture's busy poll, while the capture is
// busy (busyLately) a batch of fewer than busyPollFull events waits up to
// walCoalesce for more, so that one numbering statement and one publish
// round carry a few events instead of one. ok is false when ctx ended.
func (s *walSession) gather(ctx context.Context, batch []*walTx) (_ []*walTx, ok bool) {
	r := s.w.r
	n := 0
	for _, tx := range batch {
		n += len(tx.msgs)
	}
	var pause <-chan time.Time
	if r.busyLately(time.Now()) {
		t := time.NewTimer(r.walCoalesce())
		defer t.Stop()
		pause = t.C
	}
fill:
	for n < r.cfg.BatchSize {
		var tx *walTx
		select {
		case tx = <-s.txs:
		default:
			if pause == nil || n >= busyPollFull {
				break fill
			}
			select {
			case tx = <-s.txs:
			case <-pause:
				pause = nil
				continue
			case <-ctx.Done():
				return batch, false
			}
		}
		batch = append(batch, tx)
		n += len(tx.msgs)
	}
	r.recent.add(n, time.Now(), r.lingerFor())
	return batch, true
}

// publishTxs numbers the events of batch in chunks of up to walNumberChunk
// and hands each chunk's lane parts over (hand) as soon as it is numbered. Before
// numbering it drops the events that expired (dropExpired), then numbers the
// keyed ones (numberKeySeqs), retrying a transient failure with backoff. It
// returns early only when ctx ends or the session went stale or lost the
// slot: then the rest of the batch is not handed over, and the batch is
// never confirmed.
func (s *walSession) publishTxs(ctx context.Context, batch []*walTx, hand func(lane int, p walPart)) error {
	r := s.w.r
	log := s.w.log
	var msgs []pgrelay.Message
	var ends []pglogrepl.LSN
	dead := 0
	for _, tx := range batch {
		msgs = append(msgs, tx.msgs...)
		for range tx.msgs {
			ends = append(ends, tx.end)
		}
		dead += tx.dead
	}
	if dead > 0 {
		r.cfg.obs.MarkedDead(walPartition, dead)
	}
	bo := r.newBackoff()
	for start := 0; start < len(msgs); start += walNumberChunk {
		end := min(start+walNumberChunk, len(msgs))
		// The chunk's own copy: expired events leave it for good.
		chunk, chunkEnds := slices.Clone(msgs[start:end]), slices.Clone(ends[start:end])
		for {
			if err := s.checkFresh(); err != nil {
				return err
			}
			// Expired events take no sequence: drop them before numbering.
			if chunk, chunkEnds = s.dropExpired(chunk, chunkEnds); len(chunk) == 0 {
				break
			}
			err := s.numberKeySeqs(ctx, chunk, chunkEnds)
			if err == nil {
				break
			}
			if errors.Is(err, errNotHolder) {
				return err
			}
			if serverStopping(err) {
				return fmt.Errorf("%w: %w", errServerStopping, err)
			}
			log.Warn("numbering key sequences failed; retrying the batch", slog.Int("events", len(chunk)), slog.Any("error", err))
			if !wait.Sleep(ctx, bo.Next()) {
				return ctx.Err()
			}
		}
		// The chunk's parts go to their lanes at once: the lanes publish
		// them while the next chunk is numbered.
		var parts [walLanes]walPart
		for i := range chunk {
			l := laneOf(&chunk[i])
			parts[l].msgs = append(parts[l].msgs, chunk[i])
			parts[l].ends = append(parts[l].ends, chunkEnds[i])
		}
		for l, p := range parts {
			if len(p.msgs) > 0 {
				hand(l, p)
			}
		}
	}
	return nil
}

// publishPart publishes a lane's part of a batch until the broker
// acknowledged every event (or refused it for good), in chunks of up to
// BatchSize, retrying transient failures with backoff. It returns early
// only when ctx ends or the session went stale: then the part is not
// acknowledged and its batch never confirmed.
func (s *walSession) publishPart(ctx context.Context, p walPart) error {
	r := s.w.r
	log := s.w.log
	bo := r.newBackoff()
	for start := 0; start < len(p.msgs); start += r.cfg.BatchSize {
		end := min(start+r.cfg.BatchSize, len(p.msgs))
		chunk, chunkEnds := slices.Clone(p.msgs[start:end]), slices.Clone(p.ends[start:end])
		for {
			if h := r.cfg.hooks.walBeforePublish; h != nil {
				h(len(chunk))
			}
			if err := s.checkFresh(); err != nil {
				return err
			}
			// One that expired since it was numbered is not published (its
			// number is then a gap, as an expired outbox row's is).
			if chunk, chunkEnds = s.dropExpired(chunk, chunkEnds); len(chunk) == 0 {
				break
			}
			t0 := time.Now()
			results := r.publish(chunk, time.Now().Add(r.cfg.PublishTimeout))
			r.cfg.obs.PublishDuration(walPartition, len(chunk), time.Since(t0))
			var transient error
			published, dups, terminal := 0, 0, 0
			for i, res := range results {
				switch {
				case res.Err != nil && !broker.IsTerminal(res.Err):
					if transient == nil {
						transient = res.Err
					}
				case res.Err != nil:
					terminal++
					log.Error("event rejected permanently by the broker; skipped", slog.String("event_id", chunk[i].EventID), slog.Any("error", res.Err))
				default:
					published++
					if res.Duplicate {
						dups++
					}
				}
			}
			if transient != nil {
				// Republish the whole chunk after a pause: in order, and the
				// events acknowledged already are absorbed as duplicates.
				r.cfg.obs.PublishFailed(walPartition, len(chunk), transient)
				log.Warn("publish failed; retrying the batch", slog.Int("events", len(chunk)), slog.Any("error", transient))
				if !wait.Sleep(ctx, bo.Next()) {
					return ctx.Err()
				}
				continue
			}
			if terminal > 0 {
				r.cfg.obs.MarkedDead(walPartition, terminal)
			}
			if published > 0 {
				r.cfg.obs.Published(walPartition, published, dups, time.Since(p.b.commit))
			}
			break
		}
	}
	return nil
}

// monitor reads the slot's status every HeartbeatInterval, reports it, and
// writes a heartbeat message while this relay streams, so that a quiet
// database does not pin WAL. It ends the capture (cancel) when the slot is
// lost.
func (w *walSource) monitor(ctx context.Context, cancel context.CancelCauseFunc) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, qcancel := context.WithTimeout(ctx, w.r.cfg.QueryTimeout)
		w.mu.Lock()
		s := w.cur
		w.mu.Unlock()
		if s != nil {
			if err := w.r.q.WALHeartbeat(qctx, w.r.cfg.Pool); err != nil && ctx.Err() == nil {
				w.log.Warn("WAL heartbeat", slog.Any("error", err))
			}
			if err := w.r.q.RecordWALSlotHistory(qctx, w.r.cfg.Pool, db.RecordWALSlotHistoryParams{SystemIdentifier: s.id.system, Timeline: s.id.timeline,
				Slot: w.r.cfg.WALSlot}); err != nil && ctx.Err() == nil {
				w.log.Warn("record the slot's history", slog.Any("error", err))
			}
			w.pruneKeySeqs(qctx)
		}
		row, err := w.slotStatus(qctx)
		qcancel()
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("read the slot's status", slog.Any("error", err))
			}
			if s != nil && serverStopping(err) {
				// The publisher may be retrying a broker that is down:
				// the server's shutdown must not wait for it.
				w.log.Warn("the server is shutting down: dropping the WAL capture session", slog.Any("error", err))
				s.end()
			}
		} else {
			st := WALSlotStatus{Slot: w.r.cfg.WALSlot, Exists: row.exists, Active: row.active, WALStatus: row.walStatus, LagBytes: row.lagBytes, At: time.Now()}
			if s != nil {
				st.Reading = true
				st.ConfirmedLSN = pglogrepl.LSN(s.confirmed.Load()).String()
				if o := s.oldest.Load(); o != 0 {
					st.LagSeconds = time.Since(time.Unix(0, o)).Seconds()
				}
			}
			w.mu.Lock()
			w.status = st
			w.mu.Unlock()
			w.r.observeSlot(st)
			switch {
			case row.walStatus == "lost":
				err := w.slotLostError("")
				w.log.Error("the replication slot is lost; the relay stops", slog.Any("error", err))
				cancel(err)
				return
			case !row.exists:
				cancel(fmt.Errorf("relay: %w: slot %q is missing (dropped, or a failover reached a server without it)", errSlotGone, w.r.cfg.WALSlot))
				return
			}
		}
		t.Reset(wait.Jitter(w.r.cfg.HeartbeatInterval, jitterSpread))
	}
}

// WALStatus returns the replication slot's status as of the last heartbeat,
// and false when the relay does not capture from the WAL (or has not looked
// yet).
func (r *engine) WALStatus() (WALSlotStatus, bool) {
	r.walMu.Lock()
	w := r.wal
	r.walMu.Unlock()
	if w == nil {
		return WALSlotStatus{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status, !w.status.At.IsZero()
}

// observeSlot reports st to Config's walObs, if any.
func (r *engine) observeSlot(st WALSlotStatus) {
	if o := r.cfg.walObs; o != nil {
		o.WALSlot(st.LagBytes, st.LagSeconds, st.Reading, st.WALStatus, st.Gap != "")
	}
}
