-- +goose Up
-- The producer's W3C trace context, captured when the event is enqueued: the
-- relay publishes it as the broker headers traceparent and tracestate, and
-- the consumer runs the handler under a span of the same trace
-- (docs/tracing.md). NULL (or empty) means none. A plain-SQL producer sets
-- them from its own tracing library's current span.
--
-- Nullable columns without a default: adding them rewrites nothing. The
-- length check is NOT VALID: every row stored before holds NULL, so there is
-- nothing to check, and validating would scan the whole table under lock.
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
ALTER TABLE outbox ADD COLUMN traceparent text, ADD COLUMN tracestate text;
ALTER TABLE outbox ADD CONSTRAINT outbox_trace_context_length
    CHECK (octet_length(traceparent) <= 255 AND octet_length(tracestate) <= 4096) NOT VALID;

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
ALTER TABLE outbox DROP CONSTRAINT outbox_trace_context_length;
ALTER TABLE outbox DROP COLUMN traceparent, DROP COLUMN tracestate;
