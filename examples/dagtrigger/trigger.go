package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/idempotency/airflow"
	"github.com/kafkatx/kafkatx/limit"
)

// trigger starts one DAG run per change event.
type trigger struct {
	pool    *pgxpool.Pool // for prepare's read of claimed keys
	airflow *airflow.Client
	dagID   string
	// asset, when set (--asset), is the asset to create one event on per change event,
	// instead of a run of dagID.
	asset     string
	group     string // the consumer group, for the Airflow ledger
	schema    string
	scope     string
	retention time.Duration
	log       *zap.Logger
	// ops are the Debezium ops that start runs (--cdc-ops); others are skipped.
	ops map[string]bool
	// fullBefore passes a delete's whole before image (--cdc-delete-before full).
	fullBefore bool

	created, existing, repeated, tombstones, notChanges, opsSkipped atomic.Int64
}

// handle runs inside the consumer's transaction, which also advances the watermark:
//
//  1. claim the event's idempotency key (idempotency.DebeziumEvent.Key: the change's source
//     position and row identity, or a snapshot row's identity and content) in that
//     transaction: a copy of an event whose transaction committed (re-published at another
//     offset, re-sent by a restarted connector, re-read by a restarted snapshot) is skipped;
//  2. post the DAG run with the run id derived from the same key: if the process dies after
//     this call and before the commit, the event is delivered again, the claim is made
//     again (the first one rolled back), and the same run id is posted again: Airflow
//     answers 409, which counts as success. So each event yields exactly one run.
//
// Records that are not changes (tombstones, heartbeats, transaction metadata) and ops not
// in --cdc-ops (by default truncates and logical messages) start no run.
// prepared is what prepare found for one event, for handle to record.
type prepared struct {
	skip    bool   // nothing to run: a tombstone, a heartbeat, an op not started, or a Permanent failure recorded by handle
	key     string // the event's identity (idempotency.DebeziumEvent.Key)
	created bool   // Airflow created the run now (false: it existed, 409)
	// handed is what was handed to Airflow, for the ledger (nil: nothing was: a repeat).
	handed *airflow.LedgerEntry
}

type preparedKey struct{}

// prepare starts each event's DAG run before the consumer's transaction, outside it, so the
// slow call to Airflow holds no pooled connection (Config.Prepare). A repeat — the
// transaction failed after the call, or the process crashed before its commit — starts no
// second run: the run id is derived from the event's identity and Airflow answers 409.
// Failures name their event (kafkatx.FailMessage): Unavailable for Airflow down or refusing
// the credentials, Permanent for an event Airflow refuses (400, 422) or that cannot be read.
func (t *trigger) prepare(ctx context.Context, msgs []*kafkatx.Message) error {
	for _, m := range msgs {
		p, err := t.start(ctx, m)
		if err != nil {
			return kafkatx.FailMessage(m, err)
		}
		m.SetContext(context.WithValue(m.Context(), preparedKey{}, p))
	}
	return nil
}

// start starts m's DAG run (or finds it started) and says what happened.
func (t *trigger) start(ctx context.Context, m *kafkatx.Message) (*prepared, error) {
	ev, err := idempotency.ParseDebezium(m.Value)
	if errors.Is(err, idempotency.ErrNotAChange) {
		return &prepared{skip: true}, nil
	}
	if err != nil {
		return nil, kafkatx.Permanent(err)
	}
	if !t.ops[ev.Op] {
		return &prepared{skip: true}, nil
	}
	key, err := ev.Key(m.Key)
	if err != nil {
		return nil, kafkatx.Permanent(err)
	}
	c, err := conf(ev, m.Key, t.fullBefore)
	if err != nil {
		return nil, kafkatx.Permanent(err)
	}
	if t.pool != nil {
		// A copy of an event whose transaction committed (re-published at another offset)
		// does not reach Airflow: handle's claim then counts it as a repeat.
		if seen, err := (idempotency.Store{Schema: t.schema, Retention: t.retention}).Done(ctx, t.pool, t.scope, key); err != nil {
			return nil, kafkatx.Unavailable(err) // the database, not the event: wait, no attempt
		} else if seen {
			return &prepared{key: key}, nil
		}
	}
	// The row (the record key) is what Airflow may refuse alone: its repeated refusals do not
	// shrink the limit on requests to Airflow for every row (package limit).
	ctx = limit.WithKey(ctx, m.Key)
	if t.asset != "" {
		return t.startAsset(ctx, key, c)
	}
	res, err := t.airflow.TriggerDAGRun(ctx, airflow.Trigger{DAGID: t.dagID, Key: key, Conf: c})
	if err != nil {
		if kafkatx.IsUnavailable(err) {
			return nil, err
		}
		if airflow.IsConfTooLarge(err) {
			// Over the client's MaxConfBytes, or Airflow answered 413 or an opaque 5xx to a
			// large conf (apache/airflow#66779): the dead letter says the size and the limit.
			return nil, kafkatx.Permanent(err)
		}
		var se *airflow.StatusError
		if errors.As(err, &se) && (se.StatusCode == http.StatusBadRequest || se.StatusCode == http.StatusUnprocessableEntity) {
			return nil, kafkatx.Permanent(err) // Airflow refuses this run: retrying cannot help
		}
		return nil, err // anything else: retried, then dead-lettered
	}
	return &prepared{key: key, created: res.Created, handed: &airflow.LedgerEntry{Key: key, Target: airflow.TargetDAGRun,
		DAGID: t.dagID, RunID: res.RunID, Payload: c, Outcome: outcome(res.Created)}}, nil
}

