// Package outbox writes Kafka records into PostgreSQL in the caller's transaction, so a
// record is published if and only if that transaction commits (docs/design.md#invariant-7). The
// relay (package outbox/relay, or the `kafkatx relay` sidecar) publishes the rows.
//
// The package does not import Kafka: a service that only writes to the outbox builds with
// CGO_ENABLED=0. The table is a documented contract (docs/outbox-table.md), so services in
// other languages may insert rows with plain SQL instead.
//
// Order: records with the same (topic, key) are published in the order their transactions
// committed, and in write order inside one transaction. Records with a nil key have no
// order. Every published record carries the header HeaderOutboxID, a UUID unique to the row,
// which stays the same when a relay crash re-publishes the row; for a record written inside
// kafkatx's consumer loop it is derived from the input message (Source), so it also stays the
// same when the message is processed again after a database rollback.
package outbox

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kafkatx/kafkatx/internal/tables"
)

// HeaderOutboxID is the header the relay adds to every record: the row's outbox_id (a UUID
// in its 36-character text form). kafkatx consumers use it to drop a re-published copy.
const HeaderOutboxID = "kafkatx-outbox-id"

// Header is one Kafka record header. Values are bytes, kept byte for byte.
type Header struct {
	Key   string
	Value []byte
}

// Record is one record to publish.
type Record struct {
	// Topic to publish to. Required.
	Topic string
	// Key of the record; nil is stored as NULL and published as a nil key (not an empty one).
	// Keyed records are partitioned with murmur2, as Java producers do.
	Key []byte
	// Value of the record; nil is stored as NULL and published as a nil value (a tombstone).
	Value []byte
	// Headers, in order. A header named HeaderOutboxID is replaced by the relay's.
	Headers []Header
	// Partition, when not nil, publishes to that partition instead of the partitioner's
	// choice. It must be >= 0.
	Partition *int32
	// Source, when not nil, is the input message the record is written for (inside
	// kafkatx's loop: kafkatx.Message.OutboxSource); the record's outbox id is then derived
	// from it (see Source). Nil: the Source WriteTx's ctx carries, if any; else a random id.
	// A batch handler writing the records of several messages in one call names each one's.
	Source *Source
}

// Writer writes records into the outbox table of one schema.
type Writer struct {
	// Schema holds the outbox table. Defaults to "kafkatx".
	Schema string
	// Pack, in table mode, writes a WriteTx call's records into packed rows (at most
	// PackMaxRecords records and about PackMaxBytes each, usually one row) instead of one row
	// per record: a few rows to write, read and delete per batch instead of one per record
	// (docs/outbox-table.md#packed-rows). Publication, per-key order, parking, ids and counts
	// are the same. Default false: only relays of this version or later publish packed rows
	// (older ones leave them alone), so turn it on once every relay of the schema runs this
	// version (docs/upgrading.md). Ignored in WAL mode.
	Pack bool
}

// WriteTx writes records into kafkatx.outbox in the caller's transaction, which it never
// commits or rolls back, and returns the rows' ids (the outbox table's id column) in the
// records' order. It is Writer{}.WriteTx.
func WriteTx(ctx context.Context, tx pgx.Tx, records ...Record) ([]int64, error) {
	return Writer{}.WriteTx(ctx, tx, records...)
}

