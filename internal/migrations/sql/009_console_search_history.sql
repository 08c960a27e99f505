-- The operator console at scale (issue 36).
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).
--
-- Dead-letter search pages by id (keyset: WHERE id > $after ORDER BY id LIMIT n). With a
-- filter on the topic, the error class or the time of the last failure, these indexes give
-- the matching ids in order (or a bounded range to sort) instead of a walk over every row.
CREATE INDEX IF NOT EXISTS dead_letters_topic_id_idx ON {{schema}}.dead_letters (topic, id);
CREATE INDEX IF NOT EXISTS dead_letters_error_class_id_idx ON {{schema}}.dead_letters (error_class, id);
CREATE INDEX IF NOT EXISTS dead_letters_last_failure_idx ON {{schema}}.dead_letters (last_failure_at, id);

-- The text search (q: a substring of the error message or the stack, any case) uses
-- trigram indexes when PostgreSQL's pg_trgm extension can be had: it is a trusted extension
-- (PostgreSQL 13+), so a role with CREATE on the database may install it. Without it the
-- search still works, by a scan; the migration says so and goes on.
DO $$
DECLARE
    ext_schema name;
BEGIN
    BEGIN
        CREATE EXTENSION IF NOT EXISTS pg_trgm;
    EXCEPTION WHEN insufficient_privilege OR undefined_file OR feature_not_supported THEN
        RAISE NOTICE 'kafkatx: pg_trgm is not available (%): the dead-letter text search scans', SQLERRM;
    END;
    SELECT n.nspname INTO ext_schema FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pg_trgm';
    IF ext_schema IS NOT NULL THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS dead_letters_message_trgm_idx ON {{schema}}.dead_letters USING gin (error_message %I.gin_trgm_ops)', ext_schema);
        EXECUTE format('CREATE INDEX IF NOT EXISTS dead_letters_stack_trgm_idx ON {{schema}}.dead_letters USING gin (stack %I.gin_trgm_ops)', ext_schema);
    END IF;
END
$$;

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
