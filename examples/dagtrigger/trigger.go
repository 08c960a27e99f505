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
	"go.uber.org/zap"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/idempotency"
	"github.com/kafkatx/kafkatx/idempotency/airflow"
)

// trigger starts one DAG run per change event.
type trigger struct {
	airflow   *airflow.Client
	dagID     string
	schema    string
	scope     string
	retention time.Duration
	log       *zap.Logger

	created, existing, repeated, tombstones atomic.Int64
}

// handle runs inside the consumer's transaction, which also advances the watermark:
//
//  1. claim the event's source position in that transaction: a copy of an event whose
//     transaction committed (re-published at another offset) is skipped here;
//  2. post the DAG run with the run id derived from the same key: if the process dies after
//     this call and before the commit, the event is delivered again, the claim is made
//     again (the first one rolled back), and the same run id is posted again: Airflow
//     answers 409, which counts as success. So each event yields exactly one run.
func (t *trigger) handle(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
	if len(bytes.TrimSpace(m.Value)) == 0 {
		t.tombstones.Add(1) // Debezium's tombstone after a delete: nothing to run
		return nil
	}
	ev, err := idempotency.ParseDebezium(m.Value)
	if err != nil {
		return kafkatx.Permanent(err)
	}
	key, err := ev.Position(m.Key)
	if err != nil {
		return kafkatx.Permanent(err)
	}
	first, err := idempotency.Store{Schema: t.schema, Retention: t.retention}.ClaimTx(ctx, tx, t.scope, key)
	if err != nil {
		return err
	}
	if !first {
		t.repeated.Add(1)
		t.log.Info("event seen before at another offset; skipped",
			zap.String("topic", m.Topic), zap.Int32("partition", m.Partition), zap.Int64("offset", m.Offset))
		return nil
	}
	res, err := t.airflow.TriggerDAGRun(ctx, airflow.Trigger{DAGID: t.dagID, Key: key, Conf: conf(ev)})
	if err != nil {
		if kafkatx.IsUnavailable(err) {
			// Refused credentials, a DAG not parsed yet, Airflow down: not this event's fault.
			// The transaction rolls back (the claim too) and the partition waits and retries.
			return err
		}
		var se *airflow.StatusError
		if errors.As(err, &se) && (se.StatusCode == http.StatusBadRequest || se.StatusCode == http.StatusUnprocessableEntity) {
			return kafkatx.Permanent(err) // Airflow refuses this run: retrying cannot help
		}
		return err // anything else: retried, then dead-lettered
	}
	if res.Created {
		t.created.Add(1)
	} else {
		t.existing.Add(1)
	}
	return nil
}

// conf is the run's conf: the event's after row; for a delete (no after row), the before
// row as {"op": "d", "before": {...}}.
func conf(ev *idempotency.DebeziumEvent) json.RawMessage {
	if a := bytes.TrimSpace(ev.After); len(a) > 0 && a[0] == '{' {
		return a
	}
	b, _ := json.Marshal(map[string]any{"op": ev.Op, "before": ev.Before})
	return b
}
