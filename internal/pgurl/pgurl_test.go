package pgurl

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u:p@h:5432/other?sslmode=disable", WithDatabase("postgres://u:p@h:5432/postgres?sslmode=disable", "other"))
	require.Equal(t, "host=h user=u dbname=postgres dbname=other", WithDatabase("host=h user=u dbname=postgres", "other"))
}

func TestRedact(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u@h/db", Redact("postgres://u:secret@h/db"))
	require.Equal(t, "host=h", Redact("host=h"))
}
