-- Which log a watermark counts offsets in (issue "Kafka's side of the history"): the topic id
-- (KIP-516, Kafka 2.8+: a topic deleted and recreated under the same name gets a new one) and
-- the cluster id (another cluster — a disaster-recovery switch, a rebuilt cluster — has
-- another). NULL until the consumer first meets the partition after this migration: it reads
-- both at assignment (DescribeTopics, DescribeCluster) and fills them; from then on a
-- different id stops the consumer before it applies anything from the other log, until an
-- operator adopts the new log (`kafkatx offsets reset --mode adopt`, audit kind log_adopted)
-- or Config.OnLogChange adopts it. Topic ids are Kafka's base64 form, as its tools print them.
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).
ALTER TABLE {{schema}}.watermarks ADD COLUMN IF NOT EXISTS topic_id text;
ALTER TABLE {{schema}}.watermarks ADD COLUMN IF NOT EXISTS cluster_id text;
