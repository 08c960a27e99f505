package airflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/pg"
)

// Target is what a ledger row records being handed to Airflow.
type Target string

// Ledger targets.
const (
	TargetDAGRun     Target = "dag_run"     // a DAG run (DAGID, RunID)
	TargetAssetEvent Target = "asset_event" // an asset event (AssetName, KafkatxID)
)

// Outcome is what Airflow answered to the event a ledger row records.
type Outcome string

// Ledger outcomes.
const (
	// OutcomeCreated: this pass created the run or asset event (Result.Created,
	// AssetResult.Created), settled ones included.
	OutcomeCreated Outcome = "created"
	// OutcomeExisted: Airflow already had it (a 409 for a run; an asset event found by its
	// kafkatx_id): an earlier try whose transaction did not commit, or a replay.
	OutcomeExisted Outcome = "existed"
)

// MaxLedgerPayloadBytes is the largest payload (a run's conf, an asset event's extra, in bytes
// of JSON) a ledger row keeps, 64 KiB (OpaqueConfBytes): `kafkatx airflow repair` re-creates
// a lost run or asset event from it without reading Kafka. A larger payload is not kept
// (LedgerEntry.PayloadBytes still says its size) and a repair of that row is refused, naming
// the offset to replay instead.
const MaxLedgerPayloadBytes = OpaqueConfBytes

// LedgerEntry is one event a kafkatx consumer handed to Airflow, as RecordTx writes it to the
// ledger (table airflow_ledger of the consumer's schema, migration 014).
type LedgerEntry struct {
	// ID is the row's id (set by RecordTx and the ledger's readers).
	ID int64 `json:"id"`
	// Group, Topic, Partition and Offset are the Kafka position of the event. Required
	// (Offset ≥ 0).
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	// TopicID, ClusterID and ReplayEpoch name the log the offset is in and the partition's
	// replay epoch; RecordTx reads them from the partition's watermark in the same
	// transaction ('' and 0 when the partition has none yet).
	TopicID     string `json:"topic_id,omitempty"`
	ClusterID   string `json:"cluster_id,omitempty"`
	ReplayEpoch int32  `json:"replay_epoch"`
	// Key is the event's idempotency key (the run id or kafkatx_id is derived from it).
	// Required.
	Key string `json:"idempotency_key"`
	// Target is TargetDAGRun (DAGID and RunID required) or TargetAssetEvent (AssetName and
	// KafkatxID required; AssetID and AssetEventID when known, else 0).
	Target       Target `json:"target"`
	DAGID        string `json:"dag_id,omitempty"`
	RunID        string `json:"run_id,omitempty"`
	AssetID      int64  `json:"asset_id,omitempty"`
	AssetName    string `json:"asset,omitempty"`
	AssetEventID int64  `json:"asset_event_id,omitempty"`
	KafkatxID    string `json:"kafkatx_id,omitempty"`
	// Payload is the run's conf or the asset event's extra as sent (a JSON object), kept when
	// at most MaxLedgerPayloadBytes; PayloadBytes is its size either way (RecordTx sets it).
	Payload      json.RawMessage `json:"payload,omitempty"`
	PayloadBytes int             `json:"payload_bytes"`
	// Outcome is OutcomeCreated or OutcomeExisted. Required.
	Outcome Outcome `json:"outcome"`
	// CreatedAt is when the row was written (the transaction's time; set by the readers).
	CreatedAt time.Time `json:"created_at"`
}

// check reports why e cannot be recorded.
func (e *LedgerEntry) check() error {
	switch {
	case e.Group == "" || e.Topic == "":
		return errors.New("airflow: ledger entry needs a Group and a Topic")
	case e.Partition < 0 || e.Offset < 0:
		return fmt.Errorf("airflow: ledger entry at partition %d offset %d: both are 0 or more", e.Partition, e.Offset)
	case e.Key == "":
		return errors.New("airflow: ledger entry needs the idempotency Key")
	case e.Outcome != OutcomeCreated && e.Outcome != OutcomeExisted:
		return fmt.Errorf("airflow: ledger entry outcome %q: want created or existed", e.Outcome)
	}
	switch e.Target {
	case TargetDAGRun:
		if e.DAGID == "" || e.RunID == "" {
			return errors.New("airflow: a dag_run ledger entry needs DAGID and RunID")
		}
	case TargetAssetEvent:
		if e.AssetName == "" || e.KafkatxID == "" {
			return errors.New("airflow: an asset_event ledger entry needs AssetName and KafkatxID")
		}
	default:
		return fmt.Errorf("airflow: ledger entry target %q: want dag_run or asset_event", e.Target)
	}
	return nil
}

