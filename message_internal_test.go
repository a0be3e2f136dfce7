package pgrelay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCausedBy: the outputs of an event record its id as their causation and
// carry its correlation id, or its event id when it starts a chain; headers
// already set are kept, and the inputs are not modified.
func TestCausedBy(t *testing.T) {
	t.Parallel()
	start := Message{EventID: "a"}
	inChain := Message{EventID: "b", Headers: map[string]string{HeaderCorrelationID: "flow-1"}}
	require.Equal(t, "a", start.CorrelationID())
	require.Equal(t, "flow-1", inChain.CorrelationID())
	require.Empty(t, start.CausationID())

	out := Message{Topic: "t", Headers: map[string]string{"x": "1"}}
	got := CausedBy(start, out)
	require.Equal(t, map[string]string{"x": "1", HeaderCausationID: "a", HeaderCorrelationID: "a"}, got[0].Headers)
	require.Equal(t, map[string]string{"x": "1"}, out.Headers, "the input is not modified")
	got = CausedBy(inChain, out, Message{Headers: map[string]string{HeaderCorrelationID: "own"}})
	require.Equal(t, "b", got[0].CausationID())
	require.Equal(t, "flow-1", got[0].CorrelationID())
	require.Equal(t, "own", got[1].CorrelationID(), "an explicit correlation id is kept")
	require.Equal(t, "b", got[1].CausationID())

	// The same through a context.
	require.Equal(t, []Message{out}, causeFromContext(context.Background(), []Message{out}))
	got = causeFromContext(contextWithCause(context.Background(), inChain), []Message{out})
	require.Equal(t, "b", got[0].CausationID())
	require.Equal(t, "flow-1", got[0].CorrelationID())
}

// TestContentTypeStored: the content type is stored among the headers and
// lifted back out.
func TestContentTypeStored(t *testing.T) {
	m := Message{ContentType: "application/x-protobuf", Headers: map[string]string{"a": "b"}}
	stored := m.storedHeaders()
	require.Equal(t, map[string]string{"a": "b", HeaderContentType: "application/x-protobuf"}, stored)
	require.Len(t, m.Headers, 1, "storedHeaders does not change the message")
	back := Message{Headers: stored}
	back.liftContentType()
	require.Equal(t, m, back)
	require.Nil(t, Message{}.storedHeaders())
}
