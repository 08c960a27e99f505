package main

import (
	"context"
	"fmt"
	"github.com/kafkatx/kafkatx/pg"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkatx/kafkatx"
	"github.com/kafkatx/kafkatx/examples/orders/order"
	"github.com/kafkatx/kafkatx/outbox"
)

// ceilingSQL is 05-throughput's pgbench script: the same per-order writes generated on the
// server (no client data), into plain tables (the outbox without kafkatx's commit trigger).
// :r makes the order ids of each transaction unique.
const ceilingSQLTables = `
CREATE TABLE IF NOT EXISTS ceil_orders(order_id text primary key, customer text, item text, quantity int, total_cents bigint);
CREATE TABLE IF NOT EXISTS ceil_customers(customer text primary key, orders bigint, total_cents bigint);
CREATE TABLE IF NOT EXISTS ceil_outbox(id bigserial primary key, topic text, key bytea, value bytea, created_at timestamptz default now());`

var ceilingSQLStatements = []string{
	`INSERT INTO ceil_orders SELECT 'o-' || $1::bigint || '-' || g, 'c-' || (g % 10), 'widget', 1 + g % 5, 999 * (1 + g % 5) FROM generate_series(1, $2::int) g ON CONFLICT DO NOTHING`,
	`INSERT INTO ceil_customers SELECT 'c-' || (g % 10), count(*), sum(999 * (1 + g % 5)) FROM generate_series(1, $1::int) g GROUP BY 1 ORDER BY 1
	   ON CONFLICT (customer) DO UPDATE SET orders = ceil_customers.orders + excluded.orders, total_cents = ceil_customers.total_cents + excluded.total_cents`,
	`INSERT INTO ceil_outbox(topic, key, value) SELECT 'order-events', convert_to('o-' || $1::bigint || '-' || g, 'UTF8'), convert_to('{"order_id":"o-' || $1::bigint || '-' || g || '","total_cents":999}', 'UTF8') FROM generate_series(1, $2::int) g`,
}

// runCeiling measures PostgreSQL alone doing the order service's writes, s.Conns
// connections committing batches as fast as they can for s.Seconds each:
//   - "handler N": examples/orders' handleBatch over N synthetic orders per transaction,
//     kafkatx's outbox table (with its commit trigger) included — the very writes of the
//     kafkatx phases, minus kafkatx's own (watermark, in-flight mark);
//   - "handler-plain N": the same, with the events in a plain (topic, key, value) table instead
//     of kafkatx's outbox, which prices that table (its defaults, indexes and triggers);
//   - "sql N": 05-throughput's pgbench script with N orders per transaction.
func runCeiling(ctx context.Context, s spec) error {
	var cells []cell
	for _, v := range []struct {
		kind  string
		batch int
	}{{"handler", 100}, {"handler", 1000}, {"handler", order.DefaultBatchSize}, {"handler-plain", 100}, {"sql", 100}, {"sql", 1000}} {
		c, err := ceilingVariant(ctx, s, v.kind, v.batch)
		if err != nil {
			return fmt.Errorf("ceiling %s %d: %w", v.kind, v.batch, err)
		}
		cells = append(cells, c)
	}
	emit(event{Event: "result", Variants: cells})
	return nil
}

func ceilingVariant(ctx context.Context, s spec, kind string, batch int) (cell, error) {
	vs := s
	vs.Name = fmt.Sprintf("%s/%s-%d", s.Name, kind, batch)
	schema := fmt.Sprintf("%s_%s%d", s.Schema, strings.ReplaceAll(kind, "-", "_"), batch)
	conns := max(1, s.Conns)
	pool, err := openPool(ctx, vs, schema, nil, int32(conns+1))
	if err != nil {
		return cell{}, err
	}
	defer pool.Close()
	var step func(ctx context.Context, tx pgx.Tx, worker, n int) error
	switch kind {
	case "handler", "handler-plain":
		if err := prepareOrders(ctx, pool, schema); err != nil {
			return cell{}, err
		}
		svc := &order.Service{EventsTopic: s.EventsTopic, WriteEvents: outbox.Writer{Schema: schema}.WriteTx}
		if kind == "handler-plain" {
			if _, err := pool.Exec(ctx, ceilingSQLTables); err != nil {
				return cell{}, err
			}
			svc.WriteEvents = plainEvents("ceil_outbox")
		}
		run := strconv.FormatInt(time.Now().UnixNano(), 36)
		step = func(ctx context.Context, tx pgx.Tx, worker, n int) error {
			msgs := make([]*kafkatx.Message, batch)
			for i := range msgs {
				k, v := orderValue(run+"-"+strconv.Itoa(worker), n*batch+i)
				msgs[i] = &kafkatx.Message{Topic: s.Topic, Offset: int64(n*batch + i), Key: k, Value: v}
			}
			return svc.HandleBatch(ctx, tx, msgs)
		}
	case "sql":
		if _, err := pool.Exec(ctx, ceilingSQLTables); err != nil {
			return cell{}, err
		}
		base := time.Now().UnixNano()
		step = func(ctx context.Context, tx pgx.Tx, worker, n int) error {
			r := base + int64(worker)<<40 + int64(n)
			for i, q := range ceilingSQLStatements {
				args := []any{r, batch}
				if i == 1 {
					args = []any{batch} // the customers' statement takes only the batch size
				}
				if _, err := tx.Exec(ctx, q, args...); err != nil {
					return err
				}
			}
			return nil
		}
	}
	// Warm the connections so that connecting is not timed.
	var warm []*pgxpool.Conn
	for range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return cell{}, err
		}
		warm = append(warm, c)
	}
	for _, c := range warm {
		c.Release()
	}

	cpu0 := selfCPU()
	pg0, _ := backendCPU(ctx, pool, vs.app())
	var rows atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	deadline := time.Now().Add(time.Duration(s.Seconds * float64(time.Second)))
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for w := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for n := 0; time.Now().Before(deadline); n++ {
				t0 := time.Now()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return step(ctx, tx, w, n) })
				if err != nil {
					if retryable(err) {
						continue
					}
					errs <- err
					return
				}
				mine = append(mine, time.Since(t0))
				rows.Add(int64(batch))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := time.Since(start)
	select {
	case err := <-errs:
		return cell{}, err
	default:
	}
	pg1, ok := backendCPU(ctx, pool, vs.app())
	sortDurations(lat)
	c := cell{Name: fmt.Sprintf("%s %d", kind, batch), Rows: rows.Load(), Seconds: took.Seconds(),
		Rate: float64(rows.Load()) / took.Seconds(), P50: quantile(lat, 0.5), P99: quantile(lat, 0.99),
		ProcCPU: (selfCPU() - cpu0).Seconds()}
	if ok {
		c.PGCPU = (pg1 - pg0).Seconds()
	}
	return c, nil
}

// retryable reports a lost race (pg.LostRace: a deadlock, a serialization failure, ...),
// which the ceiling simply runs again.
func retryable(err error) bool { return pg.LostRace(err) }

func sortDurations(d []time.Duration) { slices.Sort(d) }
