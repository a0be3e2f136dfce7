package admin

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pgrelay/pgrelay/internal/db"
)

// DedupReport describes what the inbox's deduplication absorbed, from the
// database's own record (inbox_duplicates and inbox_receive_counts): it
// needs no running consumer and survives restarts.
type DedupReport struct {
	// Received and Duplicates are the messages received and the duplicates
	// among them over the last 24 hours.
	Received   int64 `json:"received_24h"`
	Duplicates int64 `json:"duplicates_24h"`
	// HitRate is Duplicates / Received (0 when nothing was received).
	HitRate float64 `json:"hit_rate_24h"`
	// Hourly holds the last 24 hours, oldest first, one entry per hour (the
	// last one is the current hour).
	Hourly []DedupHour `json:"hourly"`
	// Recent are the newest recorded duplicates, newest first.
	Recent []Duplicate `json:"recent"`
	// RecordRows and RecordBytes are the duplicate record's row count and
	// size on disk.
	RecordRows  int64 `json:"record_rows"`
	RecordBytes int64 `json:"record_bytes"`
}

// DedupHour is one hour of receive counts.
type DedupHour struct {
	Hour       time.Time `json:"hour"`
	Received   int64     `json:"received"`
	Duplicates int64     `json:"duplicates"`
}

// Duplicate is one recorded duplicate.
type Duplicate struct {
	EventID   string `json:"event_id"`
	Topic     string `json:"topic"`
	EventType string `json:"event_type"`
	Handler   string `json:"handler"`
	// SeenAt is when the duplicate was refused.
	SeenAt time.Time `json:"seen_at"`
	// OriginalReceivedAt is when the inbox stored the original; nil when
	// the original was stored by the same batch (or by a transaction the
	// receiving statement could not see yet).
	OriginalReceivedAt *time.Time `json:"original_received_at,omitempty"`
	// OriginalAgeSeconds is how old the original was when the duplicate
	// arrived (0 when unknown).
	OriginalAgeSeconds float64 `json:"original_age_seconds"`
}

// Dedup returns the dedup report with at most recent of the newest recorded
// duplicates (0 means 50; capped at Config.MaxRows).
func (s *Service) Dedup(ctx context.Context, recent int) (*DedupReport, error) {
	if recent < 0 {
		return nil, fmt.Errorf("%w: recent must not be negative, got %d", ErrInvalid, recent)
	}
	if recent == 0 {
		recent = 50
	}
	recent = min(recent, s.cfg.MaxRows)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	rep := &DedupReport{Hourly: []DedupHour{}, Recent: []Duplicate{}}
	hours, err := s.q.ConsoleDedupHourly(ctx, s.cfg.Pool, 24)
	if err != nil {
		return nil, fmt.Errorf("admin: dedup report: hourly counts: %w", err)
	}
	now, err := s.q.AdminNow(ctx, s.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("admin: dedup report: %w", err)
	}
	byHour := make(map[int64]db.ConsoleDedupHourlyRow, len(hours))
	for _, h := range hours {
		byHour[h.Hour.Unix()] = h
	}
	current := now.Truncate(time.Hour)
	for i := 23; i >= 0; i-- {
		at := current.Add(-time.Duration(i) * time.Hour)
		h := byHour[at.Unix()]
		rep.Hourly = append(rep.Hourly, DedupHour{Hour: at, Received: h.Received, Duplicates: h.Duplicates})
		rep.Received += h.Received
		rep.Duplicates += h.Duplicates
	}
	if rep.Received > 0 {
		rep.HitRate = float64(rep.Duplicates) / float64(rep.Received)
	}
	rows, err := s.q.ConsoleRecentDuplicates(ctx, s.cfg.Pool, int32(recent))
	if err != nil {
		return nil, fmt.Errorf("admin: dedup report: recent duplicates: %w", err)
	}
	for _, r := range rows {
		d := Duplicate{EventID: r.EventID, Topic: r.Topic, EventType: r.EventType, Handler: r.Handler,
			SeenAt: r.SeenAt, OriginalReceivedAt: r.OriginalReceivedAt}
		if r.OriginalReceivedAt != nil {
			d.OriginalAgeSeconds = max(0, r.SeenAt.Sub(*r.OriginalReceivedAt).Seconds())
		}
		rep.Recent = append(rep.Recent, d)
	}
	size, err := s.q.ConsoleDuplicateRecordSize(ctx, s.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("admin: dedup report: record size: %w", err)
	}
	rep.RecordRows, rep.RecordBytes = size.RowCount, size.TableBytes
	return rep, nil
}

