-- +goose Up
-- inbox_duplicates is a bounded record of the deliveries the inbox absorbed as
-- duplicates, newest last: the receive statement that refused a duplicate
-- writes it (same statement, no extra round trip), and inbox retention keeps
-- only the newest rows (--dedup-record-max), pruning in small batches. It
-- feeds the console's "duplicates blocked" feed and survives restarts.
CREATE TABLE inbox_duplicates (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id             text        NOT NULL,
    topic                text        NOT NULL DEFAULT '',
    event_type           text        NOT NULL DEFAULT '',
    -- handler is what the receiving consumer runs (its --handler).
    handler              text        NOT NULL DEFAULT '',
    -- original_received_at is when the inbox stored the original (NULL when
    -- the original is stored by the same batch, or by a transaction the
    -- receiving statement could not see yet).
    original_received_at timestamptz,
    seen_at              timestamptz NOT NULL DEFAULT now()
);

-- inbox_receive_counts counts received messages and duplicates per minute, for
-- the dedup hit rate and its 24-hour activity. Each database session updates
-- its own row of the minute (backend = its pid), so concurrent consumers never
-- wait for each other's row; retention deletes minutes older than a day.
CREATE TABLE inbox_receive_counts (
    minute     timestamptz NOT NULL,
    backend    integer     NOT NULL,
    received   bigint      NOT NULL DEFAULT 0,
    duplicates bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, backend)
);

-- Resetting the dedup statistics is an operator action, audited like requeue
-- and purge (event_id '*': it concerns no single event).
ALTER TABLE replay_audit DROP CONSTRAINT replay_audit_action_check;
ALTER TABLE replay_audit ADD CONSTRAINT replay_audit_action_check
    CHECK (action IN ('requeue', 'purge', 'reset_dedup_stats'));

-- +goose Down
-- The duplicate record and counts are statistics only: dropping them loses no
-- event. Audit rows of statistics resets cannot be kept under the older
-- constraint, so rolling back refuses while any exists unless
-- pgrelay.force_down=on (then they are deleted).
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM replay_audit WHERE action = 'reset_dedup_stats') THEN
        IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1') THEN
            RAISE EXCEPTION 'migrate down: 00080_inbox_duplicates would drop data: the replay audit trail records dedup statistics resets; to drop them anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
                USING ERRCODE = 'dependent_objects_still_exist';
        END IF;
        DELETE FROM replay_audit WHERE action = 'reset_dedup_stats';
    END IF;
END $$;
-- +goose StatementEnd
ALTER TABLE replay_audit DROP CONSTRAINT replay_audit_action_check;
ALTER TABLE replay_audit ADD CONSTRAINT replay_audit_action_check
    CHECK (action IN ('requeue', 'purge'));
DROP TABLE inbox_receive_counts;
DROP TABLE inbox_duplicates;
