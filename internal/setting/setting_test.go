package setting

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFieldErrorSpellsItsFields(t *testing.T) {
	t.Parallel()
	err := Errorf("inbox", "Config", "HandlerTimeout", "{} (%s) must be shorter than {Lease} (%s)", "10s", "1s")
	require.EqualError(t, err, "inbox: Config.HandlerTimeout (10s) must be shorter than Config.Lease (1s)")

	wrapped := Errorf("", "Config", "URL", "cannot connect at {} %s: %w", "nats://x", io.EOF)
	require.ErrorIs(t, wrapped, io.EOF)
	require.EqualError(t, wrapped, "cannot connect at Config.URL nats://x: EOF")
}

// TestNameKeepsJoinsAndPrefixes: naming reaches every FieldError of the
// struct named in a joined list, also behind a wrapping prefix, and keeps
// the rest of the text; a field may be named by an expression.
func TestNameKeepsJoinsAndPrefixes(t *testing.T) {
	t.Parallel()
	plain := errors.New("not a setting")
	err := fmt.Errorf("consumer: %w", errors.Join(
		Errorf("", "consumer.Config", "FetchBatchSize", "{} must be between 1 and %d, got %d", 10000, -1),
		plain,
		Errorf("", "nats.Config", "MaxAckPending", "{} %d must be positive", -10),
	))
	flags := map[string]string{"FetchBatchSize": "--batch-size (B)", "MaxAckPending": "10 × --batch-size (B)"}
	named := Name(err, "consumer.Config", func(f string) string { return flags[f] })
	require.EqualError(t, named, "consumer: --batch-size (B) must be between 1 and 10000, got -1\n"+
		"not a setting\nnats.Config.MaxAckPending -10 must be positive")
	require.ErrorIs(t, named, plain)
	named = Name(named, "", func(f string) string { return flags[f] })
	require.EqualError(t, named, "consumer: --batch-size (B) must be between 1 and 10000, got -1\n"+
		"not a setting\n10 × --batch-size (B) -10 must be positive")
	var fe *FieldError
	require.ErrorAs(t, named, &fe)
	require.Equal(t, "FetchBatchSize", fe.Field)

	require.Same(t, plain, Name(plain, "", func(string) string { return "x" }), "an error without a FieldError is kept")
	require.NoError(t, Name(nil, "", func(string) string { return "x" }))
}

// TestEachMovesFieldsUnderAPath: a struct's errors re-homed under a field
// of another (InboxConfig's as consumer.Config.Inbox's) spell every field
// they name with the path, and are named by it.
func TestEachMovesFieldsUnderAPath(t *testing.T) {
	t.Parallel()
	err := errors.Join(Errorf("inbox", "InboxConfig", "HandlerTimeout", "{} (%s) must be shorter than {Lease} (%s)", "10s", "1s"))
	Each(err, func(fe *FieldError) { fe.Pkg, fe.Struct, fe.Path = "", "consumer.Config", "Inbox." })
	require.EqualError(t, err, "consumer.Config.Inbox.HandlerTimeout (10s) must be shorter than consumer.Config.Inbox.Lease (1s)")
	flags := map[string]string{"Inbox.Lease": "--lease (L)"}
	require.EqualError(t, Name(err, "consumer.Config", func(f string) string { return flags[f] }),
		"consumer.Config.Inbox.HandlerTimeout (10s) must be shorter than --lease (L) (1s)")
}

// TestNameKeepsUnknownFields: a field the command has no flag for keeps its
// struct's spelling.
func TestNameKeepsUnknownFields(t *testing.T) {
	t.Parallel()
	err := Name(Errorf("relay", "Config", "QueryTimeout", "{} must be positive, got %s", "0s"),
		"Config", func(string) string { return "" })
	require.EqualError(t, err, "Config.QueryTimeout must be positive, got 0s")
}
