-- kafkatx outbox (table contract version 1, docs/outbox-table.md), its commit-order sequencing,
-- the relay's wake-up NOTIFY, and the operator audit tables of the outbox and the dead letters.
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).

-- One row per record to publish. A writer sets topic, key (NULL for a nil key), value (NULL
-- for a tombstone) and optionally the headers and an explicit partition; every other column
-- has a default or belongs to the relay.
--   outbox_id    sent as the kafkatx-outbox-id header: the record's globally unique id.
--   txid         the writing transaction (pg_current_xact_id); its outbox_commits row holds
--                the transaction's commit sequence number.
--   state        pending -> published (or deleted at once), or pending -> parked -> pending
--                (release) | discarded.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox (
    id            bigserial   PRIMARY KEY,
    outbox_id     uuid        NOT NULL DEFAULT gen_random_uuid(),
    topic         text        NOT NULL CHECK (topic <> ''),
    key           bytea,
    value         bytea,
    header_keys   bytea[]     NOT NULL DEFAULT '{}',
    header_values bytea[]     NOT NULL DEFAULT '{}',
    partition     integer     CHECK (partition >= 0),
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    txid          xid8        NOT NULL DEFAULT pg_current_xact_id(),
    state         text        NOT NULL DEFAULT 'pending'
                              CHECK (state IN ('pending', 'parked', 'published', 'discarded')),
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    parked_at     timestamptz,
    resolved_at   timestamptz,
    CHECK (cardinality(header_keys) = cardinality(header_values))
);

-- Open rows by transaction, in write order: the relay's reads (per committed transaction, in
-- commit order) and the commit trigger's key lookup.
CREATE INDEX IF NOT EXISTS outbox_open_idx ON {{schema}}.outbox (txid, id) WHERE state IN ('pending', 'parked');
-- Parked rows by key: later rows of a parked key wait behind it.
CREATE INDEX IF NOT EXISTS outbox_parked_idx ON {{schema}}.outbox (topic, key) WHERE state = 'parked';
-- Published (when kept) and discarded rows by age, for the retention janitor.
CREATE INDEX IF NOT EXISTS outbox_resolved_idx ON {{schema}}.outbox (resolved_at) WHERE state IN ('published', 'discarded');

-- One row per transaction that wrote to the outbox: its commit sequence number, taken at
-- commit. The relay publishes transactions in commit_seq order and a transaction's rows in id
-- (write) order, and deletes the row once none of the transaction's rows is open.
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_commits (
    txid       xid8   PRIMARY KEY,
    commit_seq bigint
);
CREATE INDEX IF NOT EXISTS outbox_commits_seq_idx ON {{schema}}.outbox_commits (commit_seq);
CREATE SEQUENCE IF NOT EXISTS {{schema}}.outbox_commit_seq;

-- outbox_channel names the relay's NOTIFY channel: "<schema>.outbox", or, when that would pass
-- PostgreSQL's 63-byte limit, "kafkatx.outbox." followed by the first 16 hex digits of md5(schema).
CREATE OR REPLACE FUNCTION {{schema}}.outbox_channel(schema_name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN octet_length(schema_name) <= 56 THEN schema_name || '.outbox'
                ELSE 'kafkatx.outbox.' || left(md5(schema_name), 16) END
$$;

-- outbox_written runs once per INSERT or COPY statement: the first in a transaction adds the
-- transaction's outbox_commits row (a transaction-local setting remembers it), and every one
-- sends NOTIFY on outbox_channel(schema) with an empty payload, which PostgreSQL folds into
-- one notification per transaction, delivered at commit.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_written() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_setting constant text := 'kafkatx.outbox_tx_' || TG_RELID::text;
BEGIN
    IF current_setting(v_setting, true) IS DISTINCT FROM 'on' THEN
        INSERT INTO {{schema}}.outbox_commits (txid) VALUES (pg_current_xact_id()) ON CONFLICT DO NOTHING;
        PERFORM set_config(v_setting, 'on', true);
    END IF;
    PERFORM pg_notify({{schema}}.outbox_channel(TG_TABLE_SCHEMA), '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS outbox_written ON {{schema}}.outbox;
CREATE TRIGGER outbox_written AFTER INSERT ON {{schema}}.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.outbox_written();

-- outbox_sequence runs at commit (a deferred constraint trigger on the transaction's
-- outbox_commits row) and gives the transaction its commit_seq. Before taking the number it
-- locks the transaction's keys (advisory transaction locks, in hash order, so two committers
-- never deadlock), and those locks are held until the commit is visible: a second transaction
-- writing the same key gets its number only after the first committed. So for one
-- (topic, key), commit_seq order is commit order. A transaction with more than 512 distinct
-- keys takes one exclusive lock instead, which serializes such commits (bounded use of the
-- shared lock table, sized max_locks_per_transaction × max_connections); the others share it,
-- so transactions with disjoint keys commit in parallel. 512 covers a consumer batch of the
-- default size writing one keyed record per message.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_sequence() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_hashes integer[];
    v_key_space integer;
    v_rows bigint;
BEGIN
    SELECT array_agg(k.kh ORDER BY k.kh), count(*) INTO v_hashes, v_rows FROM (
        SELECT DISTINCT hashtext(encode(sha256(convert_to(o.topic, 'UTF8') || '\x00'::bytea || o.key), 'hex')) AS kh
          FROM {{schema}}.outbox o
         WHERE o.txid = NEW.txid AND o.state IN ('pending', 'parked') AND o.key IS NOT NULL
         LIMIT 513
    ) k;
    IF v_rows > 512 THEN
        PERFORM pg_advisory_xact_lock(hashtext('kafkatx.outbox.commit.' || TG_TABLE_SCHEMA), 0);
    ELSIF v_rows > 0 THEN
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

DROP TRIGGER IF EXISTS outbox_sequence ON {{schema}}.outbox_commits;
CREATE CONSTRAINT TRIGGER outbox_sequence AFTER INSERT ON {{schema}}.outbox_commits
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {{schema}}.outbox_sequence();

-- Operator actions on parked outbox rows (kafkatx outbox release|discard).
CREATE TABLE IF NOT EXISTS {{schema}}.outbox_audit (
    id            bigserial   PRIMARY KEY,
    outbox_row    bigint      NOT NULL,
    action        text        NOT NULL CHECK (action IN ('release', 'discard')),
    parked_error  text,
    reason        text        NOT NULL DEFAULT '',
    actor         text        NOT NULL DEFAULT '',
    at            timestamptz NOT NULL DEFAULT now()
);

-- Operator actions on dead letters (kafkatx dlq replay|discard). outbox_row is the outbox row
-- a replay wrote. No foreign key: the janitor removes old resolved dead letters, the audit stays.
CREATE TABLE IF NOT EXISTS {{schema}}.dlq_audit (
    id             bigserial   PRIMARY KEY,
    dead_letter_id bigint      NOT NULL,
    action         text        NOT NULL CHECK (action IN ('replay', 'discard')),
    to_topic       text,
    outbox_row     bigint,
    reason         text        NOT NULL DEFAULT '',
    actor          text        NOT NULL DEFAULT '',
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS dlq_audit_dead_letter_idx ON {{schema}}.dlq_audit (dead_letter_id, id);
