package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/internal/zapslog"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) line(msg string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	for l := range strings.Lines(b.buf.String()) {
		if strings.Contains(l, `"msg":"`+msg+`"`) {
			return l
		}
	}
	return ""
}

// jsonKeys returns the keys of a JSON object, in order, duplicates kept.
func jsonKeys(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	tok, err := dec.Token()
	require.NoError(t, err)
	require.Equal(t, json.Delim('{'), tok, line)
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		require.NoError(t, err, line)
		keys = append(keys, k.(string))
		var v json.RawMessage
		require.NoError(t, dec.Decode(&v), line)
	}
	return keys
}

// TestStartupLogLineHasEachKeyOnce: the relay's start-up line, in both
// capture modes, is a JSON object whose keys appear once each.
func TestStartupLogLineHasEachKeyOnce(t *testing.T) {
	b := setup(t)
	for _, capture := range []string{CaptureTable, CaptureWAL} {
		t.Run(capture, func(t *testing.T) {
			var sink lockedBuffer
			cfg := b.testConfig(t, b.publisher(t), nil)
			cfg.Capture = capture
			cfg.log = zapslog.New(zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(&sink), zapcore.InfoLevel))) // the commands' JSON logger
			r, err := newEngine(cfg)
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = r.run(ctx) }()
			defer func() { cancel(); <-done }()
			require.Eventually(t, func() bool { return sink.line("relay starting") != "" }, 10*time.Second, 10*time.Millisecond)
			line := sink.line("relay starting")
			seen := map[string]bool{}
			for _, k := range jsonKeys(t, line) {
				require.False(t, seen[k], fmt.Sprintf("key %q twice in %s", k, line))
				seen[k] = true
			}
			require.True(t, seen["batch_size"], line)
		})
	}
}