// startAsset creates m's asset event (--asset) or finds it created: its kafkatx_id is derived
// from the event's key as a run id would be (airflow.RunID), and a pending mark committed
// before the POST makes a later try (after a crash, or a transaction that failed after the
// POST) read Airflow's events back instead of posting a second one.
func (t *trigger) startAsset(ctx context.Context, key string, row json.RawMessage) (*prepared, error) {
	id := airflow.RunID("", key)
	var since time.Time
	if t.pool != nil {
		var err error
		if since, err = airflow.MarkAssetPending(ctx, t.pool, t.schema, t.group, t.asset, id); err != nil {
			return nil, kafkatx.Unavailable(err) // the database, not the event
		}
	}
	extra := map[string]any{airflow.KafkatxIDKey: id, "row": row}
	res, err := t.airflow.CreateAssetEvent(ctx, airflow.AssetEvent{Asset: t.asset, KafkatxID: id, Extra: extra, MaybeSentSince: since})
	if err != nil {
		if kafkatx.IsUnavailable(err) {
			return nil, err // Airflow down, or no such asset yet: the partition waits
		}
		var se *airflow.StatusError
		if errors.As(err, &se) && (se.StatusCode == http.StatusBadRequest || se.StatusCode == http.StatusUnprocessableEntity) {
			return nil, kafkatx.Permanent(err)
		}
		return nil, err
	}
	payload, _ := json.Marshal(extra)
	return &prepared{key: key, created: res.Created, handed: &airflow.LedgerEntry{Key: key, Target: airflow.TargetAssetEvent,
		AssetID: res.AssetID, AssetName: t.asset, AssetEventID: res.EventID, KafkatxID: id, Payload: payload, Outcome: outcome(res.Created)}}, nil
}

// outcome is the ledger's outcome of a create that created (or found) its run or event.
func outcome(created bool) airflow.Outcome {
	if created {
		return airflow.OutcomeCreated
	}
	return airflow.OutcomeExisted
}

// handle records, in the consumer's transaction, the event prepare started: its identity is
// claimed (an event re-published at another offset is counted as a repeat), the run or asset
// event handed to Airflow is written to the Airflow ledger (airflow.RecordTx: its offset, run
// id or kafkatx_id, outcome and payload; the asset event's pending mark is cleared) and
// counted. Tombstones, heartbeats and ops not started are counted and skipped.
func (t *trigger) handle(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
	p, _ := m.Context().Value(preparedKey{}).(*prepared)
	if p == nil {
		var err error
		if p, err = t.start(ctx, m); err != nil { // no prepare phase ran (a test calling handle alone)
			return err
		}
	}
	if p.skip {
		ev, err := idempotency.ParseDebezium(m.Value)
		switch {
		case errors.Is(err, idempotency.ErrNotAChange) && len(bytes.TrimSpace(m.Value)) == 0:
			t.tombstones.Add(1) // Debezium's tombstone after a delete: nothing to run
		case errors.Is(err, idempotency.ErrNotAChange):
			t.notChanges.Add(1)
		case err == nil && !t.ops[ev.Op]:
			t.opsSkipped.Add(1)
		}
		return nil
	}
	first, err := idempotency.Store{Schema: t.schema, Retention: t.retention}.ClaimTx(ctx, tx, t.scope, p.key)
	if err != nil {
		return err
	}
	if !first {
		t.repeated.Add(1)
		t.log.Info("event seen before at another offset; skipped",
			zap.String("topic", m.Topic), zap.Int32("partition", m.Partition), zap.Int64("offset", m.Offset))
		return nil
	}
	if p.handed != nil {
		// The ledger row, in the transaction that advances the watermark past m.
		e := *p.handed
		e.Group, e.Topic, e.Partition, e.Offset = t.group, m.Topic, m.Partition, m.Offset
		if _, err := airflow.RecordTx(ctx, tx, t.schema, e); err != nil {
			return err
		}
	}
	if p.created {
		t.created.Add(1)
	} else {
		t.existing.Add(1)
	}
	return nil
}

func conf(ev *idempotency.DebeziumEvent, recordKey []byte, fullBefore bool) (json.RawMessage, error) {
	switch ev.Op {
	case "t":
		var schema, table string
		_ = json.Unmarshal(ev.Source["schema"], &schema)
		_ = json.Unmarshal(ev.Source["table"], &table)
		return json.Marshal(map[string]any{"op": "t", "table": schema + "." + table})
	case "m":
		return json.Marshal(map[string]any{"op": "m", "message": ev.Message})
	}
	if a := bytes.TrimSpace(ev.After); len(a) > 0 && a[0] == '{' {
		row, _, err := idempotency.WithoutUnavailable(a)
		return row, err
	}
	before := bytes.TrimSpace(ev.Before)
	if len(before) == 0 || before[0] != '{' {
		return json.Marshal(map[string]any{"op": ev.Op, "before": nil})
	}
	row, _, err := idempotency.WithoutUnavailable(before)
	if err != nil {
		return nil, err
	}
	if !fullBefore {
		if row, _, err = idempotency.KeyColumns(row, recordKey); err != nil {
			return nil, err
		}
	}
	return json.Marshal(map[string]any{"op": ev.Op, "before": row})
}
