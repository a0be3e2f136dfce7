-- +goose Up
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Every pgrelay object lives in the schema pgrelay (docs/schema.md).
--
-- A new installation created its objects there from version 1 on: this
-- migration finds nothing to move. An installation made before moves here:
-- each of pgrelay's tables and functions still in public moves to pgrelay
-- (ALTER ... SET SCHEMA: no rewrite, no row touched; a table takes its
-- indexes, constraints, triggers and owned sequences with it). An object is
-- taken as pgrelay's only when pgrelay has none of that name yet and, for a
-- table, it has the column pgrelay's has: a service's own public.outbox
-- beside a new installation is never touched.
--
-- Run-time SQL never depends on the session's search_path (a transaction-mode
-- pooler may sit in between): the services name pgrelay.<table>, and the
-- bodies of pgrelay's PL/pgSQL and SQL functions are rewritten below with
-- qualified names (cheaper on the producer's per-row trigger than a SET
-- search_path clause: docs/schema.md).
--
-- Plain-SQL producers of a moved installation keep working: public.outbox and
-- public.inbox become views over pgrelay.outbox and pgrelay.inbox
-- (automatically updatable: defaults, the insert triggers and RETURNING apply
-- as before), deprecated, created only when this migration moved the table.
-- +goose StatementBegin
DO $$
DECLARE
    t record;
    f record;
    moved_tables text[] := '{}';
    def text;
    fixed text;
    tables constant text := 'outbox_key_seqs|outbox|inbox_releases|inbox_conflicts|inbox_duplicates|inbox_receive_counts|inbox_key_state|inbox|relay_partitions|relay_nodes|relay_wakeups|replay_audit|http_idempotency_keys|guard_keys';
