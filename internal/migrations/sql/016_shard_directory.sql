-- The shard directory (issue 46): which database holds each partition's state when a consumer
-- runs on several PostgreSQL databases ("shards"). Only the schema of the database a service
-- names with --database-url (the directory database) uses this table; every shard has it
-- empty, as every schema has every table. Unsharded services never write it.
--
--   group_id, topic, partition   the partition of a consumer group.
--   shard       the shard's name, as the service names it (--shard NAME=URL, Config.Shards).
--   epoch       raised by every assignment to another shard and by every move: a higher epoch
--               is the newer owner.
--   state       'active' (the shard named holds the partition) or 'moving' (a move began and
--               has not finished; the shard named is still authoritative).
--   moving_to   with state 'moving': the shard the move goes to.
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).

CREATE TABLE IF NOT EXISTS {{schema}}.shard_directory (
    group_id   text        NOT NULL,
    topic      text        NOT NULL,
    partition  integer     NOT NULL CHECK (partition >= 0),
    shard      text        NOT NULL CHECK (shard <> ''),
    epoch      bigint      NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    state      text        NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'moving')),
    moving_to  text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);
