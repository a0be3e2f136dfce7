package otelenv

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestNoVariablesNoProvider: with no OTEL_* variable set, or tracing turned
// off, there is no provider (the commands then record nothing).
func TestNoVariablesNoProvider(t *testing.T) {
	ctx := context.Background()
	for _, vars := range []map[string]string{
		{},
		{"OTEL_SERVICE_NAME": "x"},
		{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
		{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"},
	} {
		p, err := newProvider(ctx, "svc", env(vars), nil)
		require.NoError(t, err, "%v", vars)
		require.Nil(t, p, "%v", vars)
	}
}

// TestConsoleExporter: OTEL_TRACES_EXPORTER=console writes the spans, with
// OTEL_SERVICE_NAME as the service, when the provider is shut down; the
// command's name is the default service.
func TestConsoleExporter(t *testing.T) {
	ctx := context.Background()
	for service, vars := range map[string]map[string]string{
		"billing":       {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "billing"},
		"pgrelay-relay": {"OTEL_TRACES_EXPORTER": "console"},
	} {
		var out bytes.Buffer
		p, err := newProvider(ctx, "pgrelay-relay", env(vars), &out)
		require.NoError(t, err)
		require.NotNil(t, p)
		_, span := p.Tracer("t").Start(ctx, "send orders")
		span.End()
		require.NoError(t, p.Shutdown(ctx))
		require.Contains(t, out.String(), `"send orders"`)
		require.Contains(t, out.String(), `"`+service+`"`)
	}
}

// TestBadVariablesNameThemselves: an exporter or protocol the commands do
// not know is refused, naming the variable.
func TestBadVariablesNameThemselves(t *testing.T) {
	ctx := context.Background()
	for want, vars := range map[string]map[string]string{
		"OTEL_TRACES_EXPORTER":               {"OTEL_TRACES_EXPORTER": "otlp,zipkin"},
		"OTEL_EXPORTER_OTLP_PROTOCOL":        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"},
	} {
		_, err := newProvider(ctx, "svc", env(vars), nil)
		require.ErrorContains(t, err, want)
	}
	p, err := newProvider(ctx, "svc", env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}), nil)
	require.NoError(t, err)
	require.NotNil(t, p)
	require.NoError(t, p.TracerProvider.Shutdown(ctx))
}