// ResetDedupStats empties the duplicate record and the receive counts (the
// hit rate starts again from zero) and records who did it, and why, in the
// replay audit table (action reset_dedup_stats, event id "*"), in one
// statement. It returns the audit row's id.
func (s *Service) ResetDedupStats(ctx context.Context, actor, reason string) (int64, error) {
	if err := validateActor(actor, reason, false); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	row, err := s.q.ConsoleResetDedupStats(ctx, s.cfg.Pool, db.ConsoleResetDedupStatsParams{Actor: actor, Reason: reason})
	if err != nil {
		return 0, fmt.Errorf("admin: reset dedup statistics: %w", err)
	}
	s.cfg.Logger.Info("dedup statistics reset")
	return row.ID, nil
}

// InboxKey is one inbox event as the console lists it.
type InboxKey struct {
	Handler    string     `json:"handler"`
	EventID    string     `json:"event_id"`
	Status     string     `json:"status"`
	Attempts   int32      `json:"attempts"`
	Topic      string     `json:"topic"`
	EventType  string     `json:"event_type"`
	ReceivedAt time.Time  `json:"received_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	LastError  string     `json:"last_error,omitempty"`
}

// InboxKeys returns recent inbox events (those not processed first, then the
// most recently processed), or with search those whose event id contains it.
// limit 0 means 100; it is capped at Config.MaxRows.
func (s *Service) InboxKeys(ctx context.Context, search string, limit int) ([]InboxKey, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: limit must not be negative, got %d", ErrInvalid, limit)
	}
	if limit == 0 {
		limit = 100
	}
	limit = min(limit, s.cfg.MaxRows)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	rows, err := s.q.ConsoleInboxKeys(ctx, s.cfg.Pool, db.ConsoleInboxKeysParams{Search: search, MaxRows: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("admin: list inbox keys: %w", err)
	}
	out := make([]InboxKey, 0, len(rows))
	for _, r := range rows {
		out = append(out, InboxKey{Handler: r.Handler, EventID: r.EventID, Status: r.Status, Attempts: r.Attempts, Topic: r.Topic,
			EventType: r.EventType, ReceivedAt: r.ReceivedAt, FinishedAt: r.FinishedAt, LastError: deref(r.LastError)})
	}
	return out, nil
}

// Partition is one relay partition with its lease and backlog.
type Partition struct {
	Partition int32  `json:"partition"`
	Owner     string `json:"owner"`
	Epoch     int64  `json:"epoch"`
	Held      bool   `json:"held"`
	// LeaseUntil is when the owner's lease expires (in the past when the
	// partition is free); nil when it was never held.
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
	Pending    int64      `json:"pending"`
	Dead       int64      `json:"dead"`
	LagSeconds float64    `json:"lag_seconds"`
}

// RelayNode is one relay known by its heartbeat.
type RelayNode struct {
	NodeID     string    `json:"node_id"`
	LastSeen   time.Time `json:"last_seen"`
	Alive      bool      `json:"alive"`
	Partitions int32     `json:"partitions"`
}

// OutboxOverview is the relays' view of the outbox.
type OutboxOverview struct {
	Partitions []Partition `json:"partitions"`
	Relays     []RelayNode `json:"relays"`
}

// RelayAliveTTL is how recent a relay's heartbeat must be for it to count as
// alive in OutboxOverview.
const RelayAliveTTL = 30 * time.Second

// Outbox returns every relay partition (owner, epoch, pending, dead, lag) and
// the relays by heartbeat.
func (s *Service) Outbox(ctx context.Context) (*OutboxOverview, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	parts, err := s.q.ConsolePartitions(ctx, s.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("admin: outbox partitions: %w", err)
	}
	nodes, err := s.q.ConsoleRelayNodes(ctx, s.cfg.Pool, RelayAliveTTL.Seconds())
	if err != nil {
		return nil, fmt.Errorf("admin: relays: %w", err)
	}
	ov := &OutboxOverview{Partitions: make([]Partition, 0, len(parts)), Relays: make([]RelayNode, 0, len(nodes))}
	for _, p := range parts {
		part := Partition{Partition: p.Partition, Owner: p.Owner, Epoch: p.Epoch, Held: p.Held,
			Pending: p.Pending, Dead: p.Dead, LagSeconds: p.LagSeconds}
		if p.LeaseUntil.Unix() != 0 { // the query's stand-in for -infinity
			part.LeaseUntil = &p.LeaseUntil
		}
		ov.Partitions = append(ov.Partitions, part)
	}
	for _, n := range nodes {
		ov.Relays = append(ov.Relays, RelayNode(n))
	}
	return ov, nil
}

// ThroughputMinute is one minute's count of one series.
type ThroughputMinute struct {
	Minute time.Time `json:"minute"`
	Count  int64     `json:"count"`
}

// ThroughputSeries is one series of Throughput: the inbox events a handler
// processed, or (Source outbox) the outbox rows the relays published, one
// entry per minute, oldest first, the last one the current minute.
type ThroughputSeries struct {
	Source  Source             `json:"source"`
	Handler string             `json:"handler,omitempty"`
	Total   int64              `json:"total"`
	Minutes []ThroughputMinute `json:"minutes"`
}

// Throughput returns, per minute over the last minutes minutes (0 means 60;
// at most 1440), what each inbox handler processed and what the relays
// published, from the rows' finished_at and published_at (so only rows still
// kept count: retention may have removed older processed or published rows).
// The outbox series comes first, then the handlers by name; a source with no
// row in the window has no series.
func (s *Service) Throughput(ctx context.Context, minutes int) ([]ThroughputSeries, error) {
	if minutes < 0 || minutes > 1440 {
		return nil, fmt.Errorf("%w: minutes must be between 0 and 1440, got %d", ErrInvalid, minutes)
	}
	if minutes == 0 {
		minutes = 60
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	rows, err := s.q.ConsoleThroughput(ctx, s.cfg.Pool, int32(minutes))
	if err != nil {
		return nil, fmt.Errorf("admin: throughput: %w", err)
	}
	now, err := s.q.AdminNow(ctx, s.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("admin: throughput: %w", err)
	}
	current := now.Truncate(time.Minute)
	first := current.Add(-time.Duration(minutes-1) * time.Minute)
	var out []ThroughputSeries
	index := map[string]int{}
	for _, r := range rows {
		id := r.Source + "\x00" + r.Handler
		i, ok := index[id]
		if !ok {
			ser := ThroughputSeries{Source: Source(r.Source), Handler: r.Handler, Minutes: make([]ThroughputMinute, minutes)}
			for m := range ser.Minutes {
				ser.Minutes[m].Minute = first.Add(time.Duration(m) * time.Minute)
			}
			i = len(out)
			index[id] = i
			out = append(out, ser)
		}
		m := int(r.Minute.Sub(first) / time.Minute)
		if m < 0 || m >= minutes {
			continue // the oldest partial minute
		}
		out[i].Minutes[m].Count += r.N
		out[i].Total += r.N
	}
	slices.SortStableFunc(out, func(a, b ThroughputSeries) int {
		if a.Source != b.Source {
			return cmp.Compare(b.Source, a.Source) // outbox first
		}
		return cmp.Compare(a.Handler, b.Handler)
	})
	return out, nil
}
