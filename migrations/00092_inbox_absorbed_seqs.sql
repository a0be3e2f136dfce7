-- +goose Up
-- Ordered apply and dedup strategies together (issue 24): a delivery that
-- Receive absorbs because its dedup key is already stored (a content-hash or
-- business key: a double click sent as two events of one key, sequences 1
-- and 2) was never stored with its key_seq, so the key's next sequence
-- waited for it for ever and was reported as a gap.
--
-- inbox_key_state.absorbed_seqs holds the sequences of a key, above
-- last_applied, that were absorbed at receive by another stored event (with
-- no stored row carrying that sequence). An absorbed delivery has no effect
-- of its own (the stored event's stands), so its sequence counts as delivered
-- at once: last_applied moves over it as soon as it reaches it, by
-- inbox_seq_fold, in the statement that records it (Receive) or that applies
-- the sequence before it (the worker's advance, an operator's skip). Kept
-- sorted and distinct, every element above last_applied + 1.
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- As in version 1: goose must record this version in pgrelay.goose_db_version.
-- This is the first version after the release that recorded its versions in
-- public.goose_db_version: its installations meet this check first.
-- +goose StatementBegin
DO $$
BEGIN
    IF pg_catalog.to_regclass('pgrelay.goose_db_version') IS NULL THEN
        RAISE EXCEPTION '%', $m$goose must record pgrelay's versions in pgrelay.goose_db_version: run goose -dir migrations -table pgrelay.goose_db_version postgres "$DATABASE_URL" up (a new database needs the schema first: psql "$DATABASE_URL" -c 'CREATE SCHEMA IF NOT EXISTS pgrelay'; an installation made before version 100 adopts its versions once first: relay migrate sql --adopt | psql "$DATABASE_URL"; docs/schema.md)$m$ USING ERRCODE = 'undefined_table';
    END IF;
END $$;
-- +goose StatementEnd
ALTER TABLE inbox_key_state ADD COLUMN absorbed_seqs bigint[] NOT NULL DEFAULT '{}';

-- inbox_seq_fold returns how far a key's last applied sequence reaches once
-- it moves from last over every sequence of seqs that follows it without a
-- hole: fold(3, {4,5,7}) = 5.
-- +goose StatementBegin
CREATE FUNCTION inbox_seq_fold(last bigint, seqs bigint[]) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- The n-th smallest distinct sequence above last is last + n exactly as
    -- long as there is no hole.
    SELECT coalesce(max(t.x), last)
    FROM (SELECT d.x, row_number() OVER (ORDER BY d.x) AS n
          FROM (SELECT DISTINCT u.x FROM unnest(seqs) AS u(x) WHERE u.x > last) AS d) AS t
    WHERE t.x = last + t.n
$$;
-- +goose StatementEnd

-- inbox_seq_rest returns the distinct sequences of seqs above last, sorted.
-- +goose StatementBegin
CREATE FUNCTION inbox_seq_rest(last bigint, seqs bigint[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(DISTINCT u.x ORDER BY u.x), '{}') FROM unnest(seqs) AS u(x) WHERE u.x > last
$$;
-- +goose StatementEnd

-- +goose Down
-- Rolling back forgets which sequences were absorbed: keys waiting for one
-- would wait for ever. It refuses while any key has absorbed sequences not
-- yet passed, unless pgrelay.force_down=on.
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- +goose StatementBegin
DO $$
BEGIN
    IF lower(coalesce(current_setting('pgrelay.force_down', true), '')) NOT IN ('on', 'true', 'yes', '1')
       AND EXISTS (SELECT 1 FROM inbox_key_state WHERE absorbed_seqs <> '{}') THEN
        RAISE EXCEPTION 'migrate down: 00092_inbox_absorbed_seqs would drop data: inbox_key_state.absorbed_seqs holds sequences absorbed at receive that ordered keys have not reached yet; to drop them anyway set pgrelay.force_down=on (relay|consumer migrate down --force, or PGOPTIONS="-c pgrelay.force_down=on" with the goose CLI)'
            USING ERRCODE = 'dependent_objects_still_exist';
    END IF;
END $$;
-- +goose StatementEnd
DROP FUNCTION inbox_seq_rest(bigint, bigint[]);
DROP FUNCTION inbox_seq_fold(bigint, bigint[]);
ALTER TABLE inbox_key_state DROP COLUMN absorbed_seqs;
