-- The outbox's mode, stored with the schema (docs/outbox-wal.md): 'table' (rows in
-- {{schema}}.outbox, published by the table relay; the default) or 'wal' (transactional
-- logical-decoding messages, relayed from the replication slot slot_name, which reads the
-- publication publication_name). chosen is false until a binary or an operator set the mode
-- explicitly: the first binary started with --outbox-mode chooses it, a later one that
-- disagrees exits 2. The row is changed only by outbox_set_mode (kafkatx migrate up
-- --outbox-mode, outbox.SetMode).
-- {{schema}} is replaced with the quoted schema name, {{schema_name}} with the bare one.

CREATE TABLE IF NOT EXISTS {{schema}}.outbox_settings (
    singleton        boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    mode             text        NOT NULL DEFAULT 'table' CHECK (mode IN ('table', 'wal')),
    chosen           boolean     NOT NULL DEFAULT false,
    slot_name        text,
    publication_name text,
    changed_at       timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{schema}}.outbox_settings (singleton) VALUES (true) ON CONFLICT DO NOTHING;

-- outbox_wal_prefix is the logical-decoding message prefix of this schema's records.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_wal_prefix() RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'kafkatx.outbox:' || '{{schema_name}}' $$;

-- outbox_wal_check raises unless the schema is in WAL mode and its slot exists: a writer never
-- emits a message no relay will read (SQLSTATE KX001: not in WAL mode; KX002: no slot).
CREATE OR REPLACE FUNCTION {{schema}}.outbox_wal_check() RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_mode text;
    v_slot text;
BEGIN
    SELECT s.mode, s.slot_name INTO v_mode, v_slot FROM {{schema}}.outbox_settings s;
    IF v_mode IS DISTINCT FROM 'wal' THEN
        RAISE EXCEPTION 'kafkatx outbox of schema % is in % mode, not wal', '{{schema_name}}', coalesce(v_mode, 'table')
            USING ERRCODE = 'KX001';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_replication_slots r WHERE r.slot_name = v_slot AND r.database = current_database()) THEN
        RAISE EXCEPTION 'kafkatx outbox of schema %: replication slot % is missing; nothing was written (recreate it with kafkatx migrate up --outbox-mode wal, after checking what the old slot had not relayed)', '{{schema_name}}', v_slot
            USING ERRCODE = 'KX002';
    END IF;
END
$$;

-- outbox_emit writes each encoded record (outbox.EncodeWAL's format) as one transactional
-- logical-decoding message, in array order, and returns the messages' LSNs (as bigint).
CREATE OR REPLACE FUNCTION {{schema}}.outbox_emit(msgs bytea[]) RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_prefix constant text := {{schema}}.outbox_wal_prefix();
    v_out bigint[];
BEGIN
    PERFORM {{schema}}.outbox_wal_check();
    SELECT array_agg((pg_logical_emit_message(true, v_prefix, m.msg) - '0/0'::pg_lsn)::bigint ORDER BY m.ord)
      INTO v_out FROM unnest(msgs) WITH ORDINALITY AS m(msg, ord);
    RETURN v_out;
END
$$;

-- outbox_wal_encode encodes one record as outbox.EncodeWAL does: version byte 1, then
-- int4 lengths (big-endian, -1 for NULL) followed by the bytes of: topic, key, value; the
-- partition as int4 (-1: the partitioner's choice); the header count as int4, then each
-- header's key and value as length + bytes.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_wal_encode(p_topic text, p_key bytea, p_value bytea, p_partition integer,
    p_header_keys bytea[], p_header_values bytea[]) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v bytea := '\x01'::bytea;
    t bytea := convert_to(p_topic, 'UTF8');
    n integer := coalesce(cardinality(p_header_keys), 0);
BEGIN
    v := v || int4send(octet_length(t)) || t;
    v := v || CASE WHEN p_key IS NULL THEN int4send(-1) ELSE int4send(octet_length(p_key)) || p_key END;
    v := v || CASE WHEN p_value IS NULL THEN int4send(-1) ELSE int4send(octet_length(p_value)) || p_value END;
    v := v || int4send(coalesce(p_partition, -1)) || int4send(n);
    FOR i IN 1..n LOOP
        v := v || int4send(octet_length(p_header_keys[i])) || p_header_keys[i]
               || int4send(octet_length(p_header_values[i])) || p_header_values[i];
    END LOOP;
    RETURN v;
END
$$;

-- In WAL mode outbox_emit_row replaces a plain-SQL INSERT INTO {{schema}}.outbox of a pending
-- row by its message and stores nothing (the statement reports 0 rows, RETURNING returns none).
-- A row inserted parked (the WAL relay parks refused records) is stored.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_emit_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> 'pending' THEN
        RETURN NEW;
    END IF;
    PERFORM {{schema}}.outbox_emit(ARRAY[{{schema}}.outbox_wal_encode(NEW.topic, NEW.key, NEW.value, NEW.partition,
        NEW.header_keys, NEW.header_values)]);
    RETURN NULL;
END
$$;

-- In WAL mode outbox_release_row publishes a released parked row (state parked -> pending, by
-- kafkatx outbox release) as a new message and marks it published.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_release_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 'parked' AND NEW.state = 'pending' THEN
        PERFORM {{schema}}.outbox_emit(ARRAY[{{schema}}.outbox_wal_encode(NEW.topic, NEW.key, NEW.value, NEW.partition,
            NEW.header_keys, NEW.header_values)]);
        NEW.state := 'published';
        NEW.resolved_at := now();
    END IF;
    RETURN NEW;
END
$$;

-- outbox_set_mode records the mode and swaps the table's triggers: in WAL mode pending rows
-- become messages (outbox_emit_row, outbox_release_row) and the commit-order triggers of the
-- table relay are off; in table mode it is the reverse. The caller creates the slot and the
-- publication first (outbox.SetMode). It returns the previous mode.
CREATE OR REPLACE FUNCTION {{schema}}.outbox_set_mode(p_mode text, p_slot text, p_publication text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_old text;
BEGIN
    SELECT mode INTO v_old FROM {{schema}}.outbox_settings FOR UPDATE;
    UPDATE {{schema}}.outbox_settings
       SET mode = p_mode, chosen = true, changed_at = now(),
           slot_name = coalesce(p_slot, slot_name), publication_name = coalesce(p_publication, publication_name);
    DROP TRIGGER IF EXISTS outbox_emit_row ON {{schema}}.outbox;
    DROP TRIGGER IF EXISTS outbox_release_row ON {{schema}}.outbox;
    DROP TRIGGER IF EXISTS outbox_written ON {{schema}}.outbox;
    IF p_mode = 'wal' THEN
        CREATE TRIGGER outbox_emit_row BEFORE INSERT ON {{schema}}.outbox
            FOR EACH ROW EXECUTE FUNCTION {{schema}}.outbox_emit_row();
        CREATE TRIGGER outbox_release_row BEFORE UPDATE OF state ON {{schema}}.outbox
            FOR EACH ROW EXECUTE FUNCTION {{schema}}.outbox_release_row();
    ELSE
        CREATE TRIGGER outbox_written AFTER INSERT ON {{schema}}.outbox
            FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.outbox_written();
    END IF;
    RETURN v_old;
END
$$;
