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
func (t *trigger) handle(ctx context.Context, tx pgx.Tx, m *kafkatx.Message) error {
	ev, err := idempotency.ParseDebezium(m.Value)
	if errors.Is(err, idempotency.ErrNotAChange) {
		if len(bytes.TrimSpace(m.Value)) == 0 {
			t.tombstones.Add(1) // Debezium's tombstone after a delete: nothing to run
		} else {
			t.notChanges.Add(1)
		}
		return nil
	}
	if err != nil {
		return kafkatx.Permanent(err)
	}
	if !t.ops[ev.Op] {
		t.opsSkipped.Add(1)
		return nil
	}
	key, err := ev.Key(m.Key)
	if err != nil {
		return kafkatx.Permanent(err)
	}
	c, err := conf(ev, m.Key, t.fullBefore)
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
	res, err := t.airflow.TriggerDAGRun(ctx, airflow.Trigger{DAGID: t.dagID, Key: key, Conf: c})
	if err != nil {
		if kafkatx.IsUnavailable(err) {
			// Refused credentials, a DAG not parsed yet, Airflow down: not this event's fault.
			// The transaction rolls back (the claim too) and the partition waits and retries.
			return err
		}
		if airflow.IsConfTooLarge(err) {
			// Over --airflow-max-conf-bytes, or Airflow answered 413 or an opaque 5xx to a
			// large conf (apache/airflow#66779): the dead letter says the size and the limit.
			return kafkatx.Permanent(err)
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

// conf is the run's conf (docs/dag-triggered-services.md):
//
//   - create, update, snapshot read: the after row, without the columns Debezium could not
//     send (an unchanged TOASTed column arrives as idempotency.UnavailableValue): a column
//     missing from conf is unknown, not null;
//   - delete: {"op": "d", "before": {...}} with only the record key's columns of the before
//     image (under the default replica identity the others hold "", 0 or null, which are not
//     the row's values), or the whole before image (without placeholders) with fullBefore
//     or for a keyless table (which PostgreSQL can only delete from under REPLICA IDENTITY
//     FULL);
//   - truncate: {"op": "t", "table": "<schema>.<table>"};
//   - logical message: {"op": "m", "message": {"prefix": ..., "content": <base64>}}.
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
