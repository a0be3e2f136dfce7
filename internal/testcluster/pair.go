package testcluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pair is a primary and a hot standby streaming its WAL (physical
// replication from a pg_basebackup), for failover tests: stop the standby's
// WAL receipt, crash the primary, promote the standby.
type Pair struct {
	Primary, Standby *Cluster
}

// StartPair starts a primary with conf appended to its postgresql.conf (and
// its postgres database migrated, as Start does), then a standby cloned from
// it with pg_basebackup, streaming and caught up. Both are stopped when the
// test ends.
func StartPair(tb testing.TB, conf string) *Pair {
	tb.Helper()
	p := &Pair{Primary: Start(tb, conf)}
	p.Standby = StartStandby(tb, p.Primary, "standby")
	return p
}

// StartStandby starts a hot standby of primary, cloned from it with
// pg_basebackup, streaming and caught up; name is its cluster_name, the
// application_name its WAL receiver shows in the primary's
// pg_stat_replication. It is stopped when the test ends.
func StartStandby(tb testing.TB, primary *Cluster, name string) *Cluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := prepare()
	if s != nil {
		tb.Cleanup(func() {
			s.Stop()
			if !tb.Failed() {
				s.removeFiles()
			} else {
				tb.Logf("standby kept in %s", s.root)
			}
		})
	}
	if err != nil {
		tb.Fatal(err)
	}
	// -R: standby.signal and a primary_conninfo naming the primary.
	if out, err := s.run(ctx, "pg_basebackup", "-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres", primary.Port),
		"-D", s.dir, "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		tb.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	if err := s.appendConf(fmt.Sprintf("port = %d\nhot_standby = on\ncluster_name = '%s'", s.Port, name)); err != nil {
		tb.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := (&Pair{Primary: primary, Standby: s}).CatchUp(ctx); err != nil {
		tb.Fatal(err)
	}
	return s
}

// URL names both servers' postgres database, the standby first, with
// target_session_attrs=read-write: a connection goes to whichever of them
// takes writes.
func (p *Pair) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
		p.Standby.Port, p.Primary.Port)
}

// CatchUp waits until the standby has replayed all the WAL the primary had
// written when it was called.
func (p *Pair) CatchUp(ctx context.Context) error {
	var lsn string
	if err := query(ctx, p.Primary, "SELECT pg_catalog.pg_current_wal_lsn()::text", &lsn); err != nil {
		return err
	}
	return poll(ctx, p.Standby, "SELECT pg_catalog.pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn)
}

// StopReceiving ends the standby's WAL receipt (an empty primary_conninfo,
// reloaded) and returns once its WAL receiver is gone: what commits on the
// primary from then on is not on the standby. The standby keeps serving
// reads.
func (p *Pair) StopReceiving(ctx context.Context) error {
	if err := query(ctx, p.Standby, "ALTER SYSTEM SET primary_conninfo = ''", nil); err != nil {
		return err
	}
	if err := query(ctx, p.Standby, "SELECT pg_catalog.pg_reload_conf()", nil); err != nil {
		return err
	}
	return poll(ctx, p.Standby, "SELECT NOT EXISTS (SELECT FROM pg_catalog.pg_stat_wal_receiver)")
}

// CrashPrimary stops the primary at once (pg_ctl stop -m immediate): no
// shutdown checkpoint, every connection cut, as in a crash.
func (p *Pair) CrashPrimary(ctx context.Context) error {
	if out, err := p.Primary.run(ctx, "pg_ctl", "stop", "-w", "-t", "60", "-m", "immediate", "-D", p.Primary.dir); err != nil {
		return fmt.Errorf("pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// Promote promotes the standby (pg_ctl promote) and returns once it takes
// writes.
func (p *Pair) Promote(ctx context.Context) error {
	if out, err := p.Standby.run(ctx, "pg_ctl", "promote", "-w", "-t", "60", "-D", p.Standby.dir); err != nil {
		return fmt.Errorf("pg_ctl promote: %w\n%s", err, out)
	}
	return poll(ctx, p.Standby, "SELECT NOT pg_catalog.pg_is_in_recovery()")
}

// query runs sql on c's postgres database, scanning one value into dest
// unless dest is nil.
func query(ctx context.Context, c *Cluster, sql string, dest any, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if dest == nil {
		_, err = conn.Exec(ctx, sql, args...)
	} else {
		err = conn.QueryRow(ctx, sql, args...).Scan(dest)
	}
	if err != nil {
		return fmt.Errorf("%s on port %d: %w", sql, c.Port, err)
	}
	return nil
}

// poll runs the boolean query sql on c every 20ms until it is true or ctx
// ends.
func poll(ctx context.Context, c *Cluster, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		var ok bool
		err := query(ctx, c, sql, &ok, args...)
		if err == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s on port %d: %w (last error: %v)", sql, c.Port, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
