-- Packed outbox rows (issue 47). A pack row holds several records of one writing transaction
-- in one row, so the outbox costs a few rows per consumer batch instead of one per event.
-- outbox.Writer writes them when its Pack option is on (default off in this release: every
-- relay must read packs first, docs/upgrading.md); plain-SQL rows are unchanged.
--
--   state       'packed': a pack waiting to be published. Relays before this version read
--               state = 'pending' only, so they leave a pack alone (never publish it as a
--               record, never delete it) instead of mistaking it for one record.
--   pack        the records, encoded as docs/outbox-table.md#packed-rows describes (topic, key,
--               value, partition, headers and outbox_id of each, in write order).
--   pack_count  the records the row holds (1 for a plain row): what the backlog counts.
--   pack_ids    each record's own id, taken from the id sequence before the row's id, so a
--               record moved out of its pack keeps its place in its transaction's write order.
--   pack_keyed, pack_key_hashes
--               how many records have a key, and (at most 512 of them) their key locks as
--               outbox_sequence computes them: the commit-order trigger locks a pack's keys
--               as it locks plain rows' keys.
-- A pack row is never updated by the relay while pending: after a round it is deleted (or
-- marked published, with KeepPublished), and in the same transaction its records that were
-- not delivered (refused: parked; the rest: pending) are inserted as plain rows under their
-- own pack_ids, with the pack's txid and created_at.
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).

ALTER TABLE {{schema}}.outbox
    ADD COLUMN IF NOT EXISTS pack            bytea,
    ADD COLUMN IF NOT EXISTS pack_count      integer NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS pack_ids        bigint[],
    ADD COLUMN IF NOT EXISTS pack_keyed      integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS pack_key_hashes integer[];
-- A pack is already binary and rarely compresses well: store it out of line uncompressed.
ALTER TABLE {{schema}}.outbox ALTER COLUMN pack SET STORAGE EXTERNAL;

-- NOT VALID: the rows already there met the narrower state check and none is packed, so the
-- checks need not read the table; they hold for every row written from now on.
ALTER TABLE {{schema}}.outbox DROP CONSTRAINT IF EXISTS outbox_state_check;
ALTER TABLE {{schema}}.outbox ADD CONSTRAINT outbox_state_check
    CHECK (state IN ('pending', 'parked', 'published', 'discarded', 'packed')) NOT VALID;
ALTER TABLE {{schema}}.outbox DROP CONSTRAINT IF EXISTS outbox_pack_check;
ALTER TABLE {{schema}}.outbox ADD CONSTRAINT outbox_pack_check
    CHECK (state <> 'packed' OR (pack IS NOT NULL AND pack_ids IS NOT NULL AND cardinality(pack_ids) = pack_count)) NOT VALID;

-- The relay reads pending and packed rows through one index, in (txid, id) order.
CREATE INDEX IF NOT EXISTS outbox_open2_idx ON {{schema}}.outbox (txid, id) WHERE state IN ('pending', 'parked', 'packed');
DROP INDEX IF EXISTS {{schema}}.outbox_open_idx;
ALTER INDEX {{schema}}.outbox_open2_idx RENAME TO outbox_open_idx;

CREATE OR REPLACE FUNCTION {{schema}}.outbox_sequence() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_hashes integer[];
    v_key_space integer;
    v_rows bigint;
BEGIN
    -- More than 512 keyed records (a pack counts its keyed records): one exclusive lock,
    -- without hashing a key.
    SELECT coalesce(sum(k.n), 0) INTO v_rows FROM (
        SELECT CASE WHEN o.state = 'packed' THEN o.pack_keyed ELSE 1 END AS n FROM {{schema}}.outbox o
         WHERE o.txid = NEW.txid AND o.state IN ('pending', 'parked', 'packed')
           AND (o.key IS NOT NULL OR o.state = 'packed')
         LIMIT 513
    ) k;
    IF v_rows > 512 THEN
        PERFORM pg_advisory_xact_lock(hashtext('kafkatx.outbox.commit.' || TG_TABLE_SCHEMA), 0);
    ELSIF v_rows > 0 THEN
        SELECT array_agg(DISTINCT h.h) INTO v_hashes FROM (
            SELECT hashtext(o.topic || ':' || encode(o.key, 'hex')) AS h
              FROM {{schema}}.outbox o
             WHERE o.txid = NEW.txid AND o.state IN ('pending', 'parked') AND o.key IS NOT NULL
            UNION ALL
            SELECT unnest(o.pack_key_hashes)
              FROM {{schema}}.outbox o
             WHERE o.txid = NEW.txid AND o.state = 'packed'
        ) h;
        PERFORM pg_advisory_xact_lock_shared(hashtext('kafkatx.outbox.commit.' || TG_TABLE_SCHEMA), 0);
        v_key_space := hashtext('kafkatx.outbox.keys.' || TG_TABLE_SCHEMA);
        PERFORM pg_advisory_xact_lock(v_key_space, h) FROM unnest(v_hashes) AS h ORDER BY h;
    END IF;
    UPDATE {{schema}}.outbox_commits
       SET commit_seq = nextval(format('%I.outbox_commit_seq', TG_TABLE_SCHEMA)::regclass)
     WHERE txid = NEW.txid;
    RETURN NULL;
END
$$;

-- In WAL mode no table relay reads the table: a pack written by a writer that read the mode
-- before a switch to WAL mode fails its transaction (to be retried in the new mode) instead of
-- being stored where nothing publishes it.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_emit_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'packed' THEN
        RAISE EXCEPTION 'kafkatx outbox of schema %: a packed row was written in WAL mode; retry the transaction', '{{schema_name}}'
            USING ERRCODE = 'KX003';
    END IF;
    IF NEW.state <> 'pending' THEN
        RETURN NEW;
    END IF;
    PERFORM {{schema}}.outbox_emit(ARRAY[{{schema}}.outbox_wal_encode(NEW.topic, NEW.key, NEW.value, NEW.partition,
        NEW.header_keys, NEW.header_values)]);
    RETURN NULL;
END
$$;