// WriteTx writes records into w.Schema's outbox in the caller's transaction, which it never
// commits or rolls back.
//
// A record with a Source (its own, else the one ctx carries: WithSource) gets the outbox id
// SourceID derives from it and the record's position among that Source's records, in both
// modes; others get a random one (table mode) or the commit position's (WAL mode).
//
// In table mode (the default; see Mode) it inserts rows and returns the rows' ids in the
// records' order. In WAL mode it emits transactional logical-decoding messages of up to about
// 256 KiB of records each (one round trip, no row) and returns WAL positions as int64 (record
// i of n in a message ending at LSN L gets L-(n-1)+i), ascending in the records' order:
// unique in the cluster, but not the published record's identity, which is the
// transaction's commit LSN and the record's position in it (docs/outbox-wal.md). WAL mode
// fails when the schema's replication slot is missing (nothing is emitted). The mode is read
// from the schema's outbox_settings at most every 2 s per database and schema.
//
// In table mode: All records
// go in one INSERT statement (one round trip) — or, from 1,000 records without headers or
// explicit partitions, in one COPY after one query for their ids and timestamps (two round
// trips; 6.0 instead of 9.5 µs per record at 5,000). It returns an error,
// and writes nothing, when a record has no topic or a negative partition; a database error
// leaves the transaction aborted, as any failed statement does.
func (w Writer) WriteTx(ctx context.Context, tx pgx.Tx, records ...Record) ([]int64, error) {
	if tx == nil {
		return nil, errors.New("outbox: nil transaction")
	}
	if len(records) == 0 {
		return nil, nil
	}
	for i, r := range records {
		if r.Topic == "" {
			return nil, fmt.Errorf("outbox: record %d has no topic", i)
		}
		if r.Partition != nil && *r.Partition < 0 {
			return nil, fmt.Errorf("outbox: record %d (topic %s) has negative partition %d", i, r.Topic, *r.Partition)
		}
	}
	mode, err := w.mode(ctx, tx)
	if err != nil {
		return nil, err
	}
	sids, sourced := sourceIDs(ctx, records)
	if mode == ModeWAL {
		if sourced {
			records = withSourceHeaders(records, sids)
		}
		return w.writeWAL(ctx, tx, records)
	}
	if w.Pack {
		return w.writePacks(ctx, tx, records, sids)
	}
	schema := w.schema()
	// The rows are inserted in the records' order, so the ids nextval assigns ascend with it.
	n := len(records)
	topics := make([]string, n)
	keys := make([][]byte, n)
	values := make([][]byte, n)
	partitions := make([]*int32, n)
	hFrom := make([]int32, n) // 1-based, inclusive slice bounds into the flat header arrays
	hTo := make([]int32, n)
	var hKeys, hValues [][]byte
	for i, r := range records {
		if r.Topic == "" {
			return nil, fmt.Errorf("outbox: record %d has no topic", i)
		}
		if r.Partition != nil && *r.Partition < 0 {
			return nil, fmt.Errorf("outbox: record %d (topic %s) has negative partition %d", i, r.Topic, *r.Partition)
		}
		topics[i], keys[i], values[i], partitions[i] = r.Topic, r.Key, r.Value, r.Partition
		hFrom[i] = int32(len(hKeys)) + 1
		for _, h := range r.Headers {
			v := h.Value
			if v == nil {
				v = []byte{}
			}
			hKeys, hValues = append(hKeys, []byte(h.Key)), append(hValues, v)
		}
		hTo[i] = int32(len(hKeys))
	}
	if hKeys == nil && !anyPartition(partitions) && n >= copyMinRecords {
		return w.copyRecords(ctx, tx, topics, keys, values, sids)
	}
	var rows pgx.Rows
	if hKeys == nil && !anyPartition(partitions) && !sourced {
		// No headers, no explicit partition: three arrays instead of eight, and no per-row
		// array slicing on the server.
		rows, err = tx.Query(ctx, `INSERT INTO `+tables.For(schema).Outbox+` (topic, key, value)
			SELECT r.topic, r.key, r.value
			  FROM unnest($1::text[], $2::bytea[], $3::bytea[]) WITH ORDINALITY AS r(topic, key, value, ord)
			 ORDER BY r.ord
			RETURNING id`, topics, keys, values)
	} else {
		if hKeys == nil {
			hKeys, hValues = [][]byte{}, [][]byte{}
		}
		oids := make([]pgtype.UUID, n) // NULL: gen_random_uuid()
		for i := range sids {
			oids[i] = pgtype.UUID{Bytes: sids[i], Valid: sids[i] != uuid.Nil}
		}
		rows, err = tx.Query(ctx, `INSERT INTO `+tables.For(schema).Outbox+` (outbox_id, topic, key, value, partition, header_keys, header_values)
			SELECT coalesce(r.oid, gen_random_uuid()), r.topic, r.key, r.value, r.part, ($5::bytea[])[r.hfrom:r.hto], ($6::bytea[])[r.hfrom:r.hto]
			  FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::integer[], $7::integer[], $8::integer[], $9::uuid[])
			       WITH ORDINALITY AS r(topic, key, value, part, hfrom, hto, oid, ord)
			 ORDER BY r.ord
			RETURNING id`, topics, keys, values, partitions, hKeys, hValues, hFrom, hTo, oids)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: insert %d records: %w", n, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("outbox: insert %d records: %w", n, err)
	}
	if len(ids) == 0 {
		// The schema switched to WAL mode since this process read it: the table's trigger
		// emitted the rows as messages and stored none. Fail the transaction (it is retried
		// in the new mode) rather than return ids that do not exist.
		forgetMode(tx, schema)
		return nil, fmt.Errorf("outbox: insert %d records: the outbox switched to WAL mode; retry the transaction", n)
	}
	if len(ids) != n {
		return nil, fmt.Errorf("outbox: insert %d records: got %d ids", n, len(ids))
	}
	slices.Sort(ids)
	return ids, nil
}

// anyPartition reports whether a record names an explicit partition.
func anyPartition(ps []*int32) bool {
	for _, p := range ps {
		if p != nil {
			return true
		}
	}
	return false
}

// copyMinRecords is the smallest Write that goes through COPY instead of INSERT. COPY costs a
// second round trip (ids and timestamps are taken first) and saves per row: measured on one
// connection (PostgreSQL 15, 2 cores), 17.3 against 14.6 µs per record at 64 records, even at
// 1,000 (9.6 each), 6.0 against 9.5 at 5,000 (the example's batch).
const copyMinRecords = 1000

