package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgrelay/pgrelay/internal/db"
)

// DBCollectorConfig configures the DB-derived gauge collectors.
type DBCollectorConfig struct {
	// Pool is the database to query. Required.
	Pool *pgxpool.Pool
	// Timeout bounds each query. Default: 2s.
	Timeout time.Duration
	// CacheFor is how long a result is reused by later scrapes, so that
	// several scrapers (or a fast scrape interval) cost one query. Default: 5s.
	CacheFor time.Duration
	// Logger receives query failures. Default: a no-op logger.
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c DBCollectorConfig) WithDefaults() DBCollectorConfig {
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
	if c.CacheFor == 0 {
		c.CacheFor = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c DBCollectorConfig) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("metrics: DBCollectorConfig.Pool is required")
	case c.Timeout < 0:
		return fmt.Errorf("metrics: DBCollectorConfig.Timeout must be positive, got %s", c.Timeout)
	case c.CacheFor < 0:
		return fmt.Errorf("metrics: DBCollectorConfig.CacheFor must not be negative, got %s", c.CacheFor)
	}
	return nil
}

// cachedCollector runs a query returning a fixed list of values, caches the
// result, and exports each value as a gauge. When a query fails, the last
// known values are exported (zero before the first success) and the up gauge
// is 0, so that no series ever disappears.
type cachedCollector struct {
	cfg    DBCollectorConfig
	query  func(ctx context.Context) ([]float64, error)
	gauges []*prometheus.Desc
	up     *prometheus.Desc

	mu   sync.Mutex
	last []float64
	at   time.Time
	ok   bool
}

func newCachedCollector(cfg DBCollectorConfig, upName, upHelp string, descs []*prometheus.Desc,
	query func(ctx context.Context) ([]float64, error)) (*cachedCollector, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &cachedCollector{
		cfg: cfg, query: query, gauges: descs,
		up:   prometheus.NewDesc(upName, upHelp, nil, nil),
		last: make([]float64, len(descs)),
	}, nil
}

// Describe implements prometheus.Collector.
func (c *cachedCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.gauges {
		ch <- d
	}
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *cachedCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() || time.Since(c.at) >= c.cfg.CacheFor {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
		vals, err := c.query(ctx)
		cancel()
		c.at = time.Now()
		c.ok = err == nil
		if err != nil {
			c.cfg.Logger.Warn("metrics: database gauges unavailable", slog.Any("error", err))
		} else {
			c.last = vals
		}
	}
	for i, d := range c.gauges {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, c.last[i])
	}
	up := 0.0
	if c.ok {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
}

// NewInboxCollector returns the collector of the inbox's DB-derived gauges:
// rows by status, the age of the oldest claimable and oldest pending rows,
// and the dedup table's size. Register it on the consumer's registry.
func NewInboxCollector(cfg DBCollectorConfig) (prometheus.Collector, error) {
	q := db.New()
	descs := []*prometheus.Desc{
		prometheus.NewDesc("inbox_pending_rows", "Inbox rows pending (waiting to run, including rows backing off).", nil, nil),
		prometheus.NewDesc("inbox_processing_rows", "Inbox rows claimed by a worker.", nil, nil),
		prometheus.NewDesc("inbox_dead_rows", "Inbox rows in the dead letter state.", nil, nil),
		prometheus.NewDesc("inbox_oldest_claimable_age_seconds", "How long the oldest inbox row ready to run (pending and due, or with an expired lease) has waited; rows backing off are ignored. 0 when none.", nil, nil),
		prometheus.NewDesc("inbox_oldest_pending_age_seconds", "Age since receipt of the oldest pending inbox row, backing off or not. 0 when none.", nil, nil),
		prometheus.NewDesc("inbox_dedup_table_rows", "Estimated rows in the inbox table (the dedup window's size), from the planner's statistics.", nil, nil),
		prometheus.NewDesc("inbox_dedup_table_bytes", "Size of the inbox table on disk, indexes and TOAST included.", nil, nil),
	}
	return newCachedCollector(cfg, "inbox_db_stats_up", "1 when the last query for the inbox gauges succeeded, 0 when it failed (the gauges then hold their last known values).",
		descs, func(ctx context.Context) ([]float64, error) {
			g, err := q.InboxGauges(ctx, cfg.Pool)
			if err != nil {
				return nil, err
			}
			return []float64{float64(g.Pending), float64(g.Processing), float64(g.Dead),
				g.OldestClaimableSeconds, g.OldestPendingSeconds, float64(g.RowsEstimate), float64(g.TableBytes)}, nil
		})
}

// NewOutboxCollector returns the collector of the outbox's DB-derived gauges:
// pending and dead rows, the relay's lag (age of the oldest pending row not
// backing off) and the table's size. Register it on the relay's registry.
func NewOutboxCollector(cfg DBCollectorConfig) (prometheus.Collector, error) {
	q := db.New()
	descs := []*prometheus.Desc{
		prometheus.NewDesc("outbox_pending_rows", "Outbox rows committed and not yet published.", nil, nil),
		prometheus.NewDesc("outbox_dead_rows", "Outbox rows the broker rejected permanently (dead letters).", nil, nil),
		prometheus.NewDesc("outbox_oldest_pending_age_seconds", "Age since commit of the oldest pending outbox row not backing off (the relay's lag). 0 when none.", nil, nil),
		prometheus.NewDesc("outbox_table_bytes", "Size of the outbox table on disk, indexes and TOAST included.", nil, nil),
	}
	return newCachedCollector(cfg, "outbox_db_stats_up", "1 when the last query for the outbox gauges succeeded, 0 when it failed (the gauges then hold their last known values).",
		descs, func(ctx context.Context) ([]float64, error) {
			g, err := q.OutboxGauges(ctx, cfg.Pool)
			if err != nil {
				return nil, err
			}
			return []float64{float64(g.Pending), float64(g.Dead), g.OldestPendingSeconds, float64(g.TableBytes)}, nil
		})
}
