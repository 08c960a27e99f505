package dlq

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/kafkaname"
	"github.com/kafkatx/kafkatx/internal/msgfmt"
	"github.com/kafkatx/kafkatx/outbox"
	"github.com/kafkatx/kafkatx/pg"
)

// Replay says where and why a dead letter is re-published.
type Replay struct {
	// ToTopic is the topic to publish to. Defaults to the dead letter's original topic, so
	// its consumer group runs the handler again.
	ToTopic string
	// Reason and Actor go to the dlq_audit table.
	Reason string
	Actor  string
	// Again allows replaying a dead letter that was already replayed.
	Again bool
}

// ReplayTx re-publishes dead letter id of schema ("" means pg.DefaultSchema) through the
// outbox in the caller's transaction, which it joins and never commits: one outbox row with
// the original key (nil stays nil), value and headers byte for byte (an original
// kafkatx-outbox-id header is dropped: the relay gives the row a new one, so kafkatx consumers
// do not take it for a duplicate), the dead letter marked StatusReplayed, and a dlq_audit row
// naming the outbox row. It returns the outbox row's id and the dead letter as it was before.
// Errors wrap ErrNotFound or ErrResolved when the dead letter is missing or not new. An
// r.ToTopic that is not a topic name Kafka accepts (1 to 249 characters of [a-zA-Z0-9._-],
// not "." or "..") is refused before anything is written. A dead letter's own topic is not
// checked: a row naming a topic Kafka refuses is parked by the relay, where kafkatx outbox
// parked shows it.
func ReplayTx(ctx context.Context, tx pgx.Tx, schema string, id int64, r Replay) (int64, *DeadLetter, error) {
	if err := r.checkToTopic(); err != nil {
		return 0, nil, err
	}
	schema = pg.SchemaOr(schema)
	d, err := Get(ctx, tx, schema, id)
	if err != nil {
		return 0, nil, err
	}
	rec := replayRecord(d, r.ToTopic)
	ids, err := outbox.Writer{Schema: schema}.WriteTx(ctx, tx, rec)
	if err != nil {
		return 0, nil, fmt.Errorf("replay dead letter %d: %w", id, err)
	}
	// The caller rolls back on an error here (not found, already resolved): the row goes too.
	a := Action{Reason: r.Reason, Actor: r.Actor, ToTopic: rec.Topic, OutboxRow: ids[0], Again: r.Again}
	if err := MarkReplayedTx(ctx, tx, schema, id, a); err != nil {
		return 0, nil, err
	}
	return ids[0], d, nil
}

// checkToTopic refuses a ToTopic Kafka would refuse (kafkaname.Topic): replayed there, the
// record could only be parked.
func (r Replay) checkToTopic() error {
	if r.ToTopic == "" {
		return nil
	}
	if err := kafkaname.Topic(r.ToTopic); err != nil {
		return fmt.Errorf("dlq: replay to topic %s: %w", msgfmt.Quote(truncate(r.ToTopic)), err)
	}
	return nil
}

// truncate shortens s to its first 64 bytes and "..." for a message (a topic refused for its
// length may be long).
func truncate(s string) string {
	if len(s) <= 64 {
		return s
	}
	return strings.ToValidUTF8(s[:64], "") + "..."
}

// replayRecord is the outbox record that replays d: to toTopic ("" for d's own topic), its
// key, value and headers byte for byte, without an original kafkatx-outbox-id header.
func replayRecord(d *DeadLetter, toTopic string) outbox.Record {
	rec := outbox.Record{Topic: d.Topic, Key: d.Key, Value: d.Value}
	if toTopic != "" {
		rec.Topic = toTopic
	}
	for _, h := range d.Headers {
		if h.Key != outbox.HeaderOutboxID {
			rec.Headers = append(rec.Headers, outbox.Header{Key: h.Key, Value: h.Value})
		}
	}
	return rec
}
