-- Parked keys (issue 45, "A key in trouble waits alone"): with Config.ParkKeys on, a message
-- whose handling is to be retried (an error, Unavailable, a backoff) is parked, and so is
-- every later message of the same key while the key has a parked message: one row each,
-- written in the unit transaction that also records the offset done (done_offsets, 007),
-- fenced on the watermark as done offsets are, so the partition's watermark moves past it
-- and the partition's other keys go on. The consumer retries each key's head (its lowest
-- parked offset) at next_try, in a transaction that holds the handler's effects and deletes
-- the row (the delete is the fence: a second owner finds no row and rolls back); a head that
-- exhausts its attempts is dead-lettered and its row deleted in one transaction. The
-- watermark's meaning becomes "every offset below it is applied, dead-lettered, skipped by
-- an operator, or parked here".
--
-- Not the outbox's parked records (outbox.state = 'parked', `kafkatx outbox parked`): these
-- are input messages of a consumer group, named "parked keys" everywhere.
--
-- The message is kept byte for byte (key NULL for a nil key, value, headers, timestamp), so
-- a retry needs nothing from Kafka (retention may have removed it). key_hash is sha256 of
-- the key (of the offset for a nil key: nil keys have no order among themselves), so no
-- index holds a value of unbounded size (migration 012). The log identity is the
-- watermark's (topic id and cluster id, as dead letters record it, 011).
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).

CREATE TABLE IF NOT EXISTS {{schema}}.key_parking (
    group_id      text        NOT NULL,
    topic         text        NOT NULL,
    partition     integer     NOT NULL,
    "offset"      bigint      NOT NULL,
    topic_id      text        NOT NULL DEFAULT '',
    cluster_id    text        NOT NULL DEFAULT '',
    key_hash      bytea       NOT NULL,
    key           bytea,
    value         bytea,
    header_keys   bytea[]     NOT NULL DEFAULT '{}',
    header_values bytea[]     NOT NULL DEFAULT '{}',
    message_time  timestamptz,
    attempts      integer     NOT NULL DEFAULT 0,
    first_failure_at timestamptz,
    error_class   text        NOT NULL DEFAULT '',
    last_error    text        NOT NULL DEFAULT '',
    next_try      timestamptz,
    parked_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition, "offset", cluster_id, topic_id)
);
-- A key's messages in offset order (the head is the first).
CREATE INDEX IF NOT EXISTS key_parking_key_idx ON {{schema}}.key_parking (group_id, topic, partition, key_hash, "offset");
