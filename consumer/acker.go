package consumer

// Asynchronous commit (Config.AsyncCommit): a batch's store transaction
// commits with synchronous_commit off, so its commit does not wait for the
// WAL flush, and the batch's acknowledgements are handed to the acker, which
// sends them once the server has flushed its WAL past the commit. The ingest
// loop meanwhile fetches and stores the next batches.
//
// The acker polls the server's flushed WAL position on a connection of its
// own and, when an acknowledgement has waited longer than
// Config.AsyncFlushAfter, forces the flush with one tiny synchronous
// transaction (whose commit flushes all WAL before it). A position alone is
// not enough: after a crash the server reuses the positions of the WAL it
// lost, so a commit is taken as flushed only when the acker's connection,
// which a crash or restart would have cut, was open before the commit was
// sent and reads the same server (address and port) the commit did.
// Anything the acker cannot prove flushed is left unacknowledged: the broker
// redelivers it and the inbox absorbs the redelivery.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/broker"
)

// The store transaction's first and last round trips with AsyncCommit. The
// setting is local to the transaction (nothing is left in the session), and
// the WAL insert position read right after the COMMIT, in the same simple
// query, is at or past the commit record.
const (
	asyncBeginSQL  = "BEGIN; SET LOCAL synchronous_commit TO off"
	asyncCommitSQL = "COMMIT; SELECT pg_catalog.pg_current_wal_insert_lsn()::text, " + serverIDExpr
	serverIDExpr   = "coalesce(pg_catalog.host(pg_catalog.inet_server_addr()) || ':' || pg_catalog.inet_server_port()::text, '')"
	// flushedSQL reads the flushed WAL position and whether synchronous
	// standbys are configured (a local flush is then not what a synchronous
	// commit would have waited for).
	flushedSQL = "SELECT pg_catalog.pg_current_wal_flush_lsn()::text, pg_catalog.current_setting('synchronous_standby_names') <> ''"
	// forceFlushSQL commits one transaction that wrote WAL, so its commit
	// waits for the flush as the session's synchronous_commit says (turned
	// on for it if the session's is off): every WAL record before it is
	// flushed, on the synchronous standbys too when there are some. A
	// transaction that only took a transaction id (txid_current()) would
	// not do: PostgreSQL commits one that wrote no WAL of its own
	// asynchronously. The transactional logical decoding message (any role
	// may write one; no table is touched) is the WAL written; a relay
	// capturing from the WAL skips its prefix.
	forceFlushSQL = "SELECT pg_catalog.pg_logical_emit_message(true, 'pgrelay.consumer.flush', ''), pg_catalog.set_config('synchronous_commit', " +
		"CASE pg_catalog.current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE pg_catalog.current_setting('synchronous_commit') END, true)"
)

// commitMark is what the acker must know of the commits of one batch's
// deliveries to tell when they are flushed.
type commitMark struct {
	// n counts the commits merged in; 0 means none.
	n int
	// lsn is the WAL insert position read after the last commit: at or past
	// every commit record.
	lsn uint64
	// sent is when the first COMMIT was sent.
	sent time.Time
	// server is the address and port of the server that took the commits
	// (see serverIDExpr); mixed when they went to different ones.
	server string
	mixed  bool
}

// add merges one more commit into m.
func (m *commitMark) add(o commitMark) {
	if m.n == 0 {
		*m = o
		return
	}
	m.n += o.n
	m.lsn = max(m.lsn, o.lsn)
	if o.sent.Before(m.sent) {
		m.sent = o.sent
	}
	if m.server != o.server || o.mixed {
		m.mixed = true
	}
}

// parseLSN parses PostgreSQL's pg_lsn text form, X/Y in hexadecimal.
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("consumer: bad LSN %q", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("consumer: bad LSN %q", s)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("consumer: bad LSN %q", s)
	}
	return h<<32 | l, nil
}

// beginFunc runs fn in a transaction of the pool, as pgx.BeginFunc does.
// With Config.AsyncCommit and a mark, the transaction commits with
// synchronous_commit off and adds its commit to mark.
func (c *Consumer) beginFunc(ctx context.Context, mark *commitMark, fn func(pgx.Tx) error) error {
	if !c.cfg.AsyncCommit || mark == nil {
		return pgx.BeginFunc(ctx, c.cfg.Pool, fn)
	}
	conn, err := c.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // a connection left in a transaction is closed, not reused
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: asyncBeginSQL})
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		if rerr := tx.Rollback(ctx); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			return errors.Join(err, rerr)
		}
		return err
	}
	sent := time.Now()
	res, err := commitAsync(ctx, conn.Conn())
	if err != nil {
		return err
	}
	if len(res) != 2 || res[0].CommandTag.String() != "COMMIT" {
		return pgx.ErrTxCommitRollback
	}
	if len(res[1].Rows) != 1 || len(res[1].Rows[0]) != 2 {
		return fmt.Errorf("consumer: the commit's WAL position: unexpected reply")
	}
	// The transaction is committed from here on: an error below makes the
	// caller store the batch again, which the inbox absorbs.
	lsn, err := parseLSN(string(res[1].Rows[0][0]))
	if err != nil {
		return err
	}
	mark.add(commitMark{n: 1, lsn: lsn, sent: sent, server: string(res[1].Rows[0][1])})
	return nil
}

