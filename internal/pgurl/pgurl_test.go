package pgurl

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u:p@h:5432/other?sslmode=disable", WithDatabase("postgres://u:p@h:5432/postgres?sslmode=disable", "other"))
	require.Equal(t, "postgresql://h/other", WithDatabase("postgresql://h", "other"))
	require.Equal(t, "host=h user=u dbname=postgres dbname=other", WithDatabase("host=h user=u dbname=postgres", "other"))
	// Several hosts (libpq's syntax, not RFC 3986's): the database changes,
	// the hosts and parameters stay, as pgx reads them.
	for _, base := range []string{
		"postgres://u:p@10.0.0.1:5432,10.0.0.2:5433/postgres?target_session_attrs=read-write",
		"postgres://u:p@[::1]:5432,[::2]:5433/postgres?target_session_attrs=read-write",
	} {
		got := WithDatabase(base, "other")
		cfg, err := pgconn.ParseConfig(got)
		require.NoError(t, err, got)
		require.Equal(t, "other", cfg.Database, got)
		hosts := map[string]bool{cfg.Host: true}
		for _, f := range cfg.Fallbacks {
			hosts[f.Host] = true
		}
		require.Len(t, hosts, 2, got)
		require.NotNil(t, cfg.ValidateConnect, got)
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u@h/db", Redact("postgres://u:secret@h/db"))
	require.Equal(t, "postgres://u@a:1,b:2/db?sslmode=disable", Redact("postgres://u:secret@a:1,b:2/db?sslmode=disable"))
	require.Equal(t, "postgresql://u@[::1]:5432,[::2]:5433/db", Redact("postgresql://u:secret@[::1]:5432,[::2]:5433/db"))
	require.Equal(t, "postgres://h/db", Redact("postgres://h/db"))
	require.Equal(t, "host=h", Redact("host=h"))
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"postgres://a,b/db", "postgres://a:1,a:2/db?target_session_attrs=any", "host=a,b dbname=db"} {
		_, err := Parse(s)
		require.ErrorIs(t, err, ErrNoTargetSessionAttrs, s)
	}
	for _, s := range []string{"postgres://a/db", "postgres://a/db?sslmode=prefer", "postgres://a,b/db?target_session_attrs=read-write", "host=a,b target_session_attrs=primary"} {
		_, err := Parse(s)
		require.NoError(t, err, s)
	}
	timeout := func(s string) time.Duration {
		cfg, err := Parse(s)
		require.NoError(t, err, s)
		return cfg.ConnConfig.ConnectTimeout
	}
	require.Equal(t, DefaultConnectTimeout, timeout("postgres://a,b/db?target_session_attrs=read-write"))
	require.Equal(t, time.Second, timeout("postgres://a,b/db?target_session_attrs=read-write&connect_timeout=1"))
	require.Zero(t, timeout("postgres://a/db"))
	_, err := Parse("postgres://a/db?target_session_attrs=nonsense")
	require.ErrorContains(t, err, "unknown target_session_attrs value")
}
