package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidateEnvNamesTheSetting(t *testing.T) {
	t.Setenv("PGRELAY_TEST_BATCH", "ten")
	t.Setenv("PGRELAY_TEST_LEASE", "30s")
	err := ValidateEnv(map[string]string{"PGRELAY_TEST_BATCH": "int", "PGRELAY_TEST_LEASE": "duration"})
	require.ErrorContains(t, err, "PGRELAY_TEST_BATCH")

	t.Setenv("PGRELAY_TEST_BATCH", "10")
	require.NoError(t, ValidateEnv(map[string]string{"PGRELAY_TEST_BATCH": "int", "PGRELAY_TEST_LEASE": "duration"}))
	require.Equal(t, 10, EnvInt("PGRELAY_TEST_BATCH", 1))
}

func TestNewLoggerRejectsBadSettings(t *testing.T) {
	t.Parallel()
	_, err := NewLogger("loud", "json")
	require.ErrorContains(t, err, "LOG_LEVEL")
	_, err = NewLogger("info", "xml")
	require.ErrorContains(t, err, "LOG_FORMAT")
	l, err := NewLogger("debug", "console")
	require.NoError(t, err)
	require.NotNil(t, l)
}
