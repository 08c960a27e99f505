package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/internal/offsets"
	"github.com/kafkatx/kafkatx/internal/offsetstore"
	"github.com/kafkatx/kafkatx/internal/testenv"
	"github.com/kafkatx/kafkatx/shards"
)

// Issue 46: the console over a sharded service (Config.Shards). Partition 0 of a group's
// topic lives on s1 (also the directory's database), partition 1 on s2, and s1 still holds a
// stale copy of partition 1 (restored from an older backup). GET /api/partitions lists both
// partitions, each with its shard and its own shard's watermark, partition 1 naming s1's
// stale copy and needing attention (before, the console read the directory's database alone
// and showed partition 1 at s1's stale watermark); the offsets page has a shard column; an
// offset reset is refused (409); no answer holds a database password.
func TestConsoleOverShards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newSchemaFixture(t)
	f.dbURL = testenv.DatabaseURL(t)
	if u, err := url.Parse(f.dbURL); err == nil && u.User != nil {
		f.password, _ = u.User.Password()
	}
	u2 := testenv.Database(t)
	s2, err := pgxpool.New(ctx, u2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s2.Close)
	if err := kafkatx.Migrate(ctx, s2, f.schema); err != nil {
		t.Fatal(err)
	}
	f.group = testenv.Group(t)
	topic := testenv.Topic(t, f.brokers, 2)
	var msgs []kafka.Message
	for p := int32(0); p < 2; p++ {
		for range 5 {
			msgs = append(msgs, kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: p}, Value: []byte("v")})
		}
	}
	testenv.Produce(t, f.brokers, topic, msgs)
	k, err := offsets.NewKafka(kafka.ConfigMap{"bootstrap.servers": f.brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if err := k.Commit(ctx, f.group, map[offsetstore.TP]int64{{Topic: topic, Partition: 0}: 5, {Topic: topic, Partition: 1}: 5}); err != nil {
		t.Fatal(err)
	}
	mark := func(pool *pgxpool.Pool, p int32, next int64) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{f.schema, "watermarks"}.Sanitize()+` (group_id, topic, partition, next_offset, first_offset) VALUES ($1, $2, $3, $4, 0)`,
			f.group, topic, p, next); err != nil {
			t.Fatal(err)
		}
	}
	mark(f.pool, 0, 5)
	mark(s2, 1, 5)
	mark(f.pool, 1, 2) // the stale copy
	dir := shards.NewDirectory(f.pool, f.schema)
	for p, to := range map[int32]string{0: "s1", 1: "s2"} {
		if _, _, err := dir.Assign(ctx, f.group, topic, p, to); err != nil {
			t.Fatal(err)
		}
	}
	set := &shards.Set{Directory: f.pool, Shards: []shards.Shard{{Name: "s1", Pool: f.pool}, {Name: "s2", Pool: s2}}}
	srv := f.server(func(c *Config) { c.Shards = set })
	code, body := call(t, nil, "GET", srv.URL+"/api/partitions?group="+f.group, f.token, "")
	if code != http.StatusOK {
		t.Fatalf("GET /api/partitions: %d %s", code, body)
	}
	var rows []PartitionRow
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Fatal(err)
	}
	got := ""
	for _, r := range rows {
		got += fmt.Sprintf("%d:%s@%d stale=%v attention=%v; ", r.Partition, r.Shard, r.Watermark, r.StaleCopies, r.NeedsAttention)
	}
	if want := "0:s1@5 stale=[] attention=false; 1:s2@5 stale=[{s1 2}] attention=true; "; got != want {
		t.Fatalf("partitions over shards:\n got %s\nwant %s", got, want)
	}
	if !strings.Contains(body, `"shard":"s2"`) {
		t.Fatalf("the JSON has no shard field: %s", body)
	}
	code, page := call(t, nil, "GET", srv.URL+"/offsets?group="+f.group, f.token, "")
	if code != http.StatusOK || !strings.Contains(page, "<th>Shard</th>") || !strings.Contains(page, `data-f="shard">s2`) || !strings.Contains(page, "stale copy on shard s1 at 2") {
		t.Fatalf("offsets page: %d, no shard column or stale copy\n%s", code, page)
	}
	code, resp := call(t, nil, "POST", srv.URL+"/api/offsets/reset", f.token, fmt.Sprintf(`{"group":%q,"topic":%q,"to_database":true,"reason":"r"}`, f.group, topic))
	if code != http.StatusConflict || !strings.Contains(resp, "--shard") {
		t.Fatalf("reset on a sharded console: %d %s; want 409", code, resp)
	}
	if f.password != "" {
		for _, b := range []string{body, page, resp} {
			if strings.Contains(b, f.password) {
				t.Fatal("an answer holds the database password")
			}
		}
	}
}
