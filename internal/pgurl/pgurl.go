// Package pgurl edits PostgreSQL connection strings, in URL
// (postgres://...) or keyword/value (host=... dbname=...) form.
package pgurl

import "net/url"

// WithDatabase returns base pointing at database name instead.
func WithDatabase(base, name string) string {
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" {
		// A keyword/value connection string: a later keyword wins.
		return base + " dbname=" + name
	}
	u.Path = "/" + name
	return u.String()
}

// Redact returns u without its password, for error messages and logs.
func Redact(u string) string {
	if p, err := url.Parse(u); err == nil && p.User != nil {
		p.User = url.User(p.User.Username())
		return p.String()
	}
	return u
}
