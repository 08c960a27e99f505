-- Offsets above a partition's watermark that the consumer already applied, when it runs
-- several units of a partition at once (Config.Concurrency > 1: units commit out of offset
-- order). The watermark stays "the lowest offset not yet done"; a unit's transaction inserts
-- its offsets here, fenced on the watermark (a row for an offset the watermark has passed is
-- refused), and the unique key makes two owners of one offset conflict, so a zombie's unit
-- rolls back. The watermark's advance deletes the rows below it in the same transaction.
-- After a crash the consumer skips the offsets listed here. Empty with Concurrency 1.
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).

CREATE TABLE IF NOT EXISTS {{schema}}.done_offsets (
    group_id  text    NOT NULL,
    topic     text    NOT NULL,
    partition integer NOT NULL,
    "offset"  bigint  NOT NULL,
    PRIMARY KEY (group_id, topic, partition, "offset")
);
