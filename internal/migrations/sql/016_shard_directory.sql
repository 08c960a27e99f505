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

-- A shard move (kafkatx shards move) deletes the partition's watermark row on the shard it
-- leaves, in the transaction that writes its shard_move audit row and sets the
-- transaction-local kafkatx.audit_id: that deletion is explained, not 'watermark_deleted'.
-- The function is 004's with that one test added to its DELETE branch.
CREATE OR REPLACE FUNCTION {{schema}}.log_unexplained_watermark_move() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    who text := session_user || '@' || coalesce(host(inet_client_addr()), 'local')
        || coalesce(' (' || nullif(current_setting('application_name', true), '') || ')', '');
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF coalesce(current_setting('kafkatx.audit_id', true), '') <> '' THEN
            RETURN OLD; -- a shard move (its own shard_move row explains the deletion)
        END IF;
        INSERT INTO {{schema}}.offset_audit (group_id, topic, partition, kind, from_offset, to_offset, reason, actor)
        VALUES (OLD.group_id, OLD.topic, OLD.partition, 'watermark_deleted', OLD.first_offset, OLD.next_offset,
                'watermark row deleted outside kafkatx', who);
        RETURN OLD;
    END IF;
    IF coalesce(current_setting('kafkatx.audit_id', true), '') <> '' THEN
        RETURN NEW; -- an audited operator command (its own offset_audit row explains the move)
    END IF;
    INSERT INTO {{schema}}.offset_audit (group_id, topic, partition, kind, from_offset, to_offset, reason, actor)
    VALUES (NEW.group_id, NEW.topic, NEW.partition, 'unexplained_move', OLD.next_offset, NEW.next_offset,
            CASE WHEN NEW.next_offset > OLD.next_offset
                 THEN 'watermark moved forward outside kafkatx: offsets skipped with no record'
                 ELSE 'watermark moved back outside kafkatx: offsets will be processed again' END,
            who);
    RETURN NEW;
END
$$;
