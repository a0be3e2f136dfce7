package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/migrations"
)

// Database is one database whose outbox a Relay publishes (Config.Databases).
// Each keeps its own outbox, partitions and leases: every relay given the
// database takes leases in it, so a fleet of relays spreads the partitions
// of all their databases.
type Database struct {
	// Name names the database in logs, errors and the metrics' database
	// label: 1-63 of [A-Za-z0-9_.-], not starting with '.' or '-'; unique
	// within a relay.
	Name string
	// Pool is the database (migrated). Give it PoolConns(partitions)
	// connections.
	Pool *pgxpool.Pool
	// ListenConnConfig is Config.ListenConnConfig for this database.
	// Default: Pool's.
	ListenConnConfig *pgx.ConnConfig
}

// ValidDatabaseName reports whether name can name a Database.
func ValidDatabaseName(name string) bool { return pgurl.ValidName(name) }

// validateDatabases checks Config.Pool and Config.Databases together.
func validateDatabases(pool *pgxpool.Pool, dbs []Database, capture string) error {
	if pool != nil && len(dbs) > 0 {
		return bad("Databases", "{} and {Pool} are both set: give one or the other")
	}
	if capture == CaptureWAL && len(dbs) > 1 {
		// Replication slots are named per server, not per database.
		return bad("Databases", "{} names %d databases: {Capture} %q serves one", len(dbs), capture)
	}
	var errs []error
	seen := map[string]bool{}
	pools := map[*pgxpool.Pool]string{}
	for i, d := range dbs {
		switch {
		case !ValidDatabaseName(d.Name):
			errs = append(errs, bad("Databases", "{}[%d].Name %q must be 1-63 of [A-Za-z0-9_.-], not starting with '.' or '-'", i, d.Name))
		case seen[d.Name]:
			errs = append(errs, bad("Databases", "{} names %q twice", d.Name))
		}
		seen[d.Name] = true
		switch {
		case d.Pool == nil:
			errs = append(errs, bad("Databases", "{}[%d].Pool (%s) is required", i, d.Name))
		case pools[d.Pool] != "":
			errs = append(errs, bad("Databases", "{}: %s and %s share one Pool", pools[d.Pool], d.Name))
		default:
			pools[d.Pool] = d.Name
		}
	}
	return errors.Join(errs...)
}

// databases returns the databases c names: Databases, or Pool as one
// database named after its database name ("default" when it has none that
// can name one).
func (c Config) databases() []Database {
	if c.Pool == nil {
		return c.Databases
	}
	name := c.Pool.Config().ConnConfig.Database
	if !ValidDatabaseName(name) {
		name = "default"
	}
	return []Database{{Name: name, Pool: c.Pool, ListenConnConfig: c.ListenConnConfig}}
}

// gate shares publishing among the relay's databases by the events they
// have in flight (handed to the broker, not yet acknowledged): while k
// databases have events in flight or waiting, each may have at most
// budget/k in flight, and always one batch. A batch over its database's
// share waits; as events are acknowledged the waiting batches are let
// through in turn, one per database per round, each database's in order.
// A backlog thus fills at most its share of the broker's pipe, and a batch
// of another database waits behind at most about budget events. The budget
// is the fleet's: N relays publishing into one broker put N relays' events
// in flight ahead of a quiet database's, so each relay takes budget/N, N
// being the most relays alive in any of its databases (fleet).
type gate struct {
	mu       sync.Mutex
	budget   int
	inflight map[string]int      // each database's events in flight
	queue    map[string][]*entry // each database's waiting batches, in order
	turn     []string            // the databases with batches waiting, next first
	relays   map[string]int      // the relays alive in each database, as last counted
	// shared is set while the relay serves several databases: with one,
	// nothing is bounded (its partitions' batches all go out at once, as
	// they would without the gate).
	shared bool
}

type entry struct {
	n       int
	granted chan struct{}
}

func newGate(budget int) *gate {
	return &gate{budget: budget, inflight: map[string]int{}, queue: map[string][]*entry{}, relays: map[string]int{}}
}

// serve tells the gate which databases the relay serves.
func (g *gate) serve(databases []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shared = len(databases) > 1
	for d := range g.relays {
		if !slices.Contains(databases, d) {
			delete(g.relays, d)
		}
	}
	g.grant()
}

// fleet records how many relays are alive in database (its relay table's
// heartbeats, as the partitions' fair share counts them).
func (g *gate) fleet(database string, relays int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.relays[database] = relays
	g.grant()
}

// share returns this relay's part of the fleet's budget.
func (g *gate) share() int {
	n := 1
	for _, r := range g.relays {
		n = max(n, r)
	}
	return max(1, g.budget/n)
}

