-- kafkatx core tables: processed watermarks, durable attempts, dead letters, offset audit.
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).

-- One row per (consumer group, topic, partition): next_offset is the processed watermark,
-- the next offset to process. It advances in the same transaction as the handler's effects.
-- inflight_end marks offsets [next_offset, inflight_end) as attempted by a batch that has not
-- committed yet: found after a crash, it sends those offsets through one message per
-- transaction so the message that crashed the process collects its own attempts.
CREATE TABLE IF NOT EXISTS {{schema}}.watermarks (
    group_id      text        NOT NULL,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    next_offset   bigint      NOT NULL CHECK (next_offset >= 0),
    first_offset  bigint      NOT NULL CHECK (first_offset >= 0),
    inflight_end  bigint,
    replay_epoch  integer     NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);

-- Durable attempt counters for messages that failed or may have crashed the process.
-- A row exists only while a message is being retried; it is deleted in the transaction that
-- processes or dead-letters the message.
CREATE TABLE IF NOT EXISTS {{schema}}.attempts (
    group_id         text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    attempts         integer     NOT NULL,
    first_failure_at timestamptz,
    last_failure_at  timestamptz,
    error_class      text,
    error_message    text,
    stack            text,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition, "offset")
);

-- Messages given up on. key, value and header values are kept byte for byte (bytea);
-- key is NULL for a nil key. status: 'new', 'replayed' or 'discarded'.
CREATE TABLE IF NOT EXISTS {{schema}}.dead_letters (
    id               bigserial   PRIMARY KEY,
    group_id         text        NOT NULL,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    key              bytea,
    value            bytea,
    header_keys      bytea[]     NOT NULL DEFAULT '{}',
    header_values    bytea[]     NOT NULL DEFAULT '{}',
    message_time     timestamptz,
    error_class      text        NOT NULL,
    error_message    text        NOT NULL,
    stack            text,
    attempts         integer     NOT NULL,
    first_failure_at timestamptz NOT NULL,
    last_failure_at  timestamptz NOT NULL,
    status           text        NOT NULL DEFAULT 'new' CHECK (status IN ('new', 'replayed', 'discarded')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    resolved_at      timestamptz,
    UNIQUE (group_id, topic, partition, "offset")
);
CREATE INDEX IF NOT EXISTS dead_letters_status_idx ON {{schema}}.dead_letters (status, created_at);

-- Every change to a watermark that is not a processed batch: skips (by an operator command
-- or unexplained), replays, alignments, first runs. [from_offset, to_offset) is half-open.
-- status 'pending' is an operator command's intent recorded before it moves Kafka's offsets.
CREATE TABLE IF NOT EXISTS {{schema}}.offset_audit (
    id           bigserial   PRIMARY KEY,
    group_id     text        NOT NULL,
    topic        text        NOT NULL,
    partition    integer     NOT NULL,
    kind         text        NOT NULL,
    from_offset  bigint      NOT NULL,
    to_offset    bigint      NOT NULL,
    reason       text        NOT NULL DEFAULT '',
    actor        text        NOT NULL DEFAULT '',
    status       text        NOT NULL DEFAULT 'applied' CHECK (status IN ('pending', 'applied', 'abandoned')),
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS offset_audit_tp_idx ON {{schema}}.offset_audit (group_id, topic, partition, id);