// RecordTx writes e to the ledger of schema ("" is "kafkatx") in tx — the consumer's
// transaction, the one that advances e's partition's watermark, so a row exists exactly for
// the events whose watermark moved past them — and returns the row's id. The log identity
// (topic id, cluster id) and replay epoch are read from the partition's watermark in tx. A
// replay of an offset writes a new row: (partition, offset) is not unique. For an asset event
// it also deletes the event's pending row (MarkAssetPending) in tx. Errors: an entry missing a
// required field (before any SQL), or the database's.
func RecordTx(ctx context.Context, tx pgx.Tx, schema string, e LedgerEntry) (int64, error) {
	if err := e.check(); err != nil {
		return 0, err
	}
	t := tables.For(pg.SchemaOr(schema))
	size := len(e.Payload)
	var payload any // NULL unless kept
	if size > 0 && size <= MaxLedgerPayloadBytes {
		payload = string(e.Payload)
	}
	opt := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	optID := func(id int64) any {
		if id == 0 {
			return nil
		}
		return id
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO `+t.AirflowLedger+` (group_id, topic, partition, "offset", topic_id, cluster_id, replay_epoch,
			idempotency_key, target, dag_id, run_id, asset_id, asset_name, asset_event_id, kafkatx_id, payload, payload_bytes, outcome)
		SELECT $1, $2, $3, $4, coalesce(w.topic_id, ''), coalesce(w.cluster_id, ''), coalesce(w.replay_epoch, 0),
			$5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, $14, $15
		FROM (SELECT 1) one
		LEFT JOIN `+t.Watermarks+` w ON w.group_id = $1 AND w.topic = $2 AND w.partition = $3
		RETURNING id`,
		e.Group, e.Topic, e.Partition, e.Offset, e.Key, string(e.Target), opt(e.DAGID), opt(e.RunID), optID(e.AssetID), opt(e.AssetName),
		optID(e.AssetEventID), opt(e.KafkatxID), payload, size, string(e.Outcome)).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("airflow: write ledger %s[%d]@%d: %w", e.Topic, e.Partition, e.Offset, err)
	}
	if e.Target == TargetAssetEvent {
		if _, err := tx.Exec(ctx, `DELETE FROM `+t.AirflowPending+` WHERE kafkatx_id = $1`, e.KafkatxID); err != nil {
			return 0, fmt.Errorf("airflow: clear pending asset event %s: %w", e.KafkatxID, err)
		}
	}
	return id, nil
}

// MarkAssetPending records, in its own committed statement on q (a pool, not the consumer's
// transaction), that the asset event kafkatxID is about to be posted to asset, and returns
// when an earlier try first marked it: the zero time when none did (post at once), or that
// time (an earlier try may have posted it: pass it as AssetEvent.MaybeSentSince so the
// client reads Airflow's events back before posting). RecordTx deletes the mark in the
// transaction that records the event; retention deletes marks left by events never recorded
// (skipped, dead-lettered) after the ledger's retention.
func MarkAssetPending(ctx context.Context, q pg.Querier, schema, group, asset, kafkatxID string) (time.Time, error) {
	t := tables.For(pg.SchemaOr(schema))
	var since time.Time
	var fresh bool
	err := q.QueryRow(ctx, `WITH ins AS (
			INSERT INTO `+t.AirflowPending+` (kafkatx_id, group_id, asset_name) VALUES ($1, $2, $3)
			ON CONFLICT (kafkatx_id) DO NOTHING RETURNING sent_at)
		SELECT sent_at, true FROM ins
		UNION ALL SELECT sent_at, false FROM `+t.AirflowPending+` WHERE kafkatx_id = $1 AND NOT EXISTS (SELECT 1 FROM ins)`,
		kafkatxID, group, asset).Scan(&since, &fresh)
	if err != nil {
		return time.Time{}, fmt.Errorf("airflow: mark asset event %s pending: %w", kafkatxID, err)
	}
	if fresh {
		return time.Time{}, nil
	}
	return since, nil
}

// LedgerFilter selects ledger rows of one consumer group.
type LedgerFilter struct {
	// Group is the consumer group. Required.
	Group string
	// Topic selects one topic; "" every topic.
	Topic string
	// Partition selects one partition; nil every partition.
	Partition *int32
	// From and To bound the offsets, half-open [From, To); nil: unbounded.
	From, To *int64
}

// ReadLedger returns the ledger rows of schema ("" is "kafkatx") that f selects, in (topic,
// partition, offset, id) order. Errors: an empty Group, or the database's.
func ReadLedger(ctx context.Context, q pg.Querier, schema string, f LedgerFilter) ([]LedgerEntry, error) {
	if f.Group == "" {
		return nil, errors.New("airflow: LedgerFilter.Group is required")
	}
	t := tables.For(pg.SchemaOr(schema))
	rows, err := q.Query(ctx, `SELECT id, group_id, topic, partition, "offset", topic_id, cluster_id, replay_epoch, idempotency_key, target,
			coalesce(dag_id, ''), coalesce(run_id, ''), coalesce(asset_id, 0), coalesce(asset_name, ''), coalesce(asset_event_id, 0),
			coalesce(kafkatx_id, ''), payload, payload_bytes, outcome, created_at
		FROM `+t.AirflowLedger+`
		WHERE group_id = $1 AND ($2 = '' OR topic = $2) AND ($3::int IS NULL OR partition = $3)
		  AND ($4::bigint IS NULL OR "offset" >= $4) AND ($5::bigint IS NULL OR "offset" < $5)
		ORDER BY topic, partition, "offset", id`, f.Group, f.Topic, f.Partition, f.From, f.To)
	if err != nil {
		return nil, fmt.Errorf("airflow: read ledger of group %s: %w", f.Group, err)
	}
	defer rows.Close()
	var out []LedgerEntry
	for rows.Next() {
		var e LedgerEntry
		var target, outcome string
		var payload []byte
		if err := rows.Scan(&e.ID, &e.Group, &e.Topic, &e.Partition, &e.Offset, &e.TopicID, &e.ClusterID, &e.ReplayEpoch, &e.Key, &target,
			&e.DAGID, &e.RunID, &e.AssetID, &e.AssetName, &e.AssetEventID, &e.KafkatxID, &payload, &e.PayloadBytes, &outcome, &e.CreatedAt); err != nil {
			return nil, fmt.Errorf("airflow: read ledger of group %s: %w", f.Group, err)
		}
		e.Target, e.Outcome = Target(target), Outcome(outcome)
		if payload != nil {
			e.Payload = json.RawMessage(payload)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("airflow: read ledger of group %s: %w", f.Group, err)
	}
	return out, nil
}
