-- No B-tree entry holds a value of unbounded size (issue 48). PostgreSQL refuses an index
-- entry over about 2,700 bytes (SQLSTATE 54000, "index row size ... exceeds btree version 4
-- maximum 2704"), and the statement that wrote it fails whole. outbox_parked_idx (002) held
-- the record's topic and key as written: parking a record with a key of 2,700 bytes or more
-- failed, so the relay's mark of every row of its round failed with it and nothing was
-- published any more (the table relay), or the stream stopped at the record and reconnected
-- forever (the WAL relay), while the record stayed pending where no operator command sees it.
-- The index now holds md5 of the topic and sha256 of the key (48 bytes, whatever their
-- sizes); the relay's lookups of a key's parked rows compare both hashes, then the values.
-- Every other B-tree index and unique constraint of kafkatx's tables holds bounded values:
-- ids, offsets, timestamps, states, topic names and topic/cluster ids as Kafka bounds them
-- (a topic name is at most 249 characters), consumer groups (kafkatx.Config refuses a
-- group.id over 500 bytes), idempotency scopes and keys (idempotency.MaxScopeBytes,
-- MaxKeyBytes; httpmw bounds the Idempotency-Key header) and error classes (cut to 64 bytes).
-- Error texts, stacks, keys, values and headers are stored unindexed, or (the dead letters'
-- text search, 010) in a GIN index of words, whose text kafkatx bounds.
-- Building the index reads the outbox table once under a lock that holds writers back
-- meanwhile (it is small while the relay keeps up: published rows are deleted).
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).

DROP INDEX IF EXISTS {{schema}}.outbox_parked_idx;
CREATE INDEX IF NOT EXISTS outbox_parked_idx ON {{schema}}.outbox (md5(topic), sha256(key)) WHERE state = 'parked';