// copyRecords writes records without headers or explicit partitions with COPY, which cannot
// return the ids it assigns: so it first takes the rows' ids from the table's sequence (and
// their created_at from the database clock) in one query, generates their outbox_id (random,
// version 4, as gen_random_uuid does) and copies the rows. The statement trigger runs for COPY
// as for INSERT, so commit order is kept the same way. created_at is read a few milliseconds
// before the rows are written.
func (w Writer) copyRecords(ctx context.Context, tx pgx.Tx, topics []string, keys, values [][]byte, sids []uuid.UUID) ([]int64, error) {
	n := len(topics)
	schema := w.schema()
	// The sequence is looked up once (MATERIALIZED), not once per row.
	rows, err := tx.Query(ctx, `WITH s AS MATERIALIZED (SELECT pg_get_serial_sequence($1, 'id')::regclass AS seq)
		SELECT nextval(s.seq), clock_timestamp() FROM s, generate_series(1, $2)`,
		tables.For(schema).Outbox, n)
	if err != nil {
		return nil, fmt.Errorf("outbox: insert %d records: take ids: %w", n, err)
	}
	ids := make([]int64, 0, n)
	created := make([]time.Time, 0, n)
	var id pgtype.Int8 // declared once, nullable without a pointer: Scan's targets escape
	var at time.Time
	for rows.Next() {
		if err := rows.Scan(&id, &at); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: insert %d records: take ids: %w", n, err)
		}
		if !id.Valid {
			rows.Close()
			return nil, fmt.Errorf("outbox: insert %d records: %s.id has no sequence (the table is not kafkatx's)", n, tables.For(schema).Outbox)
		}
		ids, created = append(ids, id.Int64), append(created, at)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: insert %d records: take ids: %w", n, err)
	}
	if len(ids) != n {
		return nil, fmt.Errorf("outbox: insert %d records: got %d ids", n, len(ids))
	}
	// Record i gets the i-th smallest id, so the ids ascend with the records' order whatever
	// order the query returned them in (nextval ascends within one session anyway).
	slices.Sort(ids)
	slices.SortFunc(created, func(a, b time.Time) int { return a.Compare(b) })
	random := bufio.NewReaderSize(rand.Reader, 16*n)
	uuids := make([]uuid.UUID, n)
	for i := range uuids {
		if sids != nil && sids[i] != uuid.Nil {
			uuids[i] = sids[i] // derived from the record's Source
			continue
		}
		if uuids[i], err = uuid.NewRandomFromReader(random); err != nil {
			return nil, fmt.Errorf("outbox: insert %d records: outbox_id: %w", n, err)
		}
	}
	_, err = tx.CopyFrom(ctx, tables.For(schema).OutboxIdentifier, []string{"id", "outbox_id", "topic", "key", "value", "created_at"},
		&copyRows{n: n, i: -1, ids: ids, uuids: uuids, topics: topics, keys: keys, values: values, created: created})
	if err != nil {
		return nil, fmt.Errorf("outbox: insert %d records: %w", n, err)
	}
	return ids, nil
}

// copyRows is copyRecords' pgx.CopyFromSource: one row slice reused for every row, holding
// pointers into the columns' slices typed as pgtype's valuers, which pgx encodes without
// copying the value into an interface (a fresh []any of boxed values, or plain pointers that
// pgx dereferences by reflection, cost an allocation per value: six per record). pgx encodes
// each row before it asks for the next. The bytes on the wire are those of the plain values.
type copyRows struct {
	n, i    int
	row     [6]any
	ids     []int64
	uuids   []uuid.UUID
	topics  []string
	keys    [][]byte
	values  [][]byte
	created []time.Time
}

func (c *copyRows) Next() bool { c.i++; return c.i < c.n }

func (c *copyRows) Values() ([]any, error) {
	i := c.i
	c.row = [6]any{(*int8Value)(&c.ids[i]), (*uuidValue)(&c.uuids[i]), (*textValue)(&c.topics[i]),
		(*bytesValue)(&c.keys[i]), (*bytesValue)(&c.values[i]), (*timeValue)(&c.created[i])}
	return c.row[:], nil
}

func (c *copyRows) Err() error { return nil }

// The valuers copyRows hands pgx, by pointer: a nil bytesValue is NULL, as a nil []byte.
type (
	int8Value  int64
	uuidValue  [16]byte
	textValue  string
	bytesValue []byte
	timeValue  time.Time
)

func (v *int8Value) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*v), Valid: true}, nil
}
func (v *uuidValue) UUIDValue() (pgtype.UUID, error) { return pgtype.UUID{Bytes: *v, Valid: true}, nil }
func (v *textValue) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*v), Valid: true}, nil
}
func (v *bytesValue) BytesValue() ([]byte, error) { return *v, nil }
func (v *timeValue) TimestamptzValue() (pgtype.Timestamptz, error) {
	return pgtype.Timestamptz{Time: time.Time(*v), Valid: true}, nil
}
