-- The operator console at scale (issue 36).
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).
--
-- Dead-letter search pages by id (keyset: WHERE id > $after ORDER BY id LIMIT n). With a
-- filter on the topic, the error class or the time of the last failure, these indexes give
-- the matching ids in order (or a bounded range to sort) instead of a walk over every row.
CREATE INDEX IF NOT EXISTS dead_letters_topic_id_idx ON {{schema}}.dead_letters (topic, id);
CREATE INDEX IF NOT EXISTS dead_letters_error_class_id_idx ON {{schema}}.dead_letters (error_class, id);
CREATE INDEX IF NOT EXISTS dead_letters_last_failure_idx ON {{schema}}.dead_letters (last_failure_at, id);

-- The text search (q) first narrows by words through a full-text index (PostgreSQL's own,
-- the 'simple' configuration: no stemming, no stop words, no extension to install, so a
-- schema-only dump restores anywhere), then keeps the rows whose message or stack holds the
-- text as typed (ILIKE). The expression must be the one dlq.Search writes.
CREATE INDEX IF NOT EXISTS dead_letters_text_idx ON {{schema}}.dead_letters
    USING gin (to_tsvector('simple'::regconfig, error_message || ' ' || coalesce(stack, '')));

-- Samples of each partition's position over time, taken by the console (every
-- console.Config.SampleEvery, default 1 minute, while it runs) and kept for
-- console.Config.SampleRetention (default 7 days): the lag and throughput charts. The log end
-- is Kafka's (read_committed); lag = log_end - watermark; processed = the watermark's
-- advance since the previous sample. Deleting rows loses nothing but chart history.
CREATE TABLE IF NOT EXISTS {{schema}}.partition_samples (
    group_id  text        NOT NULL,
    topic     text        NOT NULL,
    partition integer     NOT NULL,
    at        timestamptz NOT NULL,
    watermark bigint      NOT NULL,
    log_end   bigint      NOT NULL,
    lag       bigint      NOT NULL,
    PRIMARY KEY (group_id, topic, partition, at)
);
CREATE INDEX IF NOT EXISTS partition_samples_at_idx ON {{schema}}.partition_samples (at);
