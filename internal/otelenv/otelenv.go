// Package otelenv builds the commands' OpenTelemetry tracer provider from the
// standard OTEL_* environment variables
// (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/).
// With none of them set there is no provider: the commands then record no
// span and export nothing.
package otelenv

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Provider is a tracer provider and how to flush and stop it.
type Provider struct {
	*sdktrace.TracerProvider
}

// Shutdown flushes the spans still buffered and stops the exporters.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.TracerProvider.Shutdown(ctx)
}

// New returns the tracer provider the environment asks for, or nil when it
// asks for none:
//
//   - OTEL_SDK_DISABLED=true: none;
//   - OTEL_TRACES_EXPORTER: a comma-separated list of "otlp", "console"
//     (spans as JSON on stderr) and "none"; unset, it is "otlp" when
//     OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
//     set, and none otherwise;
//   - OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL:
//     "http/protobuf" (the default) or "grpc"; the OTLP exporter reads its
//     other OTEL_EXPORTER_OTLP_* settings (endpoint, headers, timeout, TLS)
//     itself;
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the service
//     (default service.name: service);
//   - OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_* are the SDK's own.
//
// An unknown exporter or protocol is an error naming the variable.
func New(ctx context.Context, service string) (*Provider, error) {
	return newProvider(ctx, service, os.Getenv, os.Stderr)
}

func newProvider(ctx context.Context, service string, getenv func(string) string, console io.Writer) (*Provider, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	names := getenv("OTEL_TRACES_EXPORTER")
	if strings.TrimSpace(names) == "" {
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
		names = "otlp"
	}
	var opts []sdktrace.TracerProviderOption
	for _, name := range strings.Split(names, ",") {
		switch name = strings.TrimSpace(name); name {
		case "none", "":
		case "otlp":
			exp, err := otlpExporter(ctx, getenv)
			if err != nil {
				return nil, err
			}
			opts = append(opts, sdktrace.WithBatcher(exp))
		case "console":
			exp, err := stdouttrace.New(stdouttrace.WithWriter(console))
			if err != nil {
				return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=console: %w", err)
			}
			opts = append(opts, sdktrace.WithBatcher(exp))
		default:
			return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: unknown exporter %q (want otlp, console or none)", name)
		}
	}
	if len(opts) == 0 {
		return nil, nil
	}
	// OTEL_RESOURCE_ATTRIBUTES over the command's name, OTEL_SERVICE_NAME
	// over both.
	res, err := resource.Merge(resource.NewSchemaless(semconv.ServiceName(service)), resource.Environment())
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	if name := strings.TrimSpace(getenv("OTEL_SERVICE_NAME")); name != "" {
		if res, err = resource.Merge(res, resource.NewSchemaless(semconv.ServiceName(name))); err != nil {
			return nil, fmt.Errorf("OTEL_SERVICE_NAME: %w", err)
		}
	}
	opts = append(opts, sdktrace.WithResource(res))
	return &Provider{sdktrace.NewTracerProvider(opts...)}, nil
}

func otlpExporter(ctx context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	name, proto := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		name, proto = "OTEL_EXPORTER_OTLP_PROTOCOL", getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch strings.TrimSpace(proto) {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("%s: unknown protocol %q (want http/protobuf or grpc)", name, proto)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter (OTEL_EXPORTER_OTLP_*): %w", err)
	}
	return exp, nil
}
