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

// TestMapKeepsJoinsAndPrefixes: renaming reaches every FieldError of a joined
// list, also behind a wrapping prefix, and keeps the rest of the text.
func TestMapKeepsJoinsAndPrefixes(t *testing.T) {
	t.Parallel()
	plain := errors.New("not a setting")
	err := fmt.Errorf("consumer: %w", errors.Join(
		Errorf("inbox", "Config", "BatchSize", "{} must be between 1 and %d, got %d", 1000, -1),
		plain,
		Errorf("", "NATSSubscriberConfig", "MaxAckPending", "{} %d must be positive", -10),
	))
	public := Map(err, func(fe *FieldError) error {
		return fe.Renamed("ConsumerConfig", func(f string) string {
			switch f {
			case "BatchSize":
				return "WorkerBatchSize"
			case "MaxAckPending":
				return "10 × {FetchBatchSize}"
			}
			return f
		})
	})
	require.EqualError(t, public, "consumer: inbox: ConsumerConfig.WorkerBatchSize must be between 1 and 1000, got -1\n"+
		"not a setting\n10 × ConsumerConfig.FetchBatchSize -10 must be positive")
	require.ErrorIs(t, public, plain)

	flags := map[string]string{"WorkerBatchSize": "--worker-batch-size (W)", "FetchBatchSize": "--batch-size (B)"}
	named := Name(public, func(f string) string { return flags[f] })
	require.EqualError(t, named, "consumer: --worker-batch-size (W) must be between 1 and 1000, got -1\n"+
		"not a setting\n10 × --batch-size (B) -10 must be positive")
	var fe *FieldError
	require.ErrorAs(t, named, &fe)
	require.Equal(t, "WorkerBatchSize", fe.Field)

	require.Same(t, plain, Map(plain, func(*FieldError) error { return nil }), "an error without a FieldError is kept")
	require.NoError(t, Map(nil, func(*FieldError) error { return plain }))
}

// TestNameKeepsUnknownFields: a field the command has no flag for keeps its
// struct's spelling.
func TestNameKeepsUnknownFields(t *testing.T) {
	t.Parallel()
	err := Name(Errorf("relay", "Config", "QueryTimeout", "{} must be positive, got %s", "0s"),
		func(string) string { return "" })
	require.EqualError(t, err, "Config.QueryTimeout must be positive, got 0s")
}
