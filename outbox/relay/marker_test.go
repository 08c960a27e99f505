package relay

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/outbox"
)

// With rounds smaller than the transactions and writers committing out of id order, full
// rounds read after the previous round's last row while its mark runs (marker): nothing is
// skipped, nothing published twice, and each key's records arrive in commit order.
func TestPipelinedRoundsSkipNothingAndKeepPerKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 3)
	cfg := b.config(t)
	cfg.BatchSize = 7 // most rounds are full: the read-after path runs
	r, _ := b.start(t, cfg)
	ctx := context.Background()

	const writers, txs, perTx = 6, 30, 5
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < txs; i++ {
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					recs := make([]outbox.Record, perTx)
					for j := range recs {
						// Key k<w> gets values i*perTx+j: increasing in commit order.
						recs[j] = outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", w)), Value: []byte(strconv.Itoa(i*perTx + j))}
					}
					_, err := b.w.WriteTx(ctx, tx, recs...)
					time.Sleep(time.Duration((w*7+i*13)%15) * time.Millisecond) // commit later than the ids say
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := int64(writers * txs * perTx)
	waitFor(t, 60*time.Second, "every row published", func() bool { return r.Stats().Published >= total })
	msgs := readAll(t, b.brokers, topic)
	if int64(len(msgs)) != total {
		t.Fatalf("%d records on the topic, want %d (each row once)", len(msgs), total)
	}
	last := map[string]int{}
	seen := map[string]bool{}
	for _, m := range msgs {
		id, _ := header(m, outbox.HeaderOutboxID)
		if seen[id] {
			t.Fatalf("outbox id %s published twice", id)
		}
		seen[id] = true
		v, _ := strconv.Atoi(string(m.Value))
		k := string(m.Key)
		if prev, ok := last[k]; ok && v <= prev {
			t.Fatalf("key %s: value %d after %d: per-key commit order broken", k, v, prev)
		}
		last[k] = v
	}
	for id, st := range b.states(t) {
		if st != "published" {
			t.Errorf("row %d is %s, want published", id, st)
		}
	}
}

// A mark that fails through its retries (here: a trigger refuses every update of the outbox
// for a while) leaves published rows pending in the table. The leader carries them into the
// next mark instead of publishing them again (it stops publishing once they hold the head of
// the outbox): every row reaches the topic once and ends marked once the database takes
// writes again.
func TestFailedMarkIsCarriedNotRepublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testenv.Topic(t, b.brokers, 3)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := b.pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	fn := pgx.Identifier{b.schema, "refuse_marks"}.Sanitize()
	exec(`CREATE TABLE ` + pgx.Identifier{b.schema, "refuse"}.Sanitize() + ` (on_ boolean)`)
	exec(`INSERT INTO ` + pgx.Identifier{b.schema, "refuse"}.Sanitize() + ` VALUES (true)`)
	exec(`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT on_ FROM ` + pgx.Identifier{b.schema, "refuse"}.Sanitize() + `) THEN
				RAISE EXCEPTION 'marks refused by the test';
			END IF;
			RETURN NULL;
		END $$`)
	exec(`CREATE TRIGGER refuse_marks BEFORE UPDATE OR DELETE ON ` + b.t.Outbox + ` FOR EACH STATEMENT EXECUTE FUNCTION ` + fn + `()`)

	const n = 40
	recs := make([]outbox.Record, n)
	for i := range recs {
		recs[i] = outbox.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i%4)), Value: []byte(strconv.Itoa(i))}
	}
	b.write(t, recs[:n/2]...)
	b.write(t, recs[n/2:]...)
	cfg := b.config(t)
	cfg.BatchSize = 8
	r, stop := b.start(t, cfg)

	// Rounds publish until failed marks hold the head of the outbox, then stall: more reads,
	// failed marks tried again, nothing published twice.
	waitFor(t, 30*time.Second, "a round published", func() bool { return topicCount(t, b.brokers, topic) >= int64(cfg.BatchSize) })
	time.Sleep(5 * time.Second)
	if st := r.Stats(); st.Published != 0 {
		t.Fatalf("Stats().Published = %d while every mark fails, want 0", st.Published)
	}
	exec(`UPDATE ` + pgx.Identifier{b.schema, "refuse"}.Sanitize() + ` SET on_ = false`)
	waitFor(t, 30*time.Second, "every row marked", func() bool { return r.Stats().Published >= n })
	stop()

	msgs := readAll(t, b.brokers, topic)
	counts := map[string]int{}
	for _, m := range msgs {
		id, _ := header(m, outbox.HeaderOutboxID)
		counts[id]++
	}
	var twice []string
	for id, c := range counts {
		if c > 1 {
			twice = append(twice, id)
		}
	}
	if len(msgs) != n || len(twice) > 0 {
		t.Fatalf("%d records for %d rows; published more than once: %s", len(msgs), n, strings.Join(twice, ", "))
	}
	for id, st := range b.states(t) {
		if st != "published" {
			t.Errorf("row %d is %s, want published", id, st)
		}
	}
}