// commitAsync sends asyncCommitSQL, both statements in one simple query
// (pgx's Exec would return only the last command tag, Query only the first
// result), telling the connection's query tracer as pgx does.
func commitAsync(ctx context.Context, conn *pgx.Conn) ([]*pgconn.Result, error) {
	tracer := conn.Config().Tracer
	if tracer != nil {
		ctx = tracer.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{SQL: asyncCommitSQL})
	}
	res, err := conn.PgConn().Exec(ctx, asyncCommitSQL).ReadAll()
	if tracer != nil {
		var tag pgconn.CommandTag
		if len(res) > 0 {
			tag = res[0].CommandTag
		}
		tracer.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{CommandTag: tag, Err: err})
	}
	return res, err
}

// walSession is the acker's view of the server: a connection of its own.
type walSession interface {
	// since is a time at which the session's server connection was open.
	since() time.Time
	// server is the address and port of the session's server.
	server() string
	// flushed returns the server's flushed WAL position, and whether a local
	// flush falls short of a synchronous commit (synchronous standbys).
	flushed(ctx context.Context) (lsn uint64, needSync bool, err error)
	// forceFlush commits a synchronous transaction: every commit sent
	// before it is flushed when it returns.
	forceFlush(ctx context.Context) error
	close()
}

// pgSession is a walSession on a connection opened with the pool's settings.
type pgSession struct {
	conn   *pgx.Conn
	opened time.Time
	srv    string
}

// dialWAL opens the acker's connection to the pool's server.
func dialWAL(pool *pgxpool.Pool) func(ctx context.Context) (walSession, error) {
	return func(ctx context.Context) (walSession, error) {
		conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
		if err != nil {
			return nil, err
		}
		s := &pgSession{conn: conn, opened: time.Now()} // the connection is open by now
		if err := conn.QueryRow(ctx, "SELECT "+serverIDExpr).Scan(&s.srv); err != nil {
			s.close()
			return nil, err
		}
		return s, nil
	}
}

func (s *pgSession) since() time.Time { return s.opened }
func (s *pgSession) server() string   { return s.srv }

func (s *pgSession) flushed(ctx context.Context) (uint64, bool, error) {
	var text string
	var needSync bool
	if err := s.conn.QueryRow(ctx, flushedSQL).Scan(&text, &needSync); err != nil {
		return 0, false, err
	}
	lsn, err := parseLSN(text)
	return lsn, needSync, err
}

func (s *pgSession) forceFlush(ctx context.Context) error {
	_, err := s.conn.Exec(ctx, forceFlushSQL)
	return err
}

func (s *pgSession) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = s.conn.Close(ctx)
}

// ackEntry is one batch's deliveries waiting for their commits' flush.
type ackEntry struct {
	mark  commitMark
	ds    []broker.Delivery
	added time.Time
}

// acker sends the acknowledgements of asynchronously committed batches once
// their commits are flushed, in the order the batches were handed over.
type acker struct {
	in         chan ackEntry
	done       chan struct{}
	dial       func(ctx context.Context) (walSession, error)
	ack        func(ds []broker.Delivery)
	log        *slog.Logger
	poll       time.Duration
	flushAfter time.Duration
	maxPending int
	timeout    time.Duration
	retry      time.Duration
	// open tells whether the session is open (tests wait for it).
	open *atomic.Bool

	// Only run touches these.
	pending []ackEntry
	sess    walSession
	failed  time.Time // when dialling last failed
}

func newAcker(c *Consumer) *acker {
	return &acker{
		in:         make(chan ackEntry),
		done:       make(chan struct{}),
		dial:       dialWAL(c.cfg.Pool),
		ack:        c.ackNow,
		log:        c.log,
		poll:       c.cfg.asyncPollInterval,
		flushAfter: c.cfg.AsyncFlushAfter,
		maxPending: c.cfg.asyncMaxPending,
		timeout:    c.cfg.storeTimeout,
		retry:      c.cfg.RetryMin,
		open:       &c.walReaderOpen,
	}
}

// add hands a batch's deliveries over, waiting while AsyncMaxPending
// batches already wait for their flush.
func (a *acker) add(mark commitMark, ds []broker.Delivery) {
	if len(ds) == 0 {
		return
	}
	a.in <- ackEntry{mark: mark, ds: ds, added: time.Now()}
}

// stop waits for the acker to acknowledge (or give up on) every batch
// handed over; add must not be called again.
func (a *acker) stop() {
	close(a.in)
	<-a.done
}

