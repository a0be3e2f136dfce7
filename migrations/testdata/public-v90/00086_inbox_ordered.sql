-- +goose Up
-- Ordered apply: an inbox handler run in ordered mode applies the events of one
-- key strictly in their per-key sequence (key_seq, the Pgrelay-Key-Seq header
-- the relay publishes; see 00085_outbox_key_seqs).
--
-- inbox.key_seq   the event's per-key sequence as received (NULL: none; such
--                 events are applied unordered).
-- inbox_key_state one row per (handler, key) an ordered handler has seen:
--                 last_applied is the highest sequence applied (0: none yet),
--                 updated in the transaction that applies the event, so a
--                 crash never applies one twice or skips one. missing_seq and
--                 gap_since describe a gap (later events held while
--                 missing_seq has not arrived), gap_reported_at when it was
--                 reported. Rows are kept forever: forgetting a key would make
--                 its next events look like duplicates.
-- Events held behind a gap or a parked (dead) event wait as pending with
-- next_attempt_at = 'infinity' and last_error saying which sequence they
-- wait for; applying the missing one makes the next one due.
ALTER TABLE inbox ADD COLUMN key_seq bigint CHECK (key_seq > 0);
CREATE INDEX inbox_key_seq_idx ON inbox (handler, key, key_seq) WHERE key_seq IS NOT NULL;

CREATE TABLE inbox_key_state (
    handler         text        NOT NULL,
    key             text        NOT NULL,
    last_applied    bigint      NOT NULL DEFAULT 0 CHECK (last_applied >= 0),
    missing_seq     bigint,
    gap_since       timestamptz,
    gap_reported_at timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (handler, key)
);

-- Skipping a gap or a dead event of an ordered key is an operator action,
-- audited like requeue and purge (event_id names the skipped event, or
-- "<key>#<first>-<last>" for a gap).
ALTER TABLE replay_audit DROP CONSTRAINT replay_audit_action_check;
ALTER TABLE replay_audit ADD CONSTRAINT replay_audit_action_check
    CHECK (action IN ('requeue', 'purge', 'reset_dedup_stats', 'skip_gap', 'skip_dead'));

-- +goose Down
-- Rolling back forgets what each ordered handler applied. It refuses while
-- any key state or skip audit exists, unless pgrelay.force_down=on (then the
-- skip audit rows are deleted).
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND (EXISTS (SELECT 1 FROM inbox_key_state)
            OR EXISTS (SELECT 1 FROM replay_audit WHERE action IN ('skip_gap', 'skip_dead'))) THEN
        RAISE EXCEPTION 'migrate down: 00086_inbox_ordered would drop data: inbox_key_state holds what ordered handlers applied, or the audit trail records skips; to drop them anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END $$;
-- +goose StatementEnd
DELETE FROM replay_audit WHERE action IN ('skip_gap', 'skip_dead');
ALTER TABLE replay_audit DROP CONSTRAINT replay_audit_action_check;
ALTER TABLE replay_audit ADD CONSTRAINT replay_audit_action_check
    CHECK (action IN ('requeue', 'purge', 'reset_dedup_stats'));
DROP TABLE inbox_key_state;
DROP INDEX inbox_key_seq_idx;
ALTER TABLE inbox DROP COLUMN key_seq;
