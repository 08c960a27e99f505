-- The Airflow ledger (issue "Airflow's own tables in lockstep"): one row per event a kafkatx
-- consumer handed to Apache Airflow — a DAG run it created or found existing, or an asset
-- event — written by the handler in the transaction that advances the partition's watermark
-- (idempotency/airflow.RecordTx), so the ledger holds exactly the events whose watermark moved
-- past them. `kafkatx airflow status` compares it with Airflow; `kafkatx airflow repair`
-- re-creates from it what Airflow lost.
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).
--
-- (partition, offset) is not unique: a replay (`offsets reset --mode replay`) that hands the
-- offset to Airflow again writes a new row, and an offset of a new log adopted after the topic
-- was recreated (`offsets reset --mode adopt`) is another message: topic_id and cluster_id
-- name the log the offset is in (the ids recorded with the partition's watermark in the
-- writing transaction, as dead letters are keyed since migration 011; '' when unknown), and
-- replay_epoch the partition's replay epoch then.
--
-- target is 'dag_run' (dag_id, run_id) or 'asset_event' (asset_id, asset_name,
-- asset_event_id: the event's id in Airflow, NULL when the create's answer was lost and
-- settled by reading back without an id; kafkatx_id: the id in the event's extra, unique per
-- Kafka event). outcome is 'created' (this pass created it) or 'existed' (Airflow already had
-- it: an earlier try whose transaction did not commit, or a replay). payload is the run's conf
-- or the event's extra as sent, kept when at most 64 KiB of JSON (payload_bytes is its size
-- either way) so a repair needs no Kafka read.
CREATE TABLE IF NOT EXISTS {{schema}}.airflow_ledger (
    id              bigserial   PRIMARY KEY,
    group_id        text        NOT NULL,
    topic           text        NOT NULL,
    partition       integer     NOT NULL,
    "offset"        bigint      NOT NULL,
    topic_id        text        NOT NULL DEFAULT '',
    cluster_id      text        NOT NULL DEFAULT '',
    replay_epoch    integer     NOT NULL DEFAULT 0,
    idempotency_key text        NOT NULL,
    target          text        NOT NULL CHECK (target IN ('dag_run', 'asset_event')),
    dag_id          text,
    run_id          text,
    asset_id        bigint,
    asset_name      text,
    asset_event_id  bigint,
    kafkatx_id      text,
    payload         jsonb,
    payload_bytes   integer     NOT NULL DEFAULT 0,
    outcome         text        NOT NULL CHECK (outcome IN ('created', 'existed')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    CHECK (target <> 'dag_run' OR (dag_id IS NOT NULL AND run_id IS NOT NULL)),
    CHECK (target <> 'asset_event' OR (asset_name IS NOT NULL AND kafkatx_id IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS airflow_ledger_position_idx ON {{schema}}.airflow_ledger (group_id, topic, partition, "offset");
CREATE INDEX IF NOT EXISTS airflow_ledger_created_idx ON {{schema}}.airflow_ledger (created_at);

-- Asset events a consumer is about to post: a row is written and committed before the POST
-- and deleted in the transaction that writes the event's ledger row. A row found before a
-- POST means an earlier try may have posted the event (a crash, or a transaction that failed
-- after the POST): the client then reads Airflow's events of the asset back from sent_at
-- (matching extra.kafkatx_id) instead of posting blindly a second time.
CREATE TABLE IF NOT EXISTS {{schema}}.airflow_pending (
    kafkatx_id  text        PRIMARY KEY,
    group_id    text        NOT NULL,
    asset_name  text        NOT NULL,
    sent_at     timestamptz NOT NULL DEFAULT now()
);
