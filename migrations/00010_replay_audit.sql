-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
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
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Rolling back refuses while the replay audit trail holds records:
-- set pgrelay.force_down=on to drop it anyway (README, "Migrations").
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND EXISTS (SELECT 1 FROM replay_audit) THEN
        RAISE EXCEPTION 'migrate down: 00010_replay_audit would drop data: the replay audit trail holds records; to drop it anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END $$;
-- +goose StatementEnd
DROP TABLE replay_audit;