BEGIN
    -- Tables: name, and a column only pgrelay's table of that name has.
    FOR t IN SELECT * FROM (VALUES
        ('inbox', 'lock_version'), ('inbox_releases', 'released_at'), ('outbox', 'key_seq'),
        ('relay_partitions', 'epoch'), ('relay_nodes', 'last_seen'), ('replay_audit', 'previous_attempts'),
        ('relay_wakeups', 'armed'), ('http_idempotency_keys', 'fingerprint'), ('guard_keys', 'token'),
        ('inbox_conflicts', 'stored_fingerprint'), ('inbox_duplicates', 'original_received_at'),
        ('inbox_receive_counts', 'backend'), ('outbox_key_seqs', 'seq'), ('inbox_key_state', 'last_applied')
    ) AS v(name, marker) LOOP
        IF to_regclass('pgrelay.' || t.name) IS NULL
           AND EXISTS (SELECT 1 FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
                       WHERE c.relnamespace = 'public'::regnamespace AND c.relname = t.name AND c.relkind = 'r'
                         AND a.attname = t.marker AND NOT a.attisdropped) THEN
            EXECUTE format('ALTER TABLE public.%I SET SCHEMA pgrelay', t.name);
            moved_tables := moved_tables || t.name;
        END IF;
    END LOOP;
    -- The outbox's id sequence moved with the table that owns it; one that
    -- lost its owner moves on its own.
    IF to_regclass('pgrelay.outbox_id_seq') IS NULL AND to_regclass('public.outbox_id_seq') IS NOT NULL
       AND 'outbox' = ANY (moved_tables) THEN
        ALTER SEQUENCE public.outbox_id_seq SET SCHEMA pgrelay;
    END IF;

    -- Functions, by signature.
    FOR f IN SELECT * FROM (VALUES
        ('outbox_partition_count()'), ('outbox_partition(text)'), ('outbox_uuidv7()'),
        ('outbox_before_insert()'), ('outbox_notify()'), ('outbox_set_dead_at()'),
        ('inbox_identity_defaults()'), ('outbox_key_seqs_floor()'), ('outbox_key_seqs_floor_truncate()'),
        ('outbox_set_partition()'), ('inbox_seq_fold(bigint, bigint[])'), ('inbox_seq_rest(bigint, bigint[])')
    ) AS v(sig) LOOP
        IF to_regprocedure('public.' || f.sig) IS NULL THEN
            CONTINUE;
        END IF;
        IF to_regprocedure('pgrelay.' || f.sig) IS NULL THEN
            EXECUTE format('ALTER FUNCTION public.%s SET SCHEMA pgrelay', f.sig);
        ELSIF EXISTS (SELECT 1 FROM pg_depend d
                      LEFT JOIN pg_trigger tg ON d.classid = 'pg_trigger'::regclass AND tg.oid = d.objid
                      LEFT JOIN pg_attrdef ad ON d.classid = 'pg_attrdef'::regclass AND ad.oid = d.objid
                      JOIN pg_class c ON c.oid = coalesce(tg.tgrelid, ad.adrelid)
                      WHERE d.refclassid = 'pg_proc'::regclass
                        AND d.refobjid = to_regprocedure('public.' || f.sig)
                        AND c.relnamespace = 'pgrelay'::regnamespace) THEN
            -- Something created pgrelay.<function> while pgrelay's triggers
            -- still call public.<function>: which one is meant cannot be
            -- told here, so nothing is moved.
            RAISE EXCEPTION 'migrate 00100_pgrelay_schema: both public.% and pgrelay.% exist, and pgrelay''s tables use the one in public; the function was created in pgrelay before this migration moved the one in public (docs/schema.md, "Writing migrations")', f.sig, f.sig;
        END IF;
    END LOOP;

    -- Qualify the names in the bodies of pgrelay's functions (those written
    -- with a string body; SQL-standard bodies are bound when created).
    FOR f IN SELECT p.oid FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
             WHERE p.pronamespace = 'pgrelay'::regnamespace AND l.lanname IN ('plpgsql', 'sql')
               AND p.prosqlbody IS NULL ORDER BY p.oid LOOP
        def := pg_get_functiondef(f.oid);
        fixed := regexp_replace(def, '(\m(FROM|JOIN|INTO|UPDATE|TABLE|ONLY)\s+)(' || tables || ')\M(?!\.)', '\1pgrelay.\3', 'gi');
        fixed := replace(fixed, '''outbox_id_seq''', '''pgrelay.outbox_id_seq''');
        fixed := regexp_replace(fixed, '(?<![\w.])(outbox_partition_count|outbox_partition|outbox_uuidv7)\(', 'pgrelay.\1(', 'g');
        IF fixed <> def THEN
            EXECUTE fixed;
        END IF;
    END LOOP;

    -- The compatibility views, for the tables plain SQL writes to.
    FOR t IN SELECT unnest(ARRAY['outbox', 'inbox']) AS name LOOP
        IF t.name = ANY (moved_tables) AND to_regclass('public.' || t.name) IS NULL THEN
            EXECUTE format('CREATE VIEW public.%I AS SELECT * FROM pgrelay.%I', t.name, t.name);
            EXECUTE format('COMMENT ON VIEW public.%I IS %L', t.name,
                'pgrelay compatibility view (deprecated): write to pgrelay.' || t.name || ' instead; dropped by rolling back 00100_pgrelay_schema');
        END IF;
    END LOOP;

    -- Privileges: who could use a moved table can still reach it, and its
    -- view.
    FOR t IN SELECT DISTINCT c.relname, a.grantee, a.privilege_type
             FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.relnamespace = 'pgrelay'::regnamespace AND c.relname = ANY (moved_tables)
               AND a.grantee <> c.relowner LOOP
        IF t.grantee = 0 THEN
            EXECUTE 'GRANT USAGE ON SCHEMA pgrelay TO PUBLIC';
        ELSE
            EXECUTE format('GRANT USAGE ON SCHEMA pgrelay TO %I', t.grantee::regrole::text);
        END IF;
        IF t.relname IN ('outbox', 'inbox') AND obj_description(to_regclass('public.' || t.relname), 'pg_class')
                                                 LIKE 'pgrelay compatibility view%' THEN
            EXECUTE format('GRANT %s ON public.%I TO %s', t.privilege_type, t.relname,
                CASE WHEN t.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(t.grantee::regrole::text) END);
        END IF;
    END LOOP;
END $$;
-- +goose StatementEnd

-- +goose Down
SELECT set_config('search_path', CASE WHEN to_regclass('pgrelay.inbox_releases') IS NULL AND to_regclass('public.inbox_releases') IS NOT NULL THEN 'public' ELSE 'pgrelay' END, true);
-- Rolling back drops the compatibility views and leaves every object in
-- pgrelay, where the older migrations' down parts find them (their
-- search_path is pgrelay once public holds no inbox_releases). A release
-- older than this one names the tables without a schema: to run one again,
-- roll back to version 90 and put pgrelay on its role's search_path
-- (docs/schema.md).
-- +goose StatementBegin
DO $$
DECLARE
    v text;
BEGIN
    FOREACH v IN ARRAY ARRAY['outbox', 'inbox'] LOOP
        IF obj_description(to_regclass('public.' || v), 'pg_class') LIKE 'pgrelay compatibility view%'
           AND (SELECT relkind FROM pg_class WHERE oid = to_regclass('public.' || v)) = 'v' THEN
            EXECUTE format('DROP VIEW public.%I', v);
        END IF;
    END LOOP;
END $$;
-- +goose StatementEnd
