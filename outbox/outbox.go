// Package outbox writes Kafka records into PostgreSQL in the caller's transaction, so a
// record is published if and only if that transaction commits (DESIGN.md, invariant 7). The
// relay (package outbox/relay, or the `kafkatx relay` sidecar) publishes the rows.
//
// The package does not import Kafka: a service that only writes to the outbox builds with
// CGO_ENABLED=0. The table is a documented contract (docs/outbox-table.md), so services in
// other languages may insert rows with plain SQL instead.
//
// Order: records with the same (topic, key) are published in the order their transactions
// committed, and in write order inside one transaction. Records with a nil key have no
// order. Every published record carries the header HeaderOutboxID, a UUID unique to the row,
// which stays the same when a relay crash re-publishes the row.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/tables"
)

// DefaultSchema is the schema Write uses.
const DefaultSchema = "kafkatx"

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
}

// Writer writes records into the outbox table of one schema.
type Writer struct {
	// Schema holds the outbox table. Defaults to "kafkatx".
	Schema string
}

// Write writes records into kafkatx.outbox in the caller's transaction, which it never
// commits or rolls back, and returns the rows' ids (the outbox table's id column) in the
// records' order. It is Writer{}.Write.
func Write(ctx context.Context, tx pgx.Tx, records ...Record) ([]int64, error) {
	return Writer{}.Write(ctx, tx, records...)
}

// Write writes records into w.Schema's outbox table in the caller's transaction, which it
// never commits or rolls back, and returns the rows' ids in the records' order. All records
// go in one INSERT statement, one round trip whatever their number. It returns an error,
// and writes nothing, when a record has no topic or a negative partition; a database error
// leaves the transaction aborted, as any failed statement does.
func (w Writer) Write(ctx context.Context, tx pgx.Tx, records ...Record) ([]int64, error) {
	if tx == nil {
		return nil, errors.New("outbox: nil transaction")
	}
	if len(records) == 0 {
		return nil, nil
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
	var rows pgx.Rows
	var err error
	if hKeys == nil && !anyPartition(partitions) {
		// The common case: no headers, no explicit partition. Three arrays instead of eight,
		// and no per-row array slicing on the server.
		rows, err = tx.Query(ctx, `INSERT INTO `+tables.For(schema).Outbox+` (topic, key, value)
			SELECT r.topic, r.key, r.value
			  FROM unnest($1::text[], $2::bytea[], $3::bytea[]) WITH ORDINALITY AS r(topic, key, value, ord)
			 ORDER BY r.ord
			RETURNING id`, topics, keys, values)
	} else {
		if hKeys == nil {
			hKeys, hValues = [][]byte{}, [][]byte{}
		}
		rows, err = tx.Query(ctx, `INSERT INTO `+tables.For(schema).Outbox+` (topic, key, value, partition, header_keys, header_values)
			SELECT r.topic, r.key, r.value, r.part, ($5::bytea[])[r.hfrom:r.hto], ($6::bytea[])[r.hfrom:r.hto]
			  FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::integer[], $7::integer[], $8::integer[])
			       WITH ORDINALITY AS r(topic, key, value, part, hfrom, hto, ord)
			 ORDER BY r.ord
			RETURNING id`, topics, keys, values, partitions, hKeys, hValues, hFrom, hTo)
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: insert %d records: %w", n, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("outbox: insert %d records: %w", n, err)
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
