package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/pgurl"
	"github.com/pgrelay/pgrelay/relay"
)

// dbNames spells the settings naming relay run's databases, as the options
// table does.
type dbNames struct{ url, file, total string }

func namesOf(opts cli.Options, s *settings) dbNames {
	return dbNames{url: opts.Of(s.urls), file: opts.Of(&s.databasesFile), total: opts.Of(&s.maxConnsTotal)}
}

// errListenOne refuses --listen-url with several databases.
func errListenOne() error {
	return errors.New("--listen-url (DB_LISTEN_URL) names one database's direct connection: it cannot serve several databases")
}

// urlList is --database-url: repeatable for relay run; the last one given is
// also databaseURL, the one URL of the commands that take one. DATABASE_URL
// defaults it; a flag given replaces that default.
type urlList struct {
	last *string
	all  *[]string
	set  bool // a flag was given
}

func newURLList(last *string, all *[]string) *urlList { return &urlList{last: last, all: all} }

// Default is the environment variable's value (cli.Bind): replaced by the
// first flag given.
func (u *urlList) Default(v string) {
	if v != "" {
		*u.last, *u.all = v, []string{v}
	}
}

func (u *urlList) Set(v string) error {
	if !u.set {
		*u.all, u.set = nil, true
	}
	*u.all = append(*u.all, v)
	*u.last = v
	return nil
}
func (u *urlList) String() string { return *u.last }
func (u *urlList) Type() string   { return "url" }

// dbEntry is one database relay run serves: its name, URL, and the setting
// it comes from (a file's line: "FILE:LINE").
type dbEntry struct{ name, url, from string }

// databaseList is relay run's databases: the --database-url URLs, each named
// by its database name, and the --databases-file lines.
func databaseList(n dbNames, urls []string, file string) ([]dbEntry, error) {
	var list []dbEntry
	for _, u := range urls {
		if u == "" {
			continue
		}
		cfg, err := pgurl.Parse(u)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.url, err)
		}
		name := cfg.ConnConfig.Database // as relay.Config.Pool is named
		if !relay.ValidDatabaseName(name) {
			name = "default"
		}
		list = append(list, dbEntry{name: name, url: u, from: n.url})
	}
	if file != "" {
		fromFile, err := readDatabasesFile(n, file)
		if err != nil {
			return nil, err
		}
		list = append(list, fromFile...)
	}
	if len(list) == 0 {
		return nil, errors.New(n.url + " or " + n.file + " is required")
	}
	names, urls2 := map[string]dbEntry{}, map[string]dbEntry{}
	for _, e := range list {
		if prev, ok := urls2[e.url]; ok {
			return nil, fmt.Errorf("one URL is given twice: as %s (%s) and as %s (%s)", prev.name, prev.from, e.name, e.from)
		}
		if prev, ok := names[e.name]; ok {
			return nil, fmt.Errorf("database %s is named twice: by %s and by %s (a URL given by %s is named by its database name; name them in %s)",
				e.name, prev.from, e.from, n.url, n.file)
		}
		names[e.name], urls2[e.url] = e, e
	}
	return list, nil
}

// readDatabasesFile reads --databases-file.
func readDatabasesFile(n dbNames, path string) ([]dbEntry, error) {
	named, err := pgurl.ReadNamed(path, n.file)
	list := make([]dbEntry, len(named))
	for i, e := range named {
		list[i] = dbEntry{name: e.Name, url: e.URL, from: e.From}
	}
	return list, err
}

// openDB is a database's pool, opened from its URL.
type openDB struct {
	dbEntry
	pool *pgxpool.Pool
}

// openDatabases opens the pools of list, keeping those of open whose name
// and URL are unchanged; it checks that all of them together stay within
// maxTotal connections. It returns the databases now, and the pools it
// opened (closed by the caller should the list not be used).
func openDatabases(ctx context.Context, n dbNames, list []dbEntry, open map[string]openDB, dbs cli.DBSettings, maxTotal int) (now map[string]openDB, opened []*pgxpool.Pool, err error) {
	defer func() {
		if err != nil {
			for _, p := range opened {
				p.Close()
			}
			opened = nil
		}
	}()
	now = map[string]openDB{}
	total := 0
	for _, e := range list {
		if o, ok := open[e.name]; ok && o.url == e.url {
			now[e.name] = o
			total += int(o.pool.Config().MaxConns) + 2
			continue
		}
		// Enough connections for one relay owning every partition of a
		// default install (16): its partition workers read and mark at
		// once. pgxpool opens them only as needed.
		pool, err := cli.OpenPool(ctx, e.url, dbs, int32(relay.PoolConns(defaultPartitions)))
		if err != nil {
			return nil, opened, fmt.Errorf("database %s (%s): %w", e.name, e.from, err)
		}
		opened = append(opened, pool)
		if err := dbs.Reach(ctx, pool); err != nil {
			return nil, opened, fmt.Errorf("database %s (%s): %w", e.name, e.from, err)
		}
		now[e.name] = openDB{dbEntry: e, pool: pool}
		// The LISTEN and lock connections are dialled beside the pool.
		total += int(pool.Config().MaxConns) + 2
	}
	if total > maxTotal {
		return nil, opened, fmt.Errorf("%d databases need up to %d connections (each pool's pool_max_conns, at least %d, plus its LISTEN and lock connections), over %s %d: raise it, or spread the databases over more relays",
			len(list), total, relay.PoolConns(defaultPartitions), n.total, maxTotal)
	}
	return now, opened, nil
}

// relayDatabases is the list as relay.Config.Databases, in list's order.
func relayDatabases(list []dbEntry, open map[string]openDB, listen *pgx.ConnConfig) []relay.Database {
	out := make([]relay.Database, 0, len(list))
	for _, e := range list {
		out = append(out, relay.Database{Name: e.name, Pool: open[e.name].pool, ListenConnConfig: listen})
	}
	return out
}

// reload re-reads the databases (on SIGHUP): the relay starts the added
// ones and releases the removed ones; a database that fails is logged and
// skipped. It returns the pools open now.
func reload(ctx context.Context, r *relay.Relay, s settings, open map[string]openDB, listen *pgx.ConnConfig, log *slog.Logger) map[string]openDB {
	list, err := databaseList(s.names, s.databaseURLs, s.databasesFile)
	if err == nil && s.db.ListenURL != "" && len(list) > 1 {
		err = errListenOne()
	}
	var now map[string]openDB
	if err == nil {
		now, _, err = openDatabases(ctx, s.names, list, open, s.db, s.maxConnsTotal)
	}
	if err != nil {
		log.Error("reload: the databases are unchanged", slog.Any("error", err))
		return open
	}
	if err := r.SetDatabases(ctx, relayDatabases(list, now, listen)); err != nil {
		log.Error("reload: databases skipped", slog.Any("error", err))
	}
	served := map[string]bool{}
	for _, n := range r.Databases() {
		served[n] = true
	}
	for name, o := range open {
		if cur, ok := now[name]; !ok || cur.pool != o.pool || !served[name] {
			o.pool.Close()
		}
	}
	for name, o := range now {
		if !served[name] {
			if _, was := open[name]; !was || open[name].pool != o.pool {
				o.pool.Close()
			}
			delete(now, name)
		}
	}
	log.Info("reload: databases served", slog.Any("databases", r.Databases()))
	return now
}