// fits reports whether database may put n more events in flight.
func (g *gate) fits(database string, n int) bool {
	if !g.shared {
		return true
	}
	active := len(g.inflight)
	for d := range g.queue {
		if g.inflight[d] == 0 {
			active++
		}
	}
	if _, ok := g.inflight[database]; !ok && len(g.queue[database]) == 0 {
		active++ // database itself, about to be
	}
	return g.inflight[database] == 0 || g.inflight[database]+n <= g.share()/active
}

// acquire waits until database may publish a batch of n events, or for
// ctx's end. A nil gate lets everything through.
func (g *gate) acquire(ctx context.Context, database string, n int) error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	if len(g.queue[database]) == 0 && g.fits(database, n) {
		g.inflight[database] += n
		g.mu.Unlock()
		return nil
	}
	e := &entry{n: n, granted: make(chan struct{})}
	if len(g.queue[database]) == 0 {
		g.turn = append(g.turn, database)
	}
	g.queue[database] = append(g.queue[database], e)
	g.mu.Unlock()
	select {
	case <-e.granted:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	select {
	case <-e.granted: // granted meanwhile: give it back
		g.mu.Unlock()
		g.release(database, n)
		return ctx.Err()
	default:
	}
	q := g.queue[database]
	for i, x := range q {
		if x == e {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	g.setQueue(database, q)
	g.grant()
	g.mu.Unlock()
	return ctx.Err()
}

// release ends a batch of n events of database: acknowledged or failed.
func (g *gate) release(database string, n int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inflight[database] -= n; g.inflight[database] <= 0 {
		delete(g.inflight, database)
	}
	g.grant()
}

// grant lets the waiting batches through that now fit: in rounds over the
// databases in turn, each database's first batch, while any fits.
func (g *gate) grant() {
	for granted := true; granted; {
		granted = false
		for range len(g.turn) {
			d := g.turn[0]
			g.turn = g.turn[1:]
			q := g.queue[d]
			if g.fits(d, q[0].n) {
				g.inflight[d] += q[0].n
				close(q[0].granted)
				q = q[1:]
				granted = true
			}
			g.setQueue(d, q)
		}
	}
}

// setQueue stores database's waiting batches; with some, it takes its turn
// after the others.
func (g *gate) setQueue(database string, q []*entry) {
	for i, d := range g.turn {
		if d == database {
			g.turn = append(g.turn[:i:i], g.turn[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(g.queue, database)
		return
	}
	g.queue[database] = q
	g.turn = append(g.turn, database)
}

// collectors is one database's metrics: registered on the relay's registry
// as one collector under the database's label, and unregistered with it
// when the database is removed.
type collectors struct {
	mu sync.Mutex
	cs []prometheus.Collector
}

func (s *collectors) Register(c prometheus.Collector) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cs = append(s.cs, c)
	return nil
}

func (s *collectors) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = s.Register(c)
	}
}

func (s *collectors) Unregister(prometheus.Collector) bool { return false }

func (s *collectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range s.list() {
		c.Describe(ch)
	}
}

func (s *collectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range s.list() {
		c.Collect(ch)
	}
}

func (s *collectors) list() []prometheus.Collector {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]prometheus.Collector(nil), s.cs...)
}

// labelled is the relay's registerer for database's metrics.
func (r *Relay) labelled(database string) prometheus.Registerer {
	return prometheus.WrapRegistererWith(prometheus.Labels{"database": database}, r.reg)
}

// dbRun is one database's engine, running once started.
type dbRun struct {
	db      Database
	e       *engine
	metrics *collectors
	stop    context.CancelFunc
	done    chan struct{}
	// failed is set when the engine ended on an error after SetDatabases
	// started it: it is no longer served, and listed again it restarts.
	failed atomic.Bool
	// schema is the database's schema version as last read: by its check,
	// then by watchSchema alone once started.
	schema       migrations.Status
	schemaGauges *metrics.RelaySchema
}

// newDB builds d's engine, its metrics registered under d's label.
func (r *Relay) newDB(d Database) (*dbRun, error) {
	set := &collectors{}
	c := r.cfg
	c.Pool, c.ListenConnConfig, c.Databases = d.Pool, d.ListenConnConfig, nil
	c.database, c.registerer, c.gate = d.Name, set, r.gate
	e, err := newEngine(c)
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", d.Name, err)
	}
	outbox, err := metrics.NewOutboxCollector(metrics.DBCollectorConfig{Pool: d.Pool, Logger: e.log})
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", d.Name, err)
	}
	set.MustRegister(outbox)
	return &dbRun{db: d, e: e, metrics: set, schemaGauges: metrics.NewRelaySchema(set)}, nil
}