// run acknowledges until stop: while batches wait, it polls the flushed
// position every poll interval and forces a flush when the oldest has waited
// flushAfter, or at once on stop.
func (a *acker) run() {
	defer close(a.done)
	defer func() {
		if a.sess != nil {
			a.sess.close()
			a.open.Store(false)
		}
	}()
	a.connect(true)
	ticker := time.NewTicker(a.poll)
	defer ticker.Stop()
	stopping := false
	for {
		var in <-chan ackEntry
		if !stopping && len(a.pending) < a.maxPending {
			in = a.in
		}
		var tick <-chan time.Time
		if len(a.pending) > 0 || (a.sess == nil && !stopping) {
			// The session is (re)opened as soon as it can be: a commit
			// sent before it opens cannot be proven flushed.
			tick = ticker.C
		}
		if in == nil && tick == nil {
			return // stopping with nothing left
		}
		select {
		case e, ok := <-in:
			if !ok {
				stopping = true
				break
			}
			a.pending = append(a.pending, e)
			continue // poll at the next tick: the commit has only just been sent
		case <-tick:
		}
		if len(a.pending) > 0 {
			a.settle(stopping)
		} else if a.sess == nil {
			a.connect(false)
		}
	}
}

// connect opens the session unless it is open, or dialling failed less than
// the retry interval ago (and not force); it reports whether it is open.
func (a *acker) connect(force bool) bool {
	if a.sess != nil {
		return true
	}
	if !force && !a.failed.IsZero() && time.Since(a.failed) < a.retry {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	s, err := a.dial(ctx)
	cancel()
	if err != nil {
		a.failed = time.Now()
		a.dropAll("connecting to read the WAL flush position failed", err)
		return false
	}
	a.sess, a.failed = s, time.Time{}
	a.open.Store(true)
	return true
}

// settle acknowledges the batches whose commits are flushed, forcing a
// flush if the oldest has waited too long (or force). Whatever it cannot
// prove flushed because the database failed is dropped unacknowledged.
func (a *acker) settle(force bool) {
	if !a.connect(force) {
		return
	}
	// A commit sent before the session was open, or to another server, may
	// have been lost in a crash the session did not see.
	kept := a.pending[:0]
	var unproven int
	for _, e := range a.pending {
		if e.mark.n == 0 || e.mark.mixed || !a.sess.since().Before(e.mark.sent) || e.mark.server != a.sess.server() {
			unproven += len(e.ds)
			continue
		}
		kept = append(kept, e)
	}
	a.pending = kept
	if unproven > 0 {
		a.log.Warn("deliveries committed before the WAL position reader connected are left unacknowledged; "+
			"the broker redelivers them and the inbox absorbs them", slog.Int("messages", unproven))
	}
	if len(a.pending) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	flushed, needSync, err := a.sess.flushed(ctx)
	if err != nil {
		a.lost("reading the WAL flush position failed", err)
		return
	}
	if !needSync {
		a.ackFlushed(flushed)
	}
	if len(a.pending) == 0 {
		return
	}
	if !force && !needSync && time.Since(a.pending[0].added) < a.flushAfter {
		return // the WAL writer or another commit may flush it meanwhile
	}
	covered := len(a.pending) // every commit sent before the flush
	if err := a.sess.forceFlush(ctx); err != nil {
		a.lost("forcing the WAL flush failed", err)
		return
	}
	for _, e := range a.pending[:covered] {
		a.ack(e.ds)
	}
	a.pending = append(a.pending[:0], a.pending[covered:]...)
}

// ackFlushed acknowledges, in order, the batches whose commits are at or
// before the flushed position.
func (a *acker) ackFlushed(flushed uint64) {
	kept := a.pending[:0]
	for _, e := range a.pending {
		if e.mark.lsn <= flushed {
			a.ack(e.ds)
			continue
		}
		kept = append(kept, e)
	}
	clear(a.pending[len(kept):])
	a.pending = kept
}

// lost closes the session after a failure and drops what waits.
func (a *acker) lost(what string, err error) {
	a.sess.close()
	a.sess = nil
	a.open.Store(false)
	a.dropAll(what, err)
}

func (a *acker) dropAll(what string, err error) {
	n := 0
	for _, e := range a.pending {
		n += len(e.ds)
	}
	clear(a.pending)
	a.pending = a.pending[:0]
	if n > 0 {
		a.log.Warn(what+"; deliveries waiting for the flush of their asynchronous commit are left unacknowledged: "+
			"the broker redelivers them and the inbox absorbs them", slog.Any("error", err), slog.Int("messages", n))
	}
}

// ackNow acknowledges stored deliveries.
func (c *Consumer) ackNow(ds []broker.Delivery) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.storeTimeout)
	defer cancel()
	for _, d := range ds {
		if err := d.Ack(ctx); err != nil {
			// Harmless: the redelivery is absorbed by the inbox.
			c.log.Warn("ack failed; the message will be redelivered and deduplicated",
				slog.String("ref", d.Ref), slog.Any("error", err))
			continue
		}
		c.stats.acked.Add(1)
	}
}
