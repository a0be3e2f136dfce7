package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The observer times each event's ledger credit in the end-to-end runs.
const (
	// observerPoll polls the ledger (every observePoll at an offered load)
	// and takes the poll that first sees a credit as its time.
	observerPoll = "poll"
	// observerCommitTS takes the commit timestamp of the transaction that
	// inserted the credit (pg_xact_commit_timestamp of the ledger row's
	// xmin; needs track_commit_timestamp = on), read once after the run, and
	// polls only every throughputPoll to know when every credit is in.
	observerCommitTS = "commit-ts"
	// observerAuto picks commit-ts when the server has
	// track_commit_timestamp = on and runs on this machine, poll otherwise.
	observerAuto = "auto"
)

// observerFor returns the observer of pipelines on dbs' server.
func (b *bench) observerFor(dbs *databases) (string, error) {
	switch b.cfg.Observer {
	case observerPoll:
		return observerPoll, nil
	case observerCommitTS:
		if !dbs.commitTS {
			return "", fmt.Errorf("-observer %s needs track_commit_timestamp = on on the server", observerCommitTS)
		}
		return observerCommitTS, nil
	}
	// The latencies mix the server's clock (the credit's commit timestamp)
	// with this machine's (the producer's commit): automatically only when
	// they are one clock.
	if dbs.commitTS && dbs.postmaster != 0 {
		return observerCommitTS, nil
	}
	return observerPoll, nil
}

// describeObserver says, for the results, which observer the pipelines on
// dbs' server use and why.
func (b *bench) describeObserver(dbs *databases) string {
	o, err := b.observerFor(dbs)
	if err != nil {
		return err.Error()
	}
	ts := "track_commit_timestamp off"
	if dbs.commitTS {
		ts = "track_commit_timestamp on"
		if dbs.postmaster == 0 {
			ts += ", server not on this machine"
		}
	}
	if o == observerCommitTS {
		return fmt.Sprintf("commit-ts (%s): credit time = its transaction's commit timestamp; completion polled every %s", ts, throughputPoll)
	}
	return fmt.Sprintf("poll (%s): credit time = the first ledger poll that sees it, every %s at offered loads, %s flat out", ts, observePoll, throughputPoll)
}

// creditCommitTimes reads the commit timestamps of a run's credits. The
// ledger's rows are only inserted, so a row's xmin is the consumer's
// transaction that credited it.
const creditCommitTimes = `SELECT event_id, pg_xact_commit_timestamp(xmin) FROM ledger_entries WHERE starts_with(event_id, $1)`

// commitTimes replaces, for a run whose credits are all in, the observer's
// sightings with the commit timestamps of the crediting transactions, and
// returns the commit→ledger latencies, sorted, and the last credit's time.
//
// The producer's side stays the client's clock when its commit returned, as
// with the polling observer. Its own commit timestamp would be the exact
// counterpart, but it cannot be read afterwards: the relay's mark updates the
// outbox row, whose xmin then names the relay's transaction, and asking each
// producing transaction for its id (pg_current_xact_id()) would add a
// statement per transaction, as many queries as the poll this observer
// removes, on the producers' path. Both clocks are this machine's (auto
// picks this observer only for a server running here). The commit timestamp
// is taken as the commit record is written, before its WAL flush, while the
// producer's time is after its flush and reply: the figure is the producer's
// acknowledged commit to the credit's commit record, about one flush shorter
// than to the credit becoming visible. A credit whose commit timestamp
// precedes the producer's acknowledgement counts as zero.
func (p *pipeline) commitTimes(ctx context.Context, gen generator, commitAt, seenAt []int64) ([]time.Duration, int64, error) {
	rows, err := p.pool.Query(ctx, creditCommitTimes, gen.prefix)
	if err != nil {
		return nil, 0, fmt.Errorf("credits' commit timestamps: %w", err)
	}
	defer rows.Close()
	var lat []time.Duration
	var last int64
	for rows.Next() {
		var id string
		var ts *time.Time
		if err := rows.Scan(&id, &ts); err != nil {
			return nil, 0, err
		}
		i, err := strconv.Atoi(strings.TrimPrefix(id, gen.prefix))
		if err != nil || i < 0 || i >= len(commitAt) {
			return nil, 0, fmt.Errorf("observer: unexpected event id %q", id)
		}
		if commitAt[i] == 0 {
			continue // not produced: the load's time was up
		}
		if ts == nil {
			return nil, 0, fmt.Errorf("no commit timestamp for the credit of %s (track_commit_timestamp turned off?)", id)
		}
		at := ts.UnixNano()
		seenAt[i] = at
		last = max(last, at)
		lat = append(lat, time.Duration(max(0, at-commitAt[i])))
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	slices.Sort(lat)
	return lat, last, nil
}
