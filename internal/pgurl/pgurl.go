// Package pgurl parses and edits PostgreSQL connection strings, in URL
// (postgres://...) or keyword/value (host=... dbname=...) form.
package pgurl

import (
	"bufio"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DatabaseURLSetting names the commands' database URL setting, its flag and
// environment variable, in their messages.
const DatabaseURLSetting = "--database-url (DATABASE_URL)"

// ErrNoTargetSessionAttrs refuses several hosts without
// target_session_attrs: pgx would connect to the first that answers, a
// standby as well, where pgrelay cannot write.
var ErrNoTargetSessionAttrs = errors.New("several hosts need target_session_attrs=read-write (or primary), " +
	"so that pgrelay, which writes, connects only to the server that takes writes, never to a standby")

// DefaultConnectTimeout is each host's connect_timeout when several are
// named and the connection string sets none: a host that takes the TCP
// handshake and never answers (a frozen server) would otherwise hold each
// connection attempt until its caller's deadline, and the next host would
// never be tried.
const DefaultConnectTimeout = 3 * time.Second

// Parse is pgxpool.ParseConfig for pgrelay's connections: several hosts
// (postgres://a,b/db or host=a,b) are tried in turn at every connection,
// so after a failover new connections find the new primary. They need
// target_session_attrs=read-write or primary (ErrNoTargetSessionAttrs), and
// get DefaultConnectTimeout unless connect_timeout is set.
func Parse(s string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(s)
	if err != nil {
		return nil, err
	}
	cc := cfg.ConnConfig
	several := false
	for _, f := range cc.Fallbacks {
		// Fallbacks also hold the same host without TLS (sslmode=prefer).
		several = several || f.Host != cc.Host || f.Port != cc.Port
	}
	if !several {
		return cfg, nil
	}
	if cc.ValidateConnect == nil {
		return nil, ErrNoTargetSessionAttrs
	}
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = DefaultConnectTimeout
	}
	return cfg, nil
}

// WithDatabase returns base pointing at database name instead.
func WithDatabase(base, name string) string {
	scheme, user, hosts, _, query, ok := split(base)
	if !ok {
		// A keyword/value connection string: a later keyword wins.
		return base + " dbname=" + name
	}
	return scheme + user + hosts + "/" + url.PathEscape(name) + query
}

// Redact returns u without its password, for error messages and logs.
func Redact(u string) string {
	scheme, user, hosts, path, query, ok := split(u)
	if !ok {
		return u
	}
	if name, _, _ := strings.Cut(user, ":"); name != user {
		user = name + "@"
	}
	return scheme + user + hosts + path + query
}

// split cuts a postgres:// or postgresql:// URL as libpq (and pgx) read it,
// not as RFC 3986 does, so that several hosts (a:1,b:2 or [::1]:1,[::2]:2)
// pass: the scheme with its "//", the user information with its "@" (empty
// without one), the hosts, the path with its "/" and the query with its "?".
// ok is false for a keyword/value string.
func split(s string) (scheme, user, hosts, path, query string, ok bool) {
	rest, ok := strings.CutPrefix(s, "postgresql://")
	if !ok {
		rest, ok = strings.CutPrefix(s, "postgres://")
	}
	if !ok {
		return "", "", "", "", "", false
	}
	scheme = s[:len(s)-len(rest)]
	// As in libpq, only a "/" ends the search for the user information's "@".
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		user, rest = rest[:i+1], rest[i+1:]
	}
	i := strings.IndexAny(rest, "/?")
	if i < 0 {
		return scheme, user, rest, "", "", true
	}
	hosts, rest = rest[:i], rest[i:]
	if j := strings.IndexByte(rest, '?'); j >= 0 {
		return scheme, user, hosts, rest[:j], rest[j:], true
	}
	return scheme, user, hosts, rest, "", true
}

var databaseName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$`)

// ValidName reports whether name can name one of a relay's databases: 1-63
// of [A-Za-z0-9_.-], not starting with '.' or '-'.
func ValidName(name string) bool { return databaseName.MatchString(name) }

// Named is a database URL and its name, read from From ("SETTING FILE:LINE").
type Named struct{ Name, URL, From string }

// ReadNamed reads a file naming databases, a line "name=postgres://..."
// each (blank lines and lines starting with # skipped); errors name setting.
func ReadNamed(path, setting string) ([]Named, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", setting, err)
	}
	defer f.Close()
	var list []Named
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		at := fmt.Sprintf("%s %s:%d", setting, path, n)
		name, u, ok := strings.Cut(line, "=")
		name, u = strings.TrimSpace(name), strings.TrimSpace(u)
		switch {
		case !ok || u == "":
			return nil, fmt.Errorf("%s: want name=postgres://..., got %q", at, line)
		case !ValidName(name):
			return nil, fmt.Errorf("%s: name %q must be 1-63 of [A-Za-z0-9_.-], not starting with '.' or '-'", at, name)
		}
		if _, err := Parse(u); err != nil {
			return nil, fmt.Errorf("%s: database %s: %w", at, name, err)
		}
		list = append(list, Named{Name: name, URL: u, From: at})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", setting, err)
	}
	return list, nil
}

// DatabaseFlag is the flag of the operator commands naming the database to
// act on among several.
const DatabaseFlag = "--database"

// Databases lists the databases an operator command may act on, in order;
// an error when the settings naming them are wrong. None given is an error
// naming the settings.
type Databases func() ([]Named, error)

// One is the Databases of a binary serving the database at *url alone
// (read when called), named by its database name.
func One(url *string) Databases {
	return func() ([]Named, error) {
		if *url == "" {
			return nil, errors.New(DatabaseURLSetting + " is required")
		}
		name := ""
		if cfg, err := Parse(*url); err == nil {
			name = cfg.ConnConfig.Database
		}
		return []Named{{Name: name, URL: *url, From: DatabaseURLSetting}}, nil
	}
}

// Pick returns the database of list named name; "" picks the only one. With
// several and none named it refuses, naming DatabaseFlag: an operation must
// not act on one of them by its place in the settings.
func Pick(list []Named, name string) (Named, error) {
	names := make([]string, len(list))
	for i, n := range list {
		if name != "" && n.Name == name {
			return n, nil
		}
		names[i] = n.Name
	}
	switch {
	case name != "":
		return Named{}, fmt.Errorf("%s %s: no such database (given: %s)", DatabaseFlag, name, strings.Join(names, ", "))
	case len(list) == 1:
		return list[0], nil
	case len(list) == 0:
		return Named{}, errors.New("no database given")
	}
	return Named{}, fmt.Errorf("%d databases are given (%s): name the one to act on with %s", len(list), strings.Join(names, ", "), DatabaseFlag)
}
