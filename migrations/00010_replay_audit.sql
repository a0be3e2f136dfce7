-- +goose Up
-- replay_audit records every operator action on dead letters: each requeue
-- (replay) and each purge, one row per event, with who did it, when and why.
-- Rows are never updated; the table is the answer to "why was this event
-- processed twice?" and "where did that dead letter go?".
CREATE TABLE replay_audit (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                timestamptz NOT NULL DEFAULT now(),
    -- source is the table the event lives in: inbox or outbox.
    source            text        NOT NULL CHECK (source IN ('inbox', 'outbox')),
    -- action is requeue (back to pending, attempts reset) or purge (deleted).
    action            text        NOT NULL CHECK (action IN ('requeue', 'purge')),
    event_id          text        NOT NULL,
    actor             text        NOT NULL CHECK (actor <> ''),
    reason            text        NOT NULL DEFAULT '',
    -- The dead letter as it was before the action.
    previous_attempts integer     NOT NULL DEFAULT 0,
    previous_error    text
);
CREATE INDEX replay_audit_event_idx ON replay_audit (event_id);
CREATE INDEX replay_audit_at_idx ON replay_audit (at);

-- +goose Down
DROP TABLE replay_audit;
