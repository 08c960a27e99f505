package relay

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx/outbox"
)

// BenchmarkOutboxRowsVsPacks measures the outbox's own statements per event, today's rows (one
// row a record) against packed rows (outbox.Writer.Pack), alternating batch by batch in one run
// so that the machine's load weighs on both alike: each iteration writes a batch of 1,000
// keyed records (1,000 keys, a 60-byte value, as the example's order events) in one
// transaction and commits it, reads it as the relay's round does (fetch) and deletes it as
// the relay's mark does after every delivery report came back (mark). No broker: the
// statements only. Figures, in µs per event: wall time of each step (write includes the
// commit), the CPU of the PostgreSQL backend that ran them (/proc/<pid>/stat: one connection,
// so one backend; the WAL writer and checkpointer are not counted) and of this process.
// The outbox is vacuumed every 10 iterations, untimed (KAFKATX_BENCH_VACUUM_EVERY).
//
//	go test -run '^$' -bench BenchmarkOutboxRowsVsPacks -benchtime 100x ./outbox/relay
//
// The figures in docs/benchmarks.md come from it.
func BenchmarkOutboxRowsVsPacks(b *testing.B) {
	tb := setup(b)
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns, pcfg.MinConns = 1, 1
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	var pid int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	cfg := tb.config(b)
	cfg.KeepPublished = 0
	r, err := New(pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	const batch = 1000
	vacuumEvery := 10 // iterations (20,000 events); KAFKATX_BENCH_VACUUM_EVERY=0: never
	if v := os.Getenv("KAFKATX_BENCH_VACUUM_EVERY"); v != "" {
		if vacuumEvery, err = strconv.Atoi(v); err != nil {
			b.Fatalf("KAFKATX_BENCH_VACUUM_EVERY=%q", v)
		}
	}
	type acc struct{ write, read, del, pg, self time.Duration }
	var res [2]acc // 0: rows, 1: packed
	n := 0
	step := func(i int, packed bool) {
		w := outbox.Writer{Schema: tb.schema, Pack: packed}
		recs := make([]outbox.Record, batch)
		for j := range recs {
			k := (i*batch + j) % 100000
			recs[j] = outbox.Record{Topic: "bench-events", Key: []byte(fmt.Sprintf("order-%d", k)),
				Value: []byte(fmt.Sprintf(`{"order":"order-%d","status":"paid","total_cents":%08d}`, k, k))}
		}
		a := &res[0]
		if packed {
			a = &res[1]
		}
		pg0, self0 := procCPU(b, pid), selfCPU()
		t := time.Now()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.WriteTx(ctx, tx, recs...)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		a.write += time.Since(t)
		t = time.Now()
		rows, err := r.fetch(ctx, []string{}, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		a.read += time.Since(t)
		if len(rows) != batch {
			b.Fatalf("read %d records, want %d", len(rows), batch)
		}
		results := make([]result, len(rows))
		for j := range results {
			results[j].outcome = outcomeDelivered
		}
		t = time.Now()
		if err := r.mark(ctx, rows, results); err != nil {
			b.Fatal(err)
		}
		a.del += time.Since(t)
		a.pg += procCPU(b, pid) - pg0
		a.self += selfCPU() - self0
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		step(2*i, i%2 == 1)
		step(2*i+1, i%2 == 0)
		n += batch
		if vacuumEvery > 0 && i%vacuumEvery == vacuumEvery-1 {
			// Untimed, as autovacuum runs beside a relay: without it the dead index entries
			// of the deleted rows pile up and the outbox_commits delete's anti-join reads them
			// all, a cost that grows with the run (both modes alike).
			if _, err := pool.Exec(ctx, `VACUUM `+tb.t.Outbox); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tb.t.Outbox).Scan(&left); err != nil || left != 0 {
		b.Fatalf("%d outbox rows left, %v", left, err)
	}
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	for i, name := range []string{"rows", "packed"} {
		a := res[i]
		b.ReportMetric(us(a.write), name+"-write-µs/event")
		b.ReportMetric(us(a.read), name+"-read-µs/event")
		b.ReportMetric(us(a.del), name+"-delete-µs/event")
		b.ReportMetric(us(a.write+a.read+a.del), name+"-wall-µs/event")
		b.ReportMetric(us(a.pg), name+"-pg-cpu-µs/event")
		b.ReportMetric(us(a.self), name+"-go-cpu-µs/event")
	}
}

// procCPU is the CPU time (user + system) process pid has used, from /proc.
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("the PostgreSQL backend's CPU (the database must run on this machine): %v", err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 on
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// selfCPU is this process's CPU time (user + system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
