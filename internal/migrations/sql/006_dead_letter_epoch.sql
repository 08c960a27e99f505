-- The replay epoch (watermarks.replay_epoch) a dead letter failed in. A message dead-lettered
-- again after an operator replay (`kafkatx offsets reset --mode replay`) updates its row —
-- attempts, error, last failure, status back to 'new', this column — and is published to the
-- dead-letter topic again, so the table, the topic and the metrics agree.
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).

ALTER TABLE {{schema}}.dead_letters ADD COLUMN IF NOT EXISTS replay_epoch integer NOT NULL DEFAULT 0;
