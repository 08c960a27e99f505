package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/migrations"
	"github.com/kafkatx/kafkatx/internal/tables"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// TestSourceIDs: records written for a Source get the ids derived from it and their position
// — the same in a second try of the same message (a fresh Source with the same fields), by
// every write path (INSERT with and without headers, COPY from 1,000 records), whether the
// Source is the record's or the ctx's — and records of another epoch, another offset or no
// Source get other ids; a record without a Source keeps a random one.
func TestSourceIDs(t *testing.T) {
	pool := testenv.Postgres(t)
	schema := testenv.Schema(t, pool)
	ctx := context.Background()
	if _, err := migrations.Apply(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	w := outbox.Writer{Schema: schema}
	src := func(scope string, off int64) *outbox.Source {
		return &outbox.Source{Scope: scope, Topic: "orders", Partition: 2, Offset: off}
	}
	write := func(ctx context.Context, recs []outbox.Record) []string {
		t.Helper()
		var out []string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			ids, err := w.WriteTx(ctx, tx, recs...)
			if err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT outbox_id::text FROM `+tables.For(schema).Outbox+` WHERE id = ANY($1) ORDER BY id`, ids)
			if err != nil {
				return err
			}
			out, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	rec := func(s *outbox.Source, hs ...outbox.Header) outbox.Record {
		return outbox.Record{Topic: "events", Value: []byte("v"), Headers: hs, Source: s}
	}
	// Two records of one message (offset 7) and one of another (offset 8), with headers.
	first := write(ctx, []outbox.Record{rec(src("g/0", 7), outbox.Header{Key: "h"}), rec(nil), rec(src("g/0", 8))})
	want0, want1 := outbox.SourceID(src("g/0", 7), 0).String(), outbox.SourceID(src("g/0", 8), 0).String()
	if first[0] != want0 || first[2] != want1 {
		t.Fatalf("ids %v; want %s and %s at 0 and 2", first, want0, want1)
	}
	if v := uuid.MustParse(first[1]).Version(); v != 4 {
		t.Fatalf("a record without a Source got a version-%d id %s, want a random (4) one", v, first[1])
	}
	// The same message tried again, its Source from the ctx, two records: positions 0 and 1.
	again := write(outbox.WithSource(ctx, src("g/0", 7)), []outbox.Record{rec(nil), rec(nil)})
	if again[0] != want0 || again[1] != outbox.SourceID(src("g/0", 7), 1).String() || again[1] == want0 {
		t.Fatalf("second try ids %v; want %s then position 1's", again, want0)
	}
	// Another epoch (an operator's replay): another id.
	if replay := write(ctx, []outbox.Record{rec(src("g/1", 7))}); replay[0] == want0 {
		t.Fatalf("a replay in a new epoch kept the id %s", want0)
	}
	// COPY (1,000 records, no headers): derived ids too.
	s := src("g/0", 9)
	recs := make([]outbox.Record, 1000)
	for i := range recs {
		recs[i] = outbox.Record{Topic: "events", Value: []byte("v"), Source: s}
	}
	copied := write(ctx, recs)
	for i, id := range copied {
		if id != outbox.SourceID(src("g/0", 9), uint32(i)).String() {
			t.Fatalf("COPY: record %d has id %s, want the derived one", i, id)
		}
	}
}

// TestSourceIDIsTheNameBasedUUID: SourceID is uuid.NewSHA1 of the documented name (scope,
// topic, partition, offset, position, NUL-separated) in kafkatx's namespace, so ids derived
// by one kafkatx version equal another's (a message re-processed after an upgrade publishes
// its events under the same ids) — also for a name longer than SourceID's stack buffer.
func TestSourceIDIsTheNameBasedUUID(t *testing.T) {
	ns := uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/kafkatx/kafkatx/outbox/source"))
	for _, s := range []*outbox.Source{
		{Scope: "orders-processor/0", Topic: "orders", Partition: 2, Offset: 7},
		{Scope: "g/3", Topic: "t", Partition: 0, Offset: 0},
		{Scope: strings.Repeat("g", 200) + "/1", Topic: strings.Repeat("t", 249), Partition: 2147483647, Offset: 9223372036854775807},
	} {
		for _, pos := range []uint32{0, 1, 4294967295} {
			name := fmt.Sprintf("%s\x00%s\x00%d\x00%d\x00%d", s.Scope, s.Topic, s.Partition, s.Offset, pos)
			if got, want := outbox.SourceID(s, pos), uuid.NewSHA1(ns, []byte(name)); got != want {
				t.Fatalf("SourceID(%q/%s/%d/%d, %d) = %s, want %s", s.Scope, s.Topic, s.Partition, s.Offset, pos, got, want)
			}
		}
	}
}
