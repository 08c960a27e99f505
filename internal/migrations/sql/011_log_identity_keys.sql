-- Every row keyed by an offset knows which log the offset is in (issue "Kafka's side of the
-- history", migration 009 gave the watermark its topic id and cluster id). An offset means
-- nothing without its log: after a topic is deleted and created again (or another cluster)
-- and the new log adopted (`kafkatx offsets reset --mode adopt`, Config.OnLogChange), offset
-- 7 of the new log is another message than offset 7 of the old one.
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).
--
-- Dead letters: the topic id and cluster id of the log the message was read from (the ids
-- recorded with the partition's watermark in the transaction that wrote the dead letter; ''
-- when unknown: a row from before this migration that could not be placed, a first run, a
-- broker before Kafka 2.8). The unique key includes them, so a message of the new log that
-- fails at an offset the old log's dead letter holds gets a row of its own instead of
-- overwriting the old one (its bytes, its status); a failure again after a replay in the same
-- log still updates its row (dlq.InsertTx).
ALTER TABLE {{schema}}.dead_letters ADD COLUMN IF NOT EXISTS topic_id text NOT NULL DEFAULT '';
ALTER TABLE {{schema}}.dead_letters ADD COLUMN IF NOT EXISTS cluster_id text NOT NULL DEFAULT '';
-- Rows written before this migration are placed in the log their watermark names now, unless
-- that log was adopted (audit kind log_adopted) after their last failure: those stay ''
-- (an older log whose id was not kept).
UPDATE {{schema}}.dead_letters d SET topic_id = coalesce(w.topic_id, ''), cluster_id = coalesce(w.cluster_id, '')
FROM {{schema}}.watermarks w
WHERE d.topic_id = '' AND d.cluster_id = ''
  AND w.group_id = d.group_id AND w.topic = d.topic AND w.partition = d.partition
  AND NOT EXISTS (SELECT 1 FROM {{schema}}.offset_audit a WHERE a.kind = 'log_adopted'
      AND a.group_id = d.group_id AND a.topic = d.topic AND a.partition = d.partition AND a.at > d.last_failure_at);
ALTER TABLE {{schema}}.dead_letters DROP CONSTRAINT IF EXISTS dead_letters_group_id_topic_partition_offset_key;
ALTER TABLE {{schema}}.dead_letters DROP CONSTRAINT IF EXISTS dead_letters_log_offset_key;
ALTER TABLE {{schema}}.dead_letters ADD CONSTRAINT dead_letters_log_offset_key
    UNIQUE (group_id, topic, partition, "offset", cluster_id, topic_id);

-- Console samples: the topic id of the log the sample's watermark and log end were in, so a
-- chart does not draw a log's adoption (the watermark dropping from the old log's offsets to
-- the new one's) as throughput. '' for samples from before this migration.
ALTER TABLE {{schema}}.partition_samples ADD COLUMN IF NOT EXISTS topic_id text NOT NULL DEFAULT '';

-- Attempts (001) and done offsets (007) are not keyed by the log: they only exist for offsets
-- at or above the watermark, and the adoption of a new log deletes every one of the partition
-- in its transaction (offsetstore.AdoptLog), so none of the old log's counts or done marks
-- meets a message of the new one. The adoption also raises the partition's replay epoch, the
-- scope of the outbox event ids derived from an input message and of business idempotency
-- keys, so the new log's messages at reused offsets get ids of their own.