// start runs d's engine until stop; its metrics are served meanwhile, and
// its schema version re-read (watchSchema). A failure of the engine (at its
// start: a standby check, the WAL slot) is sent to failed, the database
// named.
func (r *Relay) start(ctx context.Context, d *dbRun, failed func(error)) error {
	if err := r.labelled(d.db.Name).Register(d.metrics); err != nil {
		return fmt.Errorf("database %s: metrics: %w", d.db.Name, err)
	}
	r.noteSchema(d, d.schema, true)
	ctx, d.stop = context.WithCancel(ctx)
	d.done = make(chan struct{})
	go func() {
		defer close(d.done)
		watchCtx, stopWatch := context.WithCancel(ctx)
		var watch sync.WaitGroup
		watch.Go(func() { r.watchSchema(watchCtx, d) })
		defer func() {
			stopWatch()
			watch.Wait()
		}()
		if err := d.e.run(ctx); err != nil && ctx.Err() == nil {
			failed(fmt.Errorf("database %s: %w", d.db.Name, err))
		}
	}()
	return nil
}

// halt stops d's engine gracefully (the batches in flight are published
// and marked, the leases released) and drops its metrics.
func (r *Relay) halt(d *dbRun) {
	d.stop()
	<-d.done
	r.labelled(d.db.Name).Unregister(d.metrics)
}

// SetDatabases makes the running relay publish the outboxes of dbs: a
// database no longer listed is stopped gracefully (its batches in flight
// published and marked, its leases released, so other relays take its
// partitions over at once), one newly listed is checked and started, one
// listed again under the same name and Pool keeps running (another Pool
// under a name restarts it). A database that fails its check is logged,
// skipped and named in the error returned; the others are served. The
// list is checked as Config.Databases; an invalid one changes nothing.
// Called before Run has started (it checks its databases first), it waits
// for that, or for ctx.
func (r *Relay) SetDatabases(ctx context.Context, dbs []Database) error {
	if err := validateDatabases(nil, dbs, r.cfg.Capture); err != nil {
		return err
	}
	if len(dbs) == 0 {
		return bad("Databases", "{} is empty: a relay serves one database at least")
	}
	select {
	case <-r.started:
	case <-ctx.Done(): // Run checks the databases first: a reload sent meanwhile waits
		return fmt.Errorf("relay: SetDatabases: Run has not started: %w", ctx.Err())
	}
	r.setMu.Lock()
	defer r.setMu.Unlock()
	r.mu.Lock()
	current := r.dbs
	runCtx := r.runCtx
	r.mu.Unlock()
	if runCtx.Err() != nil {
		return errors.New("relay: SetDatabases: the relay has stopped")
	}
	wanted := map[string]Database{}
	for _, d := range dbs {
		wanted[d.Name] = d
	}
	var kept []*dbRun
	have := map[string]bool{}
	for _, d := range current {
		if w, ok := wanted[d.db.Name]; ok && w.Pool == d.db.Pool && !d.failed.Load() {
			kept = append(kept, d)
			have[d.db.Name] = true
			continue
		}
		r.log.Info("database removed: stopping its engine and releasing its leases", slog.String("database", d.db.Name))
		r.halt(d)
	}
	var errs []error
	for _, w := range dbs {
		if have[w.Name] {
			continue
		}
		d, err := r.newDB(w)
		if err == nil {
			err = r.checkDatabase(ctx, "Databases", d)
		}
		if err == nil {
			err = r.start(runCtx, d, func(err error) {
				d.failed.Store(true)
				r.log.Error("database stopped; the others are served on", slog.Any("error", err))
			})
		}
		if err != nil {
			r.log.Error("database skipped", slog.String("database", w.Name), slog.Any("error", err))
			errs = append(errs, err)
			continue
		}
		r.log.Info("database added", slog.String("database", w.Name))
		kept = append(kept, d)
	}
	r.mu.Lock()
	r.dbs = kept
	r.mu.Unlock()
	r.gate.serve(names(kept))
	return errors.Join(errs...)
}

// names returns the names of dbs, in order.
func names(dbs []*dbRun) []string {
	out := make([]string, len(dbs))
	for i, d := range dbs {
		out[i] = d.db.Name
	}
	return out
}

// Databases returns the names of the databases the relay publishes, in
// order.
func (r *Relay) Databases() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.dbs))
	for _, d := range r.dbs {
		if !d.failed.Load() {
			names = append(names, d.db.Name)
		}
	}
	return names
}
